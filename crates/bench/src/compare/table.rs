//! `compare`'s rows as a table of text, notes below it.
//!
//! Beside each ratio made of alternated runs: the lowest and highest of
//! its pairs, the interval that holds their median (and so the verdict:
//! yes, NO, or a tie), the processor time the machine's host took during our runs
//! and the peer's (`host ms`), and the ratio of the pairs it took (next
//! to) nothing from, with how many there were (`calm`).

use super::{Row, Verdict};

/// The table: each row's regime as `ours / theirs`, and latency rows'
/// 99th percentiles beside their medians; notes below it, each marked in
/// its rows' target column.
pub fn table(rows: &[Row]) -> String {
    let mut s = format!(
        "{:<46} {:>5} {:<26} {:>9} {:>9}  {:<42} {:>9} {:>9} {:>6} {:>9} {:>14} {:>11} {:>10} {:>7} {:>4}\n",
        "figure",
        "unit",
        "regime ours / theirs",
        "ours",
        "ours p99",
        "beside",
        "theirs",
        "their p99",
        "ratio",
        "pairs",
        "median in",
        "host ms",
        "calm",
        "target",
        "met"
    );
    let f = |v: Option<f64>| v.map_or("n.a.".into(), |x| format!("{x:.2}"));
    let g = |v: Option<f64>| v.map_or("".into(), |x| format!("{x:.2}"));
    let mut notes: Vec<&str> = Vec::new();
    for r in rows {
        let target = match r.note {
            Some(n) => {
                let k = match notes.iter().position(|&m| m == n) {
                    Some(k) => k,
                    None => {
                        notes.push(n);
                        notes.len() - 1
                    }
                };
                format!("{} [{}]", r.target, k + 1)
            }
            None => r.target.clone(),
        };
        s += &format!(
            "{:<46} {:>5} {:<26} {:>9} {:>9}  {:<42} {:>9} {:>9} {:>6} {:>9} {:>14} {:>11} {:>10} {:>7} {:>4}\n",
            r.figure,
            r.unit,
            format!("{} / {}", r.ours_regime, r.peer_regime),
            f(r.ours),
            g(r.ours_p99),
            r.peer,
            f(r.theirs),
            g(r.theirs_p99),
            f(r.ratio),
            r.pairs
                .map_or(String::new(), |(lo, hi)| format!("{lo:.2}-{hi:.2}")),
            r.interval.map_or(String::new(), |i| format!(
                "{:.2}-{:.2} {:.0}%",
                i.lo,
                i.hi,
                (i.confidence * 100.0).floor()
            )),
            r.host.as_ref().map_or(String::new(), |h| {
                let ms = |v: Option<f64>| v.map_or("n.a.".into(), |v| format!("{v:.0}"));
                format!("{}/{}", ms(h.ours_ms), ms(h.theirs_ms))
            }),
            r.host.as_ref().map_or(String::new(), |h| match h.calm_ratio {
                Some(c) => format!("{c:.2} ({})", h.calm_pairs),
                None => format!("- ({})", h.calm_pairs),
            }),
            target,
            match r.met {
                Some(Verdict::Yes) => "yes",
                Some(Verdict::No) => "NO",
                Some(Verdict::Tie) => "tie",
                None => "",
            }
        );
    }
    if rows.iter().any(|r| r.interval.is_some()) {
        s += INTERVAL;
    }
    if rows.iter().any(|r| r.host.is_some()) {
        s += HOST;
    }
    for (k, n) in notes.iter().enumerate() {
        s += &format!("[{}] {n}\n", k + 1);
    }
    for r in rows {
        if let Some(p) = &r.placement {
            let which = format!("{} ({} / {})", r.figure, r.ours_regime, r.peer_regime);
            s += &format!("placement: {}\n", p.line(&which));
        }
    }
    s
}

/// What the `median in` column holds, and how the verdict reads it.
const INTERVAL: &str = "median in: where the median of the pairs' ours / theirs lies, with \
the chance that it does (the pairs' ratios in order, from the k-th lowest to the k-th highest \
for the largest k that gives 90%, the sign test's interval; three pairs give 75%); met: yes \
where the ratio and all of that interval meet the target, NO where none of it does, tie where \
it reaches across the target, which these runs cannot tell at the noise they met (more pairs: \
--pairs).\n";

/// What the `host ms` and `calm` columns hold.
const HOST: &str = "host ms: the processor time the machine's host gave to others (steal, \
summed over this machine's processors, in the kernel's 10 ms ticks) during our runs / the \
peer's, summed over the row's pairs; calm: ours / theirs over the pairs it took at most 1% of \
either run's length from (how many), the medians of each side's runs. The verdict is on all \
pairs (those counted, where a placement line below says which).\n";
