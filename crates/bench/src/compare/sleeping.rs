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

use super::alternate::{least_messages, median, Pairs};
use super::{opt, row, Goal, Row, WAIT};
use crate::peers::ucx_perftest::{self, Buffers};
use crate::session::Session;
use crate::sweep;
use crate::wake;

/// UCX's shared-memory transports with its cross-memory copy.
const TLS: &str = "posix,cma,self";

/// Both sides of every run here wait.
const WAIT_C: Completion = Completion::Wait;

/// ucx_perftest's buffers hold data, as ours do.
const WRITTEN: Buffers = Buffers::Written;

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
        .then(|| {
            opt(ucx_perftest::run_sleeping(
                TLS, "tag_bw", size, 10, pages, 1, WRITTEN,
            ))
        })
        .flatten();
    let (mut ours, mut theirs, mut windowed) = (Vec::new(), Vec::new(), Vec::new());
    let mut unwritten = Vec::new();
    let (mut ours_cpu, mut theirs_cpu) = (Vec::new(), Vec::new());
    let (mut ours_both, mut theirs_both) = (Vec::new(), Vec::new());
    let (mut pairs_bw, mut pairs_both) = (Pairs::default(), Pairs::default());
    for _ in 0..3 {
        let (r, f, took) = pairs_bw.run(
            || {
                let plan = sweep::Bandwidth {
                    pages,
                    least: least_messages(8_000.0, secs, size),
                    ..sweep::Bandwidth::one(Transport::Shm, Mode::Reliable, WAIT_C, size, secs)
                };
                let mut rows = plan.run(s.client())?;
                rows.pop().ok_or_else(|| anyhow::anyhow!("no row"))
            },
            |r| {
                (has_ucx && r.mb_per_s.is_some())
                    .then(|| {
                        let iters = r.sent;
                        opt(ucx_perftest::run_sleeping(
                            TLS, "tag_bw", size, iters, pages, 1, WRITTEN,
                        ))
                    })
                    .flatten()
            },
            |r, f| r.mb_per_s.map(|o| (o, f.mb_per_s)),
        )?;
        // UCX with its own window, and UCX sending from a buffer it never
        // wrote, beside the pair: not judged.
        if has_ucx && r.mb_per_s.is_some() {
            let iters = r.sent;
            let window = ucx_perftest::DEFAULT_WINDOW;
            let w = ucx_perftest::run_sleeping(TLS, "tag_bw", size, iters, pages, window, WRITTEN);
            windowed.extend(opt(w).map(|f| f.mb_per_s));
            let bare = Buffers::AsTheToolLeavesThem;
            let u = ucx_perftest::run_sleeping(TLS, "tag_bw", size, iters, pages, 1, bare);
            unwritten.extend(opt(u).map(|f| f.mb_per_s));
        }
        // Both sides' CPU time a gigabyte: the two runs move bytes at
        // different rates, and a side woken once a message uses more of a
        // core the faster they come.
        let both = r
            .cpu_initiator
            .zip(r.cpu_target)
            .zip(r.mb_per_s)
            .and_then(|((a, b), mb)| ms_per_gb(a + b, mb));
        ours.extend(r.mb_per_s);
        ours_cpu.extend(r.cpu_target);
        ours_both.extend(both);
        theirs.extend(f.map(|f| f.mb_per_s));
        let cpu = f.zip(short).and_then(|(f, short)| f.server_cpu_pct(&short));
        theirs_cpu.extend(cpu);
        let client = f.zip(short).and_then(|(f, short)| f.client_cpu_pct(&short));
        let their_both = cpu
            .zip(client)
            .zip(f)
            .and_then(|((a, b), f)| ms_per_gb(a + b, f.mb_per_s));
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
        &format!("ucx_perftest tag_bw -O 1 -E sleep (posix,cma{theirs_on})"),
        their_bw,
        Goal::AtLeast(1.0),
    )
    .regimes(WAIT, "sleep")
    .pairs(pairs_bw);
    if pages == Pages::Huge {
        bw_row = bw_row.note(HUGE_PAGES);
    }
    rows.push(bw_row);
    rows.push(
        row(
            &format!("shm reliable {size} B{on}, median of 3"),
            "MB/s",
            ours,
            &format!(
                "tag_bw -O {} -E sleep (posix,cma{theirs_on})",
                ucx_perftest::DEFAULT_WINDOW
            ),
            median(windowed),
            Goal::Info,
        )
        .regimes(WAIT, "sleep")
        .note(ONE_IN_FLIGHT),
    );
    rows.push(
        row(
            &format!("shm reliable {size} B{on}, median of 3"),
            "MB/s",
            ours,
            &format!("tag_bw -O 1 -E sleep, send buffer never written{theirs_on}"),
            median(unwritten),
            Goal::Info,
        )
        .regimes(WAIT, "sleep")
        .note(NEVER_WRITTEN),
    );
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
    // Both halves of the goal at once: our reader's CPU with the messages
    // coming at the rate UCX's reached (ours being at least as fast).
    if let Some(target) = their_bw.filter(|t| ours.is_some_and(|o| o >= *t)) {
        let pace = target * 1e6 / size as f64;
        let mut cpu = Vec::new();
        let mut got = Vec::new();
        for _ in 0..3 {
            let plan = sweep::Bandwidth {
                pages,
                pace: Some(pace),
                ..sweep::Bandwidth::one(Transport::Shm, Mode::Reliable, WAIT_C, size, secs)
            };
            if let Some(r) = plan.run(s.client())?.pop() {
                cpu.extend(r.cpu_target);
                got.extend(r.mb_per_s);
            }
        }
        let got = median(got);
        rows.push(
            row(
                &format!("shm reliable {size} B{on}, receiver CPU at UCX's MB/s"),
                "%",
                median(cpu.clone()),
                &got.map_or("limit: 10%, paced".into(), |mb| {
                    format!("limit: 10%, ours paced to {mb:.0} of {target:.0} MB/s")
                }),
                Some(10.0),
                paced_goal(target, got),
            )
            .regimes(WAIT, "-")
            .runs(&cpu)
            .note(PACED),
        );
    }
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
            "ms/GB",
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

/// Milliseconds of CPU time a gigabyte moved by a run that kept `pct` %
/// of a core busy at `mb_per_s`.
/// `None` for a run that moved nothing.
fn ms_per_gb(pct: f64, mb_per_s: f64) -> Option<f64> {
    (mb_per_s > 0.0).then(|| pct * 1e4 / mb_per_s)
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

const PACED: &str = "our sender paced to the messages a second of ucx_perftest's \
bandwidth in the judged row above (-O 1), where ours is at least as fast: the waiting \
reader's CPU at the bandwidth the goal asks for, beside its 10% limit. A reader woken \
once a message uses that much more of a core the faster the messages come: the \
target-CPU rows at the end are at full speed. The median of three paced runs, judged on \
all three as a row of three pairs is (a tie where they fall on both sides of the limit), and \
only where they reached at least 95% of that bandwidth: slower, they would show the CPU of \
fewer messages.";

/// The least share of the bandwidth asked for that paced runs must reach
/// for their reader's CPU to be judged against the limit.
const PACE_REACHED: f64 = 0.95;

/// The paced row is judged only where our paced runs reached (nearly) the
/// `target` MB/s they were paced to: at a lower rate the reader is woken
/// less often and its CPU would flatter it.
fn paced_goal(target: f64, got: Option<f64>) -> Goal {
    match got {
        Some(mb) if mb >= PACE_REACHED * target => Goal::AtMost(1.0),
        _ => Goal::Info,
    }
}

const ONE_IN_FLIGHT: &str =
    "the row above has one message in flight on each side: a reader of ours \
offers one buffer, the one its read was given, and the sender writes the next message \
once the reader has read the last and offered again; ucx_perftest with -O 1 sends the \
next message once the last is received, and its receiver keeps one receive posted. By \
default (-O 32, this row, not judged) it keeps 32 sends outstanding and as many \
receives posted, so its receiver finds the next message waiting and seldom sleeps; a \
read of ours that offered several buffers at once would be the like of it, and the \
endpoint has none.";

const NEVER_WRITTEN: &str = "ucx_perftest as it comes: it never writes the buffer \
it sends from, whose pages are then the kernel's zero page (on huge pages, its huge zero \
page), and its receiver's cross-memory read takes the same 4 KiB over and over out of the \
first level of the cache, about twice as fast as out of memory holding data (1 MB \
process_vm_readv on a 2-core Xeon VM: 14.7-21.4 GB/s against 8.3-10.3). Every other \
ucx_perftest row runs with a library preloaded into it that writes each buffer it maps \
once before the run (bench/src/peers/written.c), as an application's data would be and as \
ours are.";

const HUGE_PAGES: &str = "both sides' buffers on transparent huge pages: ours \
(bench bw --pages huge) start on a huge page with MADV_HUGEPAGE; ucx_perftest's with \
UCX_ALLOC_PRIO=thp,mmap,heap, which UCX takes only where rounding a buffer up to whole \
huge pages less than doubles it, so from just over 1 MiB (hence 4 MB here). The kernel's \
cross-memory copy takes the pages it writes or reads one at a time: on huge pages it runs \
about twice as fast (measured here, 1 MB process_vm_writev 12.8-13.1 GB/s into base pages, \
24.4-27.6 into huge ones). The 1 MB rows above are on base pages both sides: ours mmap'd, \
ucx_perftest's with UCX_ALLOC_PRIO=mmap,heap (page-aligned anonymous memory; its default is \
SysV shared memory), each side's written before the run.";

#[cfg(test)]
mod tests {
    #[test]
    fn cpu_a_gigabyte_is_the_cores_kept_busy_over_the_rate() {
        // A core and a tenth at 8325 MB/s: 1.1047 s of CPU for 8.325 GB.
        let ms = super::ms_per_gb(110.47, 8325.0).unwrap();
        assert!((ms - 1104.7 / 8.325).abs() < 1e-9, "{ms}");
        // Half the rate at the same CPU: twice the time a gigabyte.
        assert!((super::ms_per_gb(110.47, 4162.5).unwrap() - 2.0 * ms).abs() < 1e-9);
        assert_eq!(super::ms_per_gb(50.0, 0.0), None);
    }

    #[test]
    fn a_paced_run_that_fell_short_of_the_rate_is_not_judged() {
        use super::{paced_goal, Goal};
        assert!(matches!(paced_goal(3734.5, Some(3700.0)), Goal::AtMost(_)));
        assert!(matches!(paced_goal(3734.5, Some(1890.0)), Goal::Info));
        assert!(matches!(paced_goal(3734.5, None), Goal::Info));
    }
}
