//! `compare`'s rows as a table of text, notes below it.

use super::Row;

/// The table: each row's regime as `ours / theirs`, and latency rows'
/// 99th percentiles beside their medians; notes below it, each marked in
/// its rows' target column.
pub fn table(rows: &[Row]) -> String {
    let mut s = format!(
        "{:<46} {:>5} {:<26} {:>9} {:>9}  {:<42} {:>9} {:>9} {:>6} {:>9} {:>7} {:>4}\n",
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
            "{:<46} {:>5} {:<26} {:>9} {:>9}  {:<42} {:>9} {:>9} {:>6} {:>9} {:>7} {:>4}\n",
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
            target,
            match r.met {
                Some(true) => "yes",
                Some(false) => "NO",
                None => "",
            }
        );
    }
    for (k, n) in notes.iter().enumerate() {
        s += &format!("[{}] {n}\n", k + 1);
    }
    s
}
