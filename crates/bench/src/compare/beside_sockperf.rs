//! The ping-pong rows of 64 B over tcp and udp beside sockperf that tell
//! rather than judge: sockperf with a thread asleep in each of its
//! processes, and the floor of the system calls alone ([`floor`]).

use macrolink_fabric::Transport;

use super::alternate::{Lat, Pairs};
use super::placement::{self, alternated_steady, Placement};
use super::{opt, row, Goal, Row};
use crate::floor;
use crate::peers::resident::Resident;
use crate::peers::sockperf;

/// A sockperf ping-pong of 64 B over udp or tcp for twice `secs` seconds,
/// both sides in `regime`, with a thread asleep in each of its processes
/// where `resident` is given; `None` where it gave no figure.
pub(super) fn sockperf_lat(
    udp: bool,
    secs: f64,
    regime: sockperf::Regime,
    resident: Option<&Resident>,
) -> Option<Lat> {
    sockperf_lat_of(udp, 64, secs, regime, resident)
}

/// As [`sockperf_lat`], of messages of `size` bytes.
pub(super) fn sockperf_lat_of(
    udp: bool,
    size: usize,
    secs: f64,
    regime: sockperf::Regime,
    resident: Option<&Resident>,
) -> Option<Lat> {
    opt(sockperf::ping_pong(udp, size, secs * 2.0, regime, resident)).map(Lat::from)
}

/// sockperf busy-polling over `t` (udp or tcp) with a thread asleep in
/// each of its processes, beside sockperf as it comes, `times` pairs
/// alternated. A run that gives no figure leaves the row without one
/// (`n.a.`), not the whole comparison.
pub(super) fn resident_row(t: Transport, udp: bool, secs: f64, times: usize) -> Row {
    let figures = Resident::new().and_then(|resident| {
        let run = |r| sockperf_lat(udp, secs, sockperf::Regime::BusyPoll, r);
        alternated_steady(
            times,
            || run(Some(&resident)).ok_or_else(|| anyhow::anyhow!("sockperf gave no figure")),
            Some(|| run(None)),
            placement::probe,
        )
    });
    info_beside_sockperf(
        t,
        udp,
        "sockperf, a thread asleep",
        figures,
        ("busy poll + thread", "busy poll"),
        RESIDENT,
    )
}

/// The row of the bare busy-polling ping-pong ([`floor`]) on `sockets`
/// beside sockperf busy polling, `iters` round trips a run (our polling
/// row's, as long as a sockperf run), `times` pairs alternated. A failed
/// bare run leaves the row without figures (`n.a.`), not the whole
/// comparison.
pub(super) fn floor_row(
    t: Transport,
    sockets: floor::Sockets,
    secs: f64,
    iters: u64,
    has_sockperf: bool,
    times: usize,
) -> Row {
    let udp = sockets != floor::Sockets::Tcp;
    let figures = alternated_steady(
        times,
        || floor::ping_pong(sockets, 64, iters).map(Lat::from),
        has_sockperf.then_some(|| sockperf_lat(udp, secs, sockperf::Regime::BusyPoll, None)),
        placement::probe,
    );
    let (what, regime, note) = match sockets {
        floor::Sockets::UdpSendingConnected => (
            "bare busy poll, sending connected",
            "bare busy poll, connected",
            CONNECTED_FLOOR,
        ),
        _ => ("bare busy poll", "bare busy poll", BUSY_FLOOR),
    };
    info_beside_sockperf(t, udp, what, figures, (regime, "busy poll"), note)
}

/// An information row of 64 B ping-pongs over `t` beside sockperf busy
/// polling: `figures` of alternated runs, or why there are none (the row
/// is then `n.a.`, and the comparison goes on).
fn info_beside_sockperf(
    t: Transport,
    udp: bool,
    what: &str,
    figures: anyhow::Result<(Lat, Option<Lat>, Pairs, Placement)>,
    regimes: (&'static str, &'static str),
    note: &'static str,
) -> Row {
    let (ours, theirs, pairs) = match figures {
        Ok((o, th, p, placed)) => (Some(o), th, Some((p, placed))),
        Err(e) => {
            eprintln!("{what} ({t}): {e:#}");
            (None, None, None)
        }
    };
    let proto = if udp { "udp" } else { "--tcp" };
    let r = row(
        &format!("{t} 64 B ping-pong, {what}"),
        "us",
        ours.map(|l| l.median),
        &format!("sockperf pp {proto} {}", sockperf::Regime::BusyPoll.flags()),
        theirs.map(|l| l.median),
        Goal::Info,
    )
    .regimes(regimes.0, regimes.1)
    .p99(ours.and_then(|l| l.p99), theirs.and_then(|l| l.p99))
    .note(note);
    match pairs {
        Some((p, placed)) => r.pairs(p).placement(placed),
        None => r,
    }
}

/// What the bare busy-polling rows measure.
const BUSY_FLOOR: &str = "two threads of this process in a ping-pong of 64 B messages over \
loopback, no transport of ours in it, each spinning on a receive that does not block and then \
sending, as sockperf's sides do with --nonblocked (over udp on sockets not connected, with \
sendto and recvfrom, as sockperf's are), each thread on a table of \
descriptors of its own and making its system calls without libc, as a process of one thread \
does: the system calls' floor under the polling rows, beside sockperf busy polling in the \
same minute. A ratio of 1.00 is sockperf at that floor; the polling row's ratio above this \
one is how far ours is above it: our endpoint's read and write of a message (its frame, its \
checks, the token, the sender's admission) and whatever else ours does between a message's \
arrival and its answer.";

/// What the bare busy-polling row that sends on connected sockets
/// measures.
const CONNECTED_FLOOR: &str = "the bare busy-polling ping-pong of the row above, each side \
receiving on its socket as there but sending from a second socket connected to the other \
side's (send, not sendto), as our endpoints send to a peer that answered: the kernel keeps a \
connected socket's route rather than look it up for every datagram. sockperf has no option \
to send so. This is the floor under our udp polling row; the row above, sockperf's.";

/// What the rows of sockperf with a thread asleep measure.
const RESIDENT: &str = "sockperf busy-polling as in the polling row above, with one thread \
more in each of its processes, asleep (a library preloaded into it, peers::resident), beside \
sockperf as it comes. In a process of more than one thread sharing its table of \
descriptors every system call on a descriptor takes a reference to its file and drops it \
after (the kernel's fdget and fput), which a process of one thread skips, and glibc's \
socket calls switch cancellation on and off around each call. The ratio is what both cost \
sockperf. A node's acceptors run on a table of their own, so ours pay neither.";
