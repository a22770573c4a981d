//! Which of `compare`'s groups of rows a run makes (`--only`), and how
//! many pairs its alternated latency rows run (`--pairs`): a whole run
//! takes some ten minutes, one group a minute or two, and a row's verdict
//! on more pairs stands on more than the few a whole run can afford.

use std::fmt;
use std::str::FromStr;

/// A group of rows, run together (one peer, one set of sessions).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Group {
    /// Shared memory beside UCX: the 8 B ping-pong and the puts.
    Shm,
    /// Tcp bandwidth beside iperf3, and ours over tcp beside ucx_perftest.
    TcpBw,
    /// Tcp ping-pongs of 64 B beside sockperf, and their floors.
    Tcp,
    /// Udp ping-pongs of 64 B beside sockperf, and their floors.
    Udp,
    /// Ours over UCX (shared memory, then tcp) beside ucx_perftest.
    Ucx,
    /// Large reliable messages to a waiting reader, beside UCX's sleeping
    /// mode.
    Waiting,
    /// The waiting target's and initiator's CPU at 1 MB.
    Cpu,
}

impl Group {
    /// Every group, in the order a run makes them.
    pub const ALL: [Group; 7] = [
        Group::Shm,
        Group::TcpBw,
        Group::Tcp,
        Group::Udp,
        Group::Ucx,
        Group::Waiting,
        Group::Cpu,
    ];

    /// Its name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Group::Shm => "shm",
            Group::TcpBw => "tcp-bw",
            Group::Tcp => "tcp",
            Group::Udp => "udp",
            Group::Ucx => "ucx",
            Group::Waiting => "waiting",
            Group::Cpu => "cpu",
        }
    }

    /// Every group's name, in order.
    pub fn names() -> [&'static str; 7] {
        Group::ALL.map(Group::name)
    }

    fn bit(self) -> u8 {
        1 << (self as u8)
    }
}

impl fmt::Display for Group {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Group {
    type Err = String;

    fn from_str(s: &str) -> Result<Group, String> {
        Group::ALL
            .into_iter()
            .find(|g| g.name() == s)
            .ok_or_else(|| {
                format!(
                    "no group of rows is called {s:?}: one of {}",
                    Group::names().join(", ")
                )
            })
    }
}

/// The groups a run makes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Groups(u8);

impl Groups {
    /// Every group: a whole run.
    pub fn all() -> Groups {
        Groups::of(&Group::ALL)
    }

    /// `these`, or every group where none is named.
    pub fn of(these: &[Group]) -> Groups {
        if these.is_empty() {
            return Groups::all();
        }
        Groups(these.iter().fold(0, |b, g| b | g.bit()))
    }

    /// Whether the run makes `g`.
    pub fn has(self, g: Group) -> bool {
        self.0 & g.bit() != 0
    }
}

/// Fewest pairs a latency row may run: with fewer, the median of each
/// side is one run.
pub const FEWEST_PAIRS_ASKED: usize = 3;
/// Most pairs a latency row may run (it may run up to three times as
/// many looking for pairs of one placement).
pub const MOST_PAIRS_ASKED: usize = 99;

/// The pairs a row runs: `asked` (within [`FEWEST_PAIRS_ASKED`] and
/// [`MOST_PAIRS_ASKED`]) where given, else the row's own number.
pub fn pairs(asked: Option<usize>, own: usize) -> usize {
    asked.map_or(own, |n| n.clamp(FEWEST_PAIRS_ASKED, MOST_PAIRS_ASKED))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_group_is_named_as_on_the_command_line_and_a_wrong_name_lists_them_all() {
        for g in Group::ALL {
            assert_eq!(g.name().parse::<Group>(), Ok(g));
        }
        let e = "sockets".parse::<Group>().unwrap_err();
        assert!(e.contains("\"sockets\""), "{e}");
        assert!(
            e.contains("shm, tcp-bw, tcp, udp, ucx, waiting, cpu"),
            "{e}"
        );
    }

    #[test]
    fn the_groups_named_are_run_and_none_named_means_every_one() {
        let some = Groups::of(&[Group::Udp, Group::Cpu]);
        for g in Group::ALL {
            assert_eq!(some.has(g), matches!(g, Group::Udp | Group::Cpu), "{g}");
            assert!(Groups::of(&[]).has(g), "{g}");
            assert!(Groups::all().has(g), "{g}");
        }
        assert_eq!(
            Groups::of(&[Group::Tcp, Group::Tcp]),
            Groups::of(&[Group::Tcp])
        );
    }

    #[test]
    fn pairs_asked_are_kept_within_bounds_and_none_asked_leaves_the_rows_own() {
        assert_eq!(pairs(None, 5), 5);
        assert_eq!(pairs(Some(21), 5), 21);
        assert_eq!(pairs(Some(1), 9), FEWEST_PAIRS_ASKED);
        assert_eq!(pairs(Some(0), 9), FEWEST_PAIRS_ASKED);
        assert_eq!(pairs(Some(10_000), 5), MOST_PAIRS_ASKED);
    }
}
