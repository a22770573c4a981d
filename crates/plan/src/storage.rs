//! CERN's storage macro-clusters (Van Praag et al., 2003): RAID groups of
//! data disks plus parity in boxes with hot spares, and what they hold and
//! deliver.
//!
//! ```text
//!  groups per box = (disks per box - spares) / (data + parity)
//!  usable         = boxes * groups * data * disk size        (parity and spares hold no data)
//!  theoretical    = boxes * groups * data * interface rate   (Serial-ATA class 1: 150 MB/s)
//!  realistic      = boxes * groups * data * disk rate        (IDE disks of 2003: 40 MB/s)
//!  delivered      = min(theoretical or realistic, boxes * link per box)  (when a link caps each box)
//! ```

use serde::Serialize;

use crate::check::Check;
use crate::report::Report;

/// A storage macro-cluster.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Spec {
    /// RAID boxes (or, for disks in the nodes, one "box" of nodes).
    pub boxes: u32,
    /// Disks in each box.
    pub disks_per_box: u32,
    /// Hot spares in each box.
    pub spares_per_box: u32,
    /// Data disks of a RAID group.
    pub data: u32,
    /// Parity disks of a RAID group.
    pub parity: u32,
    /// Size of a disk, GB.
    pub disk_gb: f64,
    /// Rate of the disk interface, MB/s.
    pub interface_mbs: f64,
    /// Rate a disk really delivers, MB/s.
    pub disk_mbs: f64,
    /// Rate of the link of each box, MB/s, when it caps the box.
    pub link_mbs: Option<f64>,
}

/// What a storage macro-cluster holds and delivers.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Capacity {
    /// RAID groups in all.
    pub groups: u32,
    /// Disks in all.
    pub disks: u32,
    /// Data capacity, TB.
    pub usable_tb: f64,
    /// Capacity of the groups' disks, parity included, TB.
    pub group_raw_tb: f64,
    /// Bandwidth at the interface rate, MB/s.
    pub theoretical_mbs: f64,
    /// Bandwidth at the disks' real rate, MB/s.
    pub realistic_mbs: f64,
    /// The theoretical bandwidth, capped by the boxes' links, MB/s.
    pub delivered_mbs: f64,
    /// The realistic bandwidth, capped by the boxes' links, MB/s.
    pub delivered_realistic_mbs: f64,
}

impl Spec {
    /// A macro-cluster of `boxes` boxes of 12 disks with 2 hot spares, in
    /// groups of 4 data disks and 1 parity, 200 GB Serial-ATA disks (150
    /// MB/s interface, 40 MB/s real): the paper's RAID box.
    pub fn paper_box(boxes: u32) -> Spec {
        Spec {
            boxes,
            disks_per_box: 12,
            spares_per_box: 2,
            data: 4,
            parity: 1,
            disk_gb: 200.0,
            interface_mbs: 150.0,
            disk_mbs: 40.0,
            link_mbs: None,
        }
    }

    /// What it holds and delivers; `None` when a box has no room for a
    /// group.
    pub fn capacity(&self) -> Option<Capacity> {
        let width = self.data + self.parity;
        if width == 0 || self.spares_per_box >= self.disks_per_box {
            return None;
        }
        let per_box = (self.disks_per_box - self.spares_per_box) / width;
        if per_box == 0 {
            return None;
        }
        let groups = per_box * self.boxes;
        let data = f64::from(groups * self.data);
        let realistic = data * self.disk_mbs;
        let cap = |mbs: f64| {
            self.link_mbs
                .map_or(mbs, |l| mbs.min(l * f64::from(self.boxes)))
        };
        Some(Capacity {
            groups,
            disks: self.boxes * self.disks_per_box,
            usable_tb: data * self.disk_gb / 1000.0,
            group_raw_tb: f64::from(groups * width) * self.disk_gb / 1000.0,
            theoretical_mbs: data * self.interface_mbs,
            realistic_mbs: realistic,
            delivered_mbs: cap(data * self.interface_mbs),
            delivered_realistic_mbs: cap(realistic),
        })
    }
}

/// The paper's examples.
pub fn paper_examples() -> Vec<(&'static str, Spec)> {
    let nodes = Spec {
        boxes: 1,
        disks_per_box: 6,
        spares_per_box: 1,
        ..Spec::paper_box(1)
    };
    let second_channel = Spec {
        link_mbs: Some(350.0),
        ..Spec::paper_box(8)
    };
    vec![
        ("second disks of 6 nodes, software RAID (Fig. 6)", nodes),
        ("one RAID box of 12 disks (Fig. 7)", Spec::paper_box(1)),
        ("two RAID boxes (Fig. 7)", Spec::paper_box(2)),
        (
            "eight RAID boxes on the switch (Fig. 8)",
            Spec::paper_box(8),
        ),
        (
            "eight boxes on the nodes' second channel, 350 MB/s each",
            second_channel,
        ),
    ]
}

/// Each figure the paper prints for its examples beside the model's.
pub fn paper() -> Vec<Check> {
    let ex = paper_examples();
    let cap = |i: usize| ex[i].1.capacity().expect("the paper's examples fit");
    let (nodes, one, two, eight, second) = (cap(0), cap(1), cap(2), cap(3), cap(4));
    let parity_counted =
        "the paper counts the parity disks: their data capacity is the usable figure";
    vec![
        Check::new("Fig. 6, 4+1 disks, theoretical MB/s", nodes.theoretical_mbs, 600.0),
        Check::new("Fig. 6, 4+1 disks, realistic MB/s", nodes.realistic_mbs, 160.0),
        Check::new("Fig. 6, 200 GB disks, storage TB", nodes.usable_tb, 1.0).noted(parity_counted),
        Check::new("Fig. 7, one group, theoretical MB/s", one.theoretical_mbs / 2.0, 600.0),
        Check::new("Fig. 7, one group, storage TB", one.usable_tb / 2.0, 1.0).noted(parity_counted),
        Check::new("Fig. 7, two boxes, theoretical GB/s", two.theoretical_mbs / 1000.0, 2.4),
        Check::new("Fig. 7, two boxes, storage TB", two.usable_tb, 4.0).noted(parity_counted),
        Check::new("Fig. 7, two boxes, maximum GB/s (\"near to 3\")", two.theoretical_mbs / 1000.0, 3.0)
            .noted("slip: 2 boxes x 2 groups x 4 disks x 150 MB/s is the 2.4 GB/s printed a line before"),
        Check::new("Fig. 7, two boxes, realistic MB/s", two.realistic_mbs, 640.0),
        Check::new("Fig. 8, eight boxes, theoretical GB/s", eight.theoretical_mbs / 1000.0, 9.6),
        Check::new("Fig. 8, eight boxes, realistic GB/s (\"drops to 2.5\")", eight.realistic_mbs / 1000.0, 2.5)
            .noted("8 x 2 x 4 x 40 MB/s is 2.56 GB/s: cut, not rounded"),
        Check::new("Fig. 8, eight boxes, storage TB (\"8 X 10 X 200\")", eight.usable_tb, 16.0).noted(
            "slip: it says parity is excluded, but 8 x 10 x 200 GB counts the parity disks; 8 x 8 x 200 GB is 12.8 TB",
        ),
        Check::new("second channel, 8 x 350 MB/s, GB/s", second.delivered_mbs / 1000.0, 2.8),
        Check::new("second channel, 40 MB/s disks, GB/s", second.delivered_realistic_mbs / 1000.0, 2.8)
            .noted("the paper's \"penalty for slow disks more or less balanced\": the disks, not the 350 MB/s links, then set 2.56"),
        Check::new("second channel, storage TB", second.usable_tb, 16.0)
            .noted("the same slip as Fig. 8"),
    ]
}

/// What the paper says that its figures do not.
pub const PAPER_NOTES: [&str; 1] =
    ["\"the 30 MByte/s bandwidth of IB X12\": IB 12X carries 30 Gbit/s"];

/// `plan storage`: `spec`, then the paper's examples; `None` when a box of
/// `spec` has no room for a group.
pub fn report(spec: &Spec) -> Option<Report> {
    let mut rows = vec![("as asked".to_string(), *spec, spec.capacity()?)];
    for (name, s) in paper_examples() {
        rows.push((format!("paper: {name}"), s, s.capacity()?));
    }
    Some(Report::new(table(&rows), &rows).paper(paper(), &PAPER_NOTES))
}

/// The table a person reads: a row per macro-cluster.
pub fn table(rows: &[(String, Spec, Capacity)]) -> String {
    let mut s = format!(
        "{:<64} {:>5} {:>6} {:>6} {:>10} {:>10} {:>13} {:>13} {:>13}\n",
        "macro-cluster",
        "disks",
        "groups",
        "TB",
        "TB w/ par.",
        "theor. MB/s",
        "realistic MB/s",
        "link-capped",
        "capped real."
    );
    for (name, _, c) in rows {
        s += &format!(
            "{:<64} {:>5} {:>6} {:>6} {:>10} {:>10.0} {:>13.0} {:>13.0} {:>13.0}\n",
            name,
            c.disks,
            c.groups,
            crate::check::round(c.usable_tb),
            crate::check::round(c.group_raw_tb),
            c.theoretical_mbs,
            c.realistic_mbs,
            c.delivered_mbs,
            c.delivered_realistic_mbs
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_papers_examples_match_but_for_the_named_slips() {
        for c in paper() {
            assert!(c.agrees() || c.note.is_some(), "{c:?}");
        }
        let off: Vec<String> = paper()
            .into_iter()
            .filter(|c| !c.agrees())
            .map(|c| c.what)
            .collect();
        assert_eq!(
            off,
            [
                "Fig. 6, 200 GB disks, storage TB",
                "Fig. 7, one group, storage TB",
                "Fig. 7, two boxes, storage TB",
                "Fig. 7, two boxes, maximum GB/s (\"near to 3\")",
                "Fig. 8, eight boxes, realistic GB/s (\"drops to 2.5\")",
                "Fig. 8, eight boxes, storage TB (\"8 X 10 X 200\")",
                "second channel, 40 MB/s disks, GB/s",
                "second channel, storage TB",
            ]
        );
    }

    #[test]
    fn a_box_without_room_for_a_group_is_none() {
        let s = Spec {
            disks_per_box: 4,
            ..Spec::paper_box(1)
        };
        assert_eq!(s.capacity(), None);
        let all_spares = Spec {
            spares_per_box: 12,
            ..Spec::paper_box(1)
        };
        assert_eq!(all_spares.capacity(), None);
    }

    proptest! {
        #[test]
        fn more_boxes_hold_and_deliver_more(boxes in 1u32..100, link in 1.0f64..5000.0) {
            let spec = |b| Spec { link_mbs: Some(link), ..Spec::paper_box(b) };
            let (a, b) = (spec(boxes).capacity().unwrap(), spec(boxes + 1).capacity().unwrap());
            prop_assert!(b.usable_tb > a.usable_tb && b.theoretical_mbs > a.theoretical_mbs);
            prop_assert!(b.delivered_mbs >= a.delivered_mbs);
            prop_assert!(a.delivered_realistic_mbs <= a.realistic_mbs && a.realistic_mbs <= a.theoretical_mbs);
            prop_assert!(a.delivered_realistic_mbs <= a.delivered_mbs && a.delivered_mbs <= a.theoretical_mbs);
            prop_assert!(a.usable_tb < a.group_raw_tb);
        }
    }
}
