//! The rows of a waiting reader of large messages over shared memory,
//! which takes them by rendezvous, beside UCX's event-driven mode (`-E
//! sleep`), whose shared-memory rendezvous is the same one cross-memory
//! copy: bandwidth, each side's CPU, and (on base pages) the floor of one
//! wake-up a message under the receiver's CPU.
//!
//! Both sides' buffers lie on the same pages: ours on [`Pages`], UCX's
//! allocated to match ([`ucx_perftest::alloc_prio`]). Three runs of each
//! side alternated, and their medians: one run of either moves by a fifth
//! with the machine.

use macrolink_fabric::{Completion, Mode, Pages, Transport};
use std::time::Duration;

use super::alternate::{median, peer_iters, Pairs};
use super::{opt, row, Goal, Row, WAIT};
use crate::peers::ucx_perftest;
use crate::session::Session;
use crate::sweep;
use crate::wake;

/// UCX's shared-memory transports with its cross-memory copy.
const TLS: &str = "posix,cma,self";

/// Wake-ups timed for the floor under a waiting reader's CPU.
const WAKES: u64 = 5_000;

/// The rows for `size`-byte messages on `pages`; runs of `secs` seconds.
pub(super) fn rows(
    s: &mut Session,
    has_ucx: bool,
    secs: f64,
    size: usize,
    pages: Pages,
) -> anyhow::Result<Vec<Row>> {
    let mut rows = Vec::new();
    let on = match pages {
        Pages::Base => "",
        // Transparent huge pages (the row's note says so).
        Pages::Huge => " thp",
    };
    let theirs_on = match pages {
        Pages::Base => "",
        Pages::Huge => ", thp",
    };
    // The receiving side's CPU time beyond UCX's start-up: from a run of a
    // few iterations made the same way.
    let short = has_ucx
        .then(|| opt(ucx_perftest::run_sleeping(TLS, "tag_bw", size, 10, pages)))
        .flatten();
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    let (mut ours_cpu, mut theirs_cpu) = (Vec::new(), Vec::new());
    let (mut ours_both, mut theirs_both) = (Vec::new(), Vec::new());
    let (mut pairs_bw, mut pairs_both) = (Pairs::default(), Pairs::default());
    for _ in 0..3 {
        let (r, f, took) = pairs_bw.run(
            || {
                let plan = sweep::Bandwidth {
                    pages,
                    ..sweep::Bandwidth::one(
                        Transport::Shm,
                        Mode::Reliable,
                        Completion::Wait,
                        size,
                        secs,
                    )
                };
                let mut rows = plan.run(s.client())?;
                rows.pop().ok_or_else(|| anyhow::anyhow!("no row"))
            },
            |r| {
                has_ucx
                    .then(|| {
                        let iters = peer_iters(r.mb_per_s, 8_000.0, secs, size);
                        opt(ucx_perftest::run_sleeping(
                            TLS, "tag_bw", size, iters, pages,
                        ))
                    })
                    .flatten()
            },
            |r, f| r.mb_per_s.map(|o| (o, f.mb_per_s)),
        )?;
        let both = r.cpu_initiator.zip(r.cpu_target).map(|(a, b)| a + b);
        ours.extend(r.mb_per_s);
        ours_cpu.extend(r.cpu_target);
        ours_both.extend(both);
        theirs.extend(f.map(|f| f.mb_per_s));
        let cpu = f.zip(short).and_then(|(f, short)| f.server_cpu_pct(&short));
        theirs_cpu.extend(cpu);
        let client = f.zip(short).and_then(|(f, short)| f.client_cpu_pct(&short));
        let their_both = cpu.zip(client).map(|(a, b)| a + b);
        theirs_both.extend(their_both);
        if let Some((o, t)) = both.zip(their_both) {
            pairs_both.push(o, t, took);
        }
    }
    let ours = median(ours);
    let their_bw = median(theirs);
    let mut bw_row = row(
        &format!("shm reliable {size} B{on}, median of 3"),
        "MB/s",
        ours,
        &format!("ucx_perftest tag_bw -E sleep (posix,cma{theirs_on})"),
        their_bw,
        Goal::AtLeast(1.0),
    )
    .regimes(WAIT, "sleep")
    .pairs(pairs_bw);
    if pages == Pages::Huge {
        bw_row = bw_row.note(HUGE_PAGES);
    }
    rows.push(bw_row);
    let ours_cpu = median(ours_cpu);
    // UCX's receiver pulls a rendezvous message with its own cross-memory
    // read; ours is written into by the sender. So the receivers alone
    // compare unlike work: the goal is on both sides together, each side's
    // CPU time over its run.
    rows.push(
        row(
            &format!("shm reliable {size} B{on}, receiver CPU"),
            "%",
            ours_cpu,
            "ucx_perftest -E sleep, its receiver (copies)",
            median(theirs_cpu),
            Goal::Info,
        )
        .regimes(WAIT, "sleep"),
    );
    // What one wake-up a message costs a thread here with nothing else in
    // it, at our messages a second: under that no reader woken once a
    // message can go.
    if let Some(rate) = ours
        .map(|mb| mb * 1e6 / size as f64)
        .filter(|_| pages == Pages::Base)
    {
        let interval = Duration::from_secs_f64(1.0 / rate.max(1.0));
        let wake = opt(wake::measure(WAKES, interval));
        // The goal's two halves at once: at UCX's bandwidth, a reader
        // woken once a message uses at least this.
        let at_theirs = wake
            .zip(their_bw)
            .map(|(w, mb)| w.pct_at(mb * 1e6 / size as f64));
        rows.push(
            row(
                &format!("shm reliable {size} B, receiver CPU"),
                "%",
                ours_cpu,
                &wake.map_or("a bare wake-up a message (futex)".into(), |w| {
                    format!(
                        "a bare wake-up: {:.1} us, waker {:.0}, late {:.0}",
                        w.cpu_us, w.waker_us, w.late_us
                    )
                }),
                wake.map(|w| w.pct_at(rate)),
                Goal::Info,
            )
            .regimes(WAIT, "sleep")
            .note(WAKE_FLOOR),
        );
        rows.push(
            row(
                &format!("shm reliable {size} B, wake-ups at UCX's MB/s"),
                "%",
                at_theirs,
                "limit: 10% (papers' event-driven column)",
                Some(10.0),
                Goal::Info,
            )
            .regimes(WAIT, "-")
            .note(WAKE_GOAL),
        );
    }
    rows.push(
        row(
            &format!("shm reliable {size} B{on}, CPU of both sides"),
            "%",
            median(ours_both),
            "ucx_perftest -E sleep, client + server",
            median(theirs_both),
            Goal::AtMost(1.0),
        )
        .regimes(WAIT, "sleep")
        .pairs(pairs_both),
    );
    Ok(rows)
}

const WAKE_FLOOR: &str = "a thread of this process woken (a futex) once a message at \
our messages a second, with nothing else to do: its CPU time a wake-up, the switch into it \
and back out, times our messages a second. A reader woken once a message cannot use less \
of a core; the 10% limit of the target-CPU row needs this floor under it. waker: the median \
time of the waking call (where idle processors halt, as on a virtual machine, the \
interrupt to the sleeper's processor is made inside it); late: the median time from that \
call to the sleeper running. A sender that rings a sleeping reader once a message pays \
the first each message, and the reader takes the second to be back: both bound a waiting \
stream's bandwidth where the peer's receiver never sleeps.";

const WAKE_GOAL: &str = "the bare wake-up above, once a message at the messages a \
second of ucx_perftest's bandwidth: the least CPU a reader woken once a message uses at \
the bandwidth the goal asks for. Where it is above the 10% limit, no such reader meets \
both halves of the goal (at least UCX's bandwidth, at most 10% of a core) on this machine; \
only one that is woken less often than once a message could.";

const HUGE_PAGES: &str = "both sides' buffers on transparent huge pages: ours \
(bench bw --pages huge) start on a huge page with MADV_HUGEPAGE; ucx_perftest's with \
UCX_ALLOC_PRIO=thp,mmap,heap, which UCX takes only where rounding a buffer up to whole \
huge pages less than doubles it, so from just over 1 MiB (hence 4 MB here). The kernel's \
cross-memory copy takes the pages it writes or reads one at a time: on huge pages it runs \
about twice as fast (measured here, 1 MB process_vm_writev 12.8-13.1 GB/s into base pages, \
24.4-27.6 into huge ones). The 1 MB rows above are on base pages both sides: ours mmap'd, \
ucx_perftest's with UCX_ALLOC_PRIO=mmap,heap (its default, SysV shared memory, copies \
slower).";
