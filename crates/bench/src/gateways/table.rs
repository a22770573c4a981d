//! The tables and the plot of a run.

use std::path::Path;

use super::held::{lowest_rate, Held, Run};
use super::lane::{fs_type, terse, CP_COLUMNS};
use super::{Options, Row};

/// Bandwidth against gateways: each way of moving data beside N x the
/// one-gateway figure.
pub(super) fn plot(path: &Path, rows: &[Row], one: f64, rate: &str) -> anyhow::Result<()> {
    type Pick = fn(&Row) -> Option<f64>;
    let picks: [(&str, Pick); 13] = [
        ("N x one gateway", |_| None),
        ("macrolink, one striped transfer (median)", |r| {
            Some(r.macrolink)
        }),
        ("macrolink, 8 transfers (median)", |r| {
            Some(r.macrolink_8_flows)
        }),
        ("macrolink, one striped transfer (lowest run)", |r| {
            lowest_rate(&r.macrolink_runs)
        }),
        ("macrolink, 8 transfers (lowest run)", |r| {
            lowest_rate(&r.macrolink_8_flows_runs)
        }),
        ("kernel ECMP, iperf3 1 flow", |r| r.kernel_1_flow),
        ("kernel ECMP, iperf3 8 flows", |r| r.kernel_8_flows),
        ("macrolink cp up", |r| Some(r.cp_up)),
        ("macrolink cp --direct up", |r| Some(r.cp_up_direct)),
        ("macrolink cp down", |r| Some(r.cp_down)),
        ("macrolink cp --cache down", |r| Some(r.cp_down_cached)),
        ("macrolink cp --direct down", |r| Some(r.cp_down_direct)),
        ("macrolink cp down into /dev/null", |r| Some(r.cp_down_null)),
    ];
    let series: Vec<(String, Vec<(f64, f64)>)> = picks
        .iter()
        .enumerate()
        .map(|(i, (name, pick))| {
            let pts = rows
                .iter()
                .filter_map(|r| {
                    let y = if i == 0 {
                        Some(r.gateways as f64 * one)
                    } else {
                        pick(r)
                    };
                    Some((r.gateways as f64, y?))
                })
                .collect();
            (name.to_string(), pts)
        })
        .collect();
    crate::plot::lines_png(
        path,
        &format!("one compute host to storage through N gateways ({rate} storage links)"),
        ("gateways", "MB/s"),
        &series,
    )
}

/// A striped run below this share of N x one is listed with what the
/// machine did meanwhile.
const DIP: f64 = 0.95;

/// Each striped run of `rows` below `below` x N x `one`, with what held it
/// back and what the machine did meanwhile, one line each.
fn dips(rows: &[Row], one: f64, below: f64) -> Vec<String> {
    let mut out = Vec::new();
    for r in rows {
        let kinds = [
            ("one transfer", &r.macrolink_runs),
            ("8 transfers", &r.macrolink_8_flows_runs),
        ];
        for (kind, runs) in kinds {
            for (i, run) in runs.iter().enumerate() {
                let share = run.mb_per_s / (r.gateways as f64 * one);
                if share >= below {
                    continue;
                }
                let (h, m) = (&run.held, &run.held.machine);
                let steal = m
                    .steal_ms
                    .map_or("n.a.".to_string(), |s| format!("{s:.0} ms"));
                out.push(format!(
                    "{} gateway(s), {kind}, run {}: {share:.3}; {} chunks sent again, a \
                     gateway taken out of use {} times, longest stall {:.0} ms; the host took \
                     {steal} of processor time (summed over the processors); a 10 ms sleep \
                     overran by up to {:.0} ms, and one processor was held {:.0} ms of a second",
                    r.gateways,
                    i + 1,
                    h.resent,
                    h.failovers,
                    h.longest_stall_ms,
                    m.late_ms,
                    m.held_ms,
                ));
            }
        }
    }
    out
}

/// Prints the tables of `rows`; `one` is the one-gateway figure.
pub(super) fn print(rows: &[Row], one: f64, a: &Options) {
    let f = |v: Option<f64>| v.map_or("n.a.".to_string(), |x| format!("{x:.1}"));
    println!(
        "storage-side links: {} each; one striped transfer of {} MiB; macrolink: the median \
         of {} runs of each, alternated, and the range of each run's / (N x one)",
        a.rate,
        a.mib,
        a.runs.max(1)
    );
    println!(
        "{:>8} {:>14} {:>12} {:>10} {:>17} {:>12} {:>10} {:>14} {:>15}",
        "gateways",
        "macrolink MB/s",
        "/ (N x one)",
        "range",
        "macrolink 8 flows",
        "/ (N x one)",
        "range",
        "kernel 1 flow",
        "kernel 8 flows",
    );
    for r in rows {
        let range = |runs: &[Run]| {
            let to_n = |mbs: f64| mbs / (r.gateways as f64 * one);
            let lo = lowest_rate(runs).unwrap_or(0.0);
            let hi = runs.iter().map(|r| r.mb_per_s).fold(0.0, f64::max);
            format!("{:.2}-{:.2}", to_n(lo), to_n(hi))
        };
        println!(
            "{:>8} {:>14.1} {:>12.2} {:>10} {:>17.1} {:>12.2} {:>10} {:>14} {:>15}",
            r.gateways,
            r.macrolink,
            r.ratio_to_n_links,
            range(&r.macrolink_runs),
            r.macrolink_8_flows,
            r.ratio_8_flows,
            range(&r.macrolink_8_flows_runs),
            f(r.kernel_1_flow),
            f(r.kernel_8_flows),
        );
    }
    println!(
        "what held the striped transfers back: chunks sent again / gateways taken out of use \
         (each summed over the runs and the transfers) / longest stall of any; rto: the \
         testbed's kernels' TCP retransmission timeouts meanwhile, summed; machine: the \
         most a sleep of {} ms on any processor overran during any run / the most of one \
         second one processor was held (its sleeps' overruns summed) / the processor time the \
         host took meanwhile (steal), summed over the runs and this machine's processors, ms:",
        crate::stalls::PERIOD.as_millis()
    );
    println!(
        "{:>8} {:>24} {:>6} {:>22} {:>24} {:>6} {:>22}",
        "gateways", "one transfer", "rto", "machine", "8 transfers", "rto", "machine"
    );
    for r in rows {
        let h = |h: &Held| {
            format!(
                "{} / {} / {:.1} ms",
                h.resent, h.failovers, h.longest_stall_ms
            )
        };
        println!(
            "{:>8} {:>24} {:>6} {:>22} {:>24} {:>6} {:>22}",
            r.gateways,
            h(&r.held[0]),
            r.held[0].tcp_timeouts,
            r.held[0].machine.terse(),
            h(&r.held[1]),
            r.held[1].tcp_timeouts,
            r.held[1].machine.terse(),
        );
    }
    let low = dips(rows, one, DIP);
    if low.is_empty() {
        println!("no striped run fell below {DIP} of N x one");
    } else {
        println!(
            "the striped runs below {DIP} of N x one, and what the machine did while they ran \
             (while the host holds one of its processors, whatever the machine has to run there \
             waits: a gateway, a relay, the sink or a transfer):"
        );
        for d in low {
            println!("  {d}");
        }
    }
    let cp_runs = rows
        .iter()
        .flat_map(|r| r.cp_runs.iter().map(Vec::len))
        .max()
        .unwrap_or(0);
    if cp_runs > 1 {
        println!(
            "cp of the same file through the lane, MB/s and / (N x one): the median run of \
             {cp_runs} of each column (of an even number, the slower of the middle two), run in \
             rounds of every column in turn; the tables after it are of that run"
        );
    } else {
        println!("cp of the same file through the lane, MB/s and / (N x one):");
    }
    let cols = &CP_COLUMNS;
    println!(
        "{:>8} {:>13} {:>13} {:>13} {:>13} {:>13} {:>14} {:>9} {:>9}",
        "gateways", cols[0], cols[1], cols[2], cols[3], cols[4], cols[5], "fs write", "uncached"
    );
    for r in rows {
        let c = |mbs: f64, ratio: f64| format!("{mbs:.1} {ratio:.2}");
        println!(
            "{:>8} {:>13} {:>13} {:>13} {:>13} {:>13} {:>14} {:>9.1} {:>9.1}",
            r.gateways,
            c(r.cp_up, r.ratio_cp_up),
            c(r.cp_up_direct, r.ratio_cp_up_direct),
            c(r.cp_down, r.ratio_cp_down),
            c(r.cp_down_cached, r.ratio_cp_down_cached),
            c(r.cp_down_direct, r.ratio_cp_down_direct),
            c(r.cp_down_null, r.ratio_cp_down_null),
            r.fs_write,
            r.fs_write_uncached,
        );
    }
    if cp_runs > 1 {
        println!("the range of cp's runs, each run / (N x one), lowest-highest:");
        println!(
            "{:>8} {:>13} {:>13} {:>13} {:>13} {:>13} {:>14}",
            "gateways", cols[0], cols[1], cols[2], cols[3], cols[4], cols[5]
        );
        for r in rows {
            let n_one = r.gateways as f64 * one;
            let range: Vec<String> = r.cp_runs.iter().map(|v| spread(v, n_one)).collect();
            println!(
                "{:>8} {:>13} {:>13} {:>13} {:>13} {:>13} {:>14}",
                r.gateways, range[0], range[1], range[2], range[3], range[4], range[5]
            );
        }
    }
    println!(
        "what held each copy back, as cp saw it (up: its chunks sent again / times it took a \
         gateway out of use / longest time without an acknowledgement; down: chunks that came \
         twice / longest time between two chunks placed):"
    );
    let header = || {
        println!(
            "{:>8} {:>18} {:>18} {:>13} {:>13} {:>13} {:>14}",
            "gateways", cols[0], cols[1], cols[2], cols[3], cols[4], cols[5]
        )
    };
    header();
    for r in rows {
        let h: Vec<String> = r.cp_held.iter().map(|h| terse(h)).collect();
        println!(
            "{:>8} {:>18} {:>18} {:>13} {:>13} {:>13} {:>14}",
            r.gateways, h[0], h[1], h[2], h[3], h[4], h[5]
        );
    }
    println!("the testbed's kernels' TCP retransmission timeouts during each copy:");
    header();
    for r in rows {
        let t = &r.cp_tcp_timeouts;
        println!(
            "{:>8} {:>18} {:>18} {:>13} {:>13} {:>13} {:>14}",
            r.gateways, t[0], t[1], t[2], t[3], t[4], t[5]
        );
    }
    println!(
        "the machine during each copy (its command, start to end): the most a sleep of {} ms \
         on any processor overran / the most of one second one processor was held / the \
         processor time the host took, summed over the processors, ms:",
        crate::stalls::PERIOD.as_millis()
    );
    println!(
        "{:>8} {:>20} {:>20} {:>20} {:>20} {:>20} {:>20}",
        "gateways", cols[0], cols[1], cols[2], cols[3], cols[4], cols[5]
    );
    for r in rows {
        let m: Vec<String> = r.cp_machine.iter().map(|m| m.terse()).collect();
        println!(
            "{:>8} {:>20} {:>20} {:>20} {:>20} {:>20} {:>20}",
            r.gateways, m[0], m[1], m[2], m[3], m[4], m[5]
        );
    }
    println!(
        "one: macrolink's striped figure through one gateway (the median run). macrolink: one \
         striped transfer over every gateway, and 8 at once; kernel ECMP: iperf3 with 1 and with 8 flows (blocking \
         sockets), hashed over the same links; cp: macrolink cp, one file with its default 2 \
         streams, through the lane's relays to the file service on the storage host (contact by \
         IP routes). None of these has a peer in the same regime here: the kernel columns show \
         what the links carry, not a like-for-like copy."
    );
    let files = a.dir.clone().unwrap_or_else(std::env::temp_dir);
    let pages = if crate::balloon::reports_free_pages() {
        "this machine's balloon device reports free memory to its host (virtio-balloon free \
         page reporting): the host takes freed pages back within seconds, and the first write \
         to each new page-cache page waits for the host to fault it in, at a pace that moves \
         from minute to minute; a copy that keeps its pages cached pays the same, so it may run \
         somewhat below or above this one write"
    } else {
        "a copy that keeps its pages cached runs at most about this fast"
    };
    println!(
        "cp's files live in {} ({}); up and down: as cp and the server write by default, the \
         first {} MiB of a file through the page cache and the rest uncached (RWF_DONTCACHE: \
         written back at once and its pages freed, so that they serve again); --cache: every \
         page kept cached, as an ordinary write; --direct: written past the page cache \
         (O_DIRECT), by the server up, by cp down; /dev/null: the download into nothing, what \
         the lane and cp carry with no file system on the client. fs write: the same bytes \
         written from memory to a new file beside them in 1 MiB writes by one thread, after the \
         copies, with no network, through the page cache: what the file system and the \
         machine's supply of new pages give one writer; {pages}; uncached: the same, written as \
         cp writes by default (--dir puts the files elsewhere). Each copy and each write start \
         after a sync, with the file system idle; each download reads a file the storage host \
         holds in its page cache, as each upload reads one cp's host holds.",
        files.display(),
        fs_type(&files),
        macrolink_files::uncached::HEAD >> 20,
    );
}

/// `rates` over `n_one`, as `lowest-highest`; `-` for none.
fn spread(rates: &[f64], n_one: f64) -> String {
    let lo = rates.iter().copied().reduce(f64::min);
    let hi = rates.iter().copied().reduce(f64::max);
    match lo.zip(hi) {
        Some((lo, hi)) if n_one > 0.0 => format!("{:.2}-{:.2}", lo / n_one, hi / n_one),
        _ => "-".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gateways::held::Held;
    use crate::stalls::Stalled;

    #[test]
    fn a_run_below_the_mark_is_listed_with_what_the_machine_did() {
        let run = |mb_per_s: f64, steal: Option<f64>, failovers: u64| Run {
            mb_per_s,
            held: Held {
                failovers,
                longest_stall_ms: 700.0,
                machine: Stalled {
                    late_ms: 63.4,
                    held_ms: 530.2,
                    steal_ms: steal,
                },
                ..Held::default()
            },
        };
        let rows = [
            Row {
                gateways: 1,
                macrolink_runs: vec![run(100.0, Some(0.0), 0)],
                macrolink_8_flows_runs: vec![run(94.0, None, 0)],
                ..Row::default()
            },
            Row {
                gateways: 2,
                macrolink_runs: vec![run(200.0, Some(0.0), 0), run(190.0, Some(0.0), 0)],
                macrolink_8_flows_runs: vec![run(199.0, Some(0.0), 0), run(112.0, Some(840.0), 2)],
                ..Row::default()
            },
        ];
        let low = dips(&rows, 100.0, 0.95);
        assert_eq!(low.len(), 2, "{low:#?}");
        assert!(
            low[0].starts_with("1 gateway(s), 8 transfers, run 1: 0.940;"),
            "{}",
            low[0]
        );
        assert!(
            low[0].contains("the host took n.a. of processor time"),
            "{}",
            low[0]
        );
        assert_eq!(
            low[1],
            "2 gateway(s), 8 transfers, run 2: 0.560; 0 chunks sent again, a gateway taken \
             out of use 2 times, longest stall 700 ms; the host took 840 ms of processor time \
             (summed over the processors); a 10 ms sleep overran by up to 63 ms, and one \
             processor was held 530 ms of a second"
        );
        // A run at the mark is not below it.
        assert_eq!(dips(&rows, 100.0, 0.94), low[1..]);
    }

    #[test]
    fn a_cp_columns_range_is_its_lowest_and_highest_run_over_n_links() {
        assert_eq!(spread(&[180.0, 200.0, 190.0], 200.0), "0.90-1.00");
        assert_eq!(spread(&[], 200.0), "-");
        assert_eq!(spread(&[180.0], 0.0), "-");
    }
}
