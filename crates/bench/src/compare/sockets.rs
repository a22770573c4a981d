//! The ping-pong rows of 64 B over tcp or udp beside sockperf: polling
//! beside busy polling, waiting beside blocking, each with the floor under
//! it, and the waiting ones again on one processor.

use macrolink_fabric::{Completion, Mode, Transport};
use std::path::Path;

use super::alternate::{alternated, Lat, ALTERNATIONS};
use super::beside_sockperf::{floor_row, resident_row, sockperf_lat, sockperf_lat_of};
use super::placement::{self, alternated_steady};
use super::{
    groups, iterations_for, lat_n, opt, row, Goal, Options, Row, BLOCKING, BLOCKING_ONE,
    ONE_PROCESSOR, POLL, SLEEP_FLOOR, WAIT, WAIT_ONE,
};
use crate::floor::Sockets;
use crate::peers::sockperf;
use crate::pin::OneProcessor;
use crate::session::Session;
use crate::sleeps;

/// The rows of `t` (udp where `udp`, with messages of mode `m`), on a
/// session of their own: sockperf's processes hold the one socket they
/// measure, and so do our endpoints here, not the connections of the rows
/// before (a polling endpoint looks at each of them, a system call now
/// and then over tcp).
pub(super) fn rows(
    exe: &Path,
    a: &Options,
    t: Transport,
    m: Mode,
    udp: bool,
    has_sockperf: bool,
) -> anyhow::Result<Vec<Row>> {
    let (n, secs) = (a.iterations, a.seconds);
    let times = groups::pairs(a.pairs, ALTERNATIONS);
    let mut rows = Vec::new();
    let mut s = Session::open(exe, None)?;
    // Each run of ours lasts as long as the stretch a sockperf run
    // counts: of a run of its iterations before them (not counted),
    // as many as that takes.
    let span = sockperf::counted(secs * 2.0);
    let matched = |s: &mut Session, c| -> anyhow::Result<u64> {
        Ok(iterations_for(span, lat_n(s, t, m, c, 64, n)?.median, n))
    };
    for (c, regime, ours_regime, peer_regime) in [
        (
            Completion::Poll,
            sockperf::Regime::BusyPoll,
            POLL,
            "busy poll",
        ),
        (Completion::Wait, sockperf::Regime::Blocking, WAIT, BLOCKING),
    ] {
        let iters = matched(&mut s, c)?;
        let (ours, theirs, pairs, placed) = alternated_steady(
            times,
            || lat_n(&mut s, t, m, c, 64, iters),
            has_sockperf.then_some(|| sockperf_lat(udp, secs, regime, None)),
            placement::probe,
        )?;
        let proto = if udp { "udp" } else { "--tcp" };
        let r = row(
            &format!("{t} 64 B ping-pong, half rt, median of {times}"),
            "us",
            Some(ours.median),
            &format!("sockperf pp {proto} {}", regime.flags()),
            theirs.map(|l| l.median),
            Goal::AtMost(1.0),
        )
        .regimes(ours_regime, peer_regime)
        .p99(ours.p99, theirs.and_then(|l| l.p99))
        .pairs(pairs)
        .placement(placed);
        rows.push(if udp { r.note(SENDING_CONNECTED) } else { r });
        // Beside the polling row, the floor under it: the same
        // ping-pong with nothing but its system calls, beside
        // sockperf busy polling, in the same minute.
        if c == Completion::Poll {
            let bare = if udp { Sockets::Udp } else { Sockets::Tcp };
            rows.push(floor_row(t, bare, secs, iters, has_sockperf, times));
            // And over udp the floor under ours, which sends to its peer
            // on a connected socket, as sockperf cannot.
            if udp {
                let connected = Sockets::UdpSendingConnected;
                rows.push(floor_row(t, connected, secs, iters, has_sockperf, times));
            } else {
                // Over tcp, sockperf's largest message, which comes in
                // more than one piece.
                rows.push(large_row(&mut s, t, m, span, a, times, has_sockperf)?);
            }
        }
    }
    // What the threads a node keeps asleep beside the polling one
    // cost: sockperf busy-polling with one such thread in each of its
    // processes, beside sockperf as it comes, in the same minute.
    if has_sockperf {
        rows.push(resident_row(t, udp, secs, times));
    }
    // What sleeping in `poll` (or `epoll_wait`) costs over a blocking
    // `recv`, in the same minute: the floor under the waiting row's
    // ratio.
    let bare = |how, name: &str, regimes: (&'static str, &'static str)| {
        let once = |how| sleeps::ping_pong(udp, 64, n, how).map(Lat::from);
        let (slept, blocked, pairs) =
            alternated(times, || once(how), Some(|| opt(once(sleeps::Sleep::Recv))))?;
        anyhow::Ok(
            row(
                &format!("{t} 64 B ping-pong, {name}"),
                "us",
                Some(slept.median),
                "bare blocking recv (as sockperf's)",
                blocked.map(|l| l.median),
                Goal::Info,
            )
            .regimes(regimes.0, regimes.1)
            .p99(slept.p99, blocked.and_then(|l| l.p99))
            .pairs(pairs)
            .note(SLEEP_FLOOR),
        )
    };
    // Beside the waiting row, the bare sleep of the way a waiting
    // endpoint sleeps over this transport where it does not sleep in
    // the socket's recv (see `fabric`'s `sleep` and `recv_sleep`).
    rows.push(if udp {
        bare(sleeps::Sleep::Poll, "bare poll + recv", (WAIT, BLOCKING))?
    } else {
        bare(sleeps::Sleep::Epoll, "bare epoll + recv", (WAIT, BLOCKING))?
    });
    // The same waiting ping-pongs with both sides on one processor: no
    // wake-up crosses processors (on a virtual machine, an idle one's
    // wake-up is most of the rows above), so what is left is what a
    // message costs in system calls, switches and work.
    let pin = OneProcessor::pin()?;
    let mut one = Session::open(exe, None)?;
    let iters = matched(&mut one, Completion::Wait)?;
    let (ours, theirs, pairs) = alternated(
        times,
        || lat_n(&mut one, t, m, Completion::Wait, 64, iters),
        has_sockperf.then_some(|| sockperf_lat(udp, secs, sockperf::Regime::Blocking, None)),
    )?;
    let proto = if udp { "udp" } else { "--tcp" };
    rows.push(
        row(
            &format!("{t} 64 B ping-pong, half rt, one processor"),
            "us",
            Some(ours.median),
            &format!("sockperf pp {proto} {}", sockperf::Regime::Blocking.flags()),
            theirs.map(|l| l.median),
            Goal::Info,
        )
        .regimes(WAIT_ONE, BLOCKING_ONE)
        .p99(ours.p99, theirs.and_then(|l| l.p99))
        .pairs(pairs)
        .note(ONE_PROCESSOR),
    );
    for (how, name) in [
        (sleeps::Sleep::Poll, "bare poll, one processor"),
        (sleeps::Sleep::Epoll, "bare epoll, one processor"),
    ] {
        rows.push(bare(how, name, (WAIT_ONE, BLOCKING_ONE))?);
    }
    drop(one);
    drop(pin);
    Ok(rows)
}

/// The largest message sockperf sends (its payload's limit, a
/// datagram's, over tcp too).
const LARGE: usize = 65_507;

/// Ours polling beside sockperf busy polling over tcp with messages of
/// [`LARGE`] bytes, each run of ours as long as the stretch a sockperf run
/// counts, `times` pairs alternated.
fn large_row(
    s: &mut Session,
    t: Transport,
    m: Mode,
    span: std::time::Duration,
    a: &Options,
    times: usize,
    has_sockperf: bool,
) -> anyhow::Result<Row> {
    let c = Completion::Poll;
    let n = a.iterations;
    let iters = iterations_for(span, lat_n(s, t, m, c, LARGE, n)?.median, n);
    let regime = sockperf::Regime::BusyPoll;
    let (ours, theirs, pairs, placed) = alternated_steady(
        times,
        || lat_n(s, t, m, c, LARGE, iters),
        has_sockperf.then_some(|| sockperf_lat_of(false, LARGE, a.seconds, regime, None)),
        placement::probe,
    )?;
    Ok(row(
        &format!("{t} {LARGE} B ping-pong, half rt, median of {times}"),
        "us",
        Some(ours.median),
        &format!("sockperf pp --tcp {} -m {LARGE}", regime.flags()),
        theirs.map(|l| l.median),
        Goal::Info,
    )
    .regimes(POLL, "busy poll")
    .p99(ours.p99, theirs.and_then(|l| l.p99))
    .pairs(pairs)
    .placement(placed)
    .note(LARGE_NOTE))
}

/// What the row of sockperf's largest message shows.
const LARGE_NOTE: &str = "sockperf's largest message (65,507 bytes; ours carries a frame \
header of 56 more), polling beside busy polling as in the 64 B row, one stream, one thread a \
side. Over loopback a segment holds at most 65,483 bytes, so each message of either side \
comes in two pieces or more, and a reader that has the first part looks for the rest: the \
row times that path, which a 64 B message never takes.";

/// How our udp rows send, beside sockperf.
const SENDING_CONNECTED: &str = "our endpoint takes every datagram on its one socket, not \
connected, as sockperf's sides do, and sends to a peer that answered from a second socket, \
connected to where that peer takes datagrams (transport::udp's near sockets), where sockperf \
sends with sendto on its one socket, not connected, and has no option to do otherwise. The \
kernel keeps a connected socket's route and looks one up for every datagram sendto sends. \
Sizes, streams, threads and regimes are the same on both sides. The two bare busy-polling \
rows below the polling row are the floors under each: sockperf's sending as it does, ours \
sending connected.";
