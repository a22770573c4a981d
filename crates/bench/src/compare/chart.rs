//! `compare`'s judged rows as a picture: each ratio beside its target.

use std::path::Path;

use super::{Goal, Row, Verdict};
use crate::plot::{ratios_png, RatioMark};

/// The rows that have both a ratio and a target, in table order, each
/// labelled with its figure and both sides' regimes.
pub fn marks(rows: &[Row]) -> Vec<RatioMark> {
    rows.iter()
        .filter_map(|r| {
            let (limit, at_most) = match r.goal {
                Goal::AtMost(x) => (x, true),
                Goal::AtLeast(x) => (x, false),
                Goal::Info => return None,
            };
            Some(RatioMark {
                label: format!("{} ({} / {})", r.figure, r.ours_regime, r.peer_regime),
                ratio: r.ratio?,
                spread: r.pairs,
                interval: r.interval.map(|i| (i.lo, i.hi)),
                limit,
                at_most,
                met: match r.met? {
                    Verdict::Yes => Some(true),
                    Verdict::No => Some(false),
                    Verdict::Tie => None,
                },
            })
        })
        .collect()
}

/// Draws the judged rows of `rows` (their marks, above) as a PNG at `path`.
pub fn png(path: &Path, rows: &[Row]) -> anyhow::Result<()> {
    ratios_png(path, "macrolink beside the established tools", &marks(rows))
}

#[cfg(test)]
mod tests {
    use super::super::row;
    use super::*;

    #[test]
    fn only_judged_rows_with_both_figures_become_marks_in_table_order() {
        let rows = [
            row(
                "lat",
                "us",
                Some(0.3),
                "peer",
                Some(0.25),
                Goal::AtMost(1.0),
            )
            .regimes("poll", "busy poll")
            .pairs(super::super::Pairs::of(&[
                (1.1, 1.0, None, None),
                (1.3, 1.0, None, None),
            ])),
            row("info", "%", Some(11.0), "floor", Some(9.0), Goal::Info),
            row(
                "no peer",
                "MB/s",
                Some(5.0),
                "peer",
                None,
                Goal::AtLeast(1.0),
            ),
            row(
                "bw",
                "MB/s",
                Some(95.0),
                "peer",
                Some(100.0),
                Goal::AtLeast(0.9),
            ),
            row(
                "even",
                "us",
                Some(0.95),
                "peer",
                Some(1.0),
                Goal::AtMost(1.0),
            )
            .pairs(super::super::Pairs::of(&[
                (0.9, 1.0, None, None),
                (1.05, 1.0, None, None),
                (0.95, 1.0, None, None),
            ])),
        ];
        let m = marks(&rows);
        assert_eq!(m.len(), 3, "{m:?}");
        assert_eq!(m[0].label, "lat (poll / busy poll)");
        assert!((m[0].ratio - 1.2).abs() < 1e-9);
        assert_eq!(m[0].spread, Some((1.1, 1.3)));
        assert_eq!(m[0].interval, Some((1.1, 1.3)), "two pairs: both");
        assert!(m[0].at_most && m[0].met == Some(false) && m[0].limit == 1.0);
        assert_eq!(m[1].label, "bw (- / -)");
        assert!(!m[1].at_most && m[1].met == Some(true) && m[1].limit == 0.9);
        assert_eq!((m[1].spread, m[1].interval), (None, None));
        // Its ratio meets the target, one pair does not: the runs cannot
        // tell.
        assert_eq!(m[2].interval, Some((0.9, 1.05)));
        assert_eq!(m[2].met, None, "a tie");
    }
}
