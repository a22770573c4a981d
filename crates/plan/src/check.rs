//! A figure of a model beside the figure a paper printed for it.

use serde::Serialize;

/// One figure: ours, the paper's, and what to make of a difference.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Check {
    /// Where it stands in the paper ("Table 4, 2048 nodes, cables").
    pub what: String,
    /// The model's figure.
    pub model: f64,
    /// The paper's printed figure.
    pub printed: f64,
    /// How far apart the two may be and still agree: the paper's rounding.
    pub within: f64,
    /// Why they differ, when they do.
    pub note: Option<String>,
}

impl Check {
    /// A figure the paper prints exactly (a count, a price).
    pub fn new(what: impl Into<String>, model: f64, printed: f64) -> Check {
        Check {
            what: what.into(),
            model,
            printed,
            within: 1e-9,
            note: None,
        }
    }

    /// The paper rounds this figure: it agrees within `abs` (half its
    /// last printed digit).
    pub fn within(mut self, abs: f64) -> Check {
        self.within = abs;
        self
    }

    /// With a note on the difference.
    pub fn noted(mut self, note: impl Into<String>) -> Check {
        self.note = Some(note.into());
        self
    }

    /// Whether the printed figure is the model's, to within the paper's
    /// rounding.
    pub fn agrees(&self) -> bool {
        (self.model - self.printed).abs() <= self.within
    }
}

/// A table of checks, with a column that marks the ones that differ.
pub fn table(checks: &[Check]) -> String {
    let mut s = format!(
        "{:<58} {:>14} {:>14}  {}\n",
        "figure", "model", "paper", "difference"
    );
    for c in checks {
        let diff = if c.agrees() {
            String::new()
        } else {
            format!("{:+}", round(c.model - c.printed))
        };
        let note = c
            .note
            .as_deref()
            .map_or(String::new(), |n| format!("  ({n})"));
        s += &format!(
            "{:<58} {:>14} {:>14}  {diff}{note}\n",
            c.what,
            round(c.model),
            round(c.printed)
        );
    }
    s
}

/// A figure with as many decimals as it needs, at most four.
pub fn round(x: f64) -> String {
    let s = format!("{x:.4}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s == "-0" {
        "0".into()
    } else {
        s.into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_agree_within_rounding_and_differences_show() {
        assert!(Check::new("x", 97.9167, 97.92).within(0.005).agrees());
        assert!(!Check::new("x", 97.9167, 97.92).agrees());
        assert!(!Check::new("x", 4096.0, 4192.0).agrees());
        let t = table(&[Check::new("cables", 4096.0, 4192.0).noted("slip")]);
        assert!(t.contains("-96") && t.contains("(slip)"), "{t}");
        assert_eq!(round(2.5), "2.5");
        assert_eq!(round(3.0), "3");
        assert_eq!(round(-0.00001), "0");
    }
}
