//! What a `plan` subcommand shows: a table a person reads, the rows as
//! data (JSON, CSV), the paper's figures beside the model's, and a plot
//! where a curve says more than rows. Made here, printed and written by
//! the command.

use serde::Serialize;

use crate::check::Check;

/// One series of a plot: its name and (x, y) points.
pub type Series = (String, Vec<(f64, f64)>);

/// A plot: title, axis names, series (x on a log scale).
#[derive(Clone, Debug, PartialEq)]
pub struct Plot {
    /// Title.
    pub title: &'static str,
    /// x and y axis names.
    pub axes: (&'static str, &'static str),
    /// The lines.
    pub series: Vec<Series>,
}

/// What a subcommand shows.
#[derive(Clone, Debug)]
pub struct Report {
    /// The table.
    pub text: String,
    /// The rows, as data.
    pub rows: serde_json::Value,
    /// The paper's figures beside the model's (`--paper`).
    pub paper: Vec<Check>,
    /// What the paper says that its figures do not.
    pub notes: Vec<&'static str>,
    /// A plot, where one helps.
    pub plot: Option<Plot>,
}

impl Report {
    /// A report of `text` and `rows`.
    pub fn new(text: String, rows: &impl Serialize) -> Report {
        Report {
            text,
            rows: serde_json::to_value(rows).unwrap_or(serde_json::Value::Null),
            paper: Vec::new(),
            notes: Vec::new(),
            plot: None,
        }
    }

    /// With the paper's figures and notes.
    pub fn paper(mut self, checks: Vec<Check>, notes: &[&'static str]) -> Report {
        self.paper = checks;
        self.notes = notes.to_vec();
        self
    }

    /// With a plot.
    pub fn plot(mut self, plot: Plot) -> Report {
        self.plot = Some(plot);
        self
    }

    /// What to show: the model's table and rows, or with `paper` the
    /// paper's figures beside the model's, as text and as rows.
    pub fn shown(&self, paper: bool) -> (String, Vec<serde_json::Value>) {
        let (text, rows) = match paper {
            true => (
                self.paper_text(),
                serde_json::to_value(&self.paper).unwrap_or_default(),
            ),
            false => (self.text.clone(), self.rows.clone()),
        };
        let rows = match rows {
            serde_json::Value::Array(v) => v,
            one => vec![one],
        };
        (text, rows)
    }

    /// The `--paper` text: every figure, and the notes.
    pub fn paper_text(&self) -> String {
        let mut s = crate::check::table(&self.paper);
        let slips = self.paper.iter().filter(|c| !c.agrees()).count();
        s += &format!(
            "{} figures, {slips} differ from the model: the notes say why\n",
            self.paper.len()
        );
        for n in &self.notes {
            s += &format!("note: {n}\n");
        }
        s
    }
}
