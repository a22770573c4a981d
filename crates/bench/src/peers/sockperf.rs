//! sockperf: ping-pong latency over TCP or UDP sockets, blocking or busy
//! polling.

use anyhow::Context;
use std::process::Command;
use std::time::Duration;

use super::resident::Resident;
use super::{free_port, output, Latency, Server, Tool};

/// The tool.
pub const TOOL: Tool = Tool {
    program: "sockperf",
    package: "sockperf",
};

/// How both sides wait for a message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Regime {
    /// Blocking sockets, woken by the kernel (sockperf's default).
    Blocking,
    /// Non-blocking sockets polled without sleeping on both sides
    /// (`--nonblocked`, `--mps=max`): the regime of a polling endpoint.
    BusyPoll,
}

impl Regime {
    /// sockperf's words for it, for a row's label.
    pub fn flags(self) -> &'static str {
        match self {
            Regime::Blocking => "blocking",
            Regime::BusyPoll => "--nonblocked --mps=max",
        }
    }

    fn args(self, client: bool) -> &'static [&'static str] {
        match (self, client) {
            (Regime::Blocking, _) => &[],
            (Regime::BusyPoll, false) => &["--nonblocked"],
            (Regime::BusyPoll, true) => &["--nonblocked", "--mps=max"],
        }
    }
}

/// What sockperf leaves out of its figures at a run's start (its default
/// `--pre-warmup-wait` and warm-up: "Warm up time=400 msec").
pub const WARM_UP: Duration = Duration::from_millis(400);

/// How long [`ping_pong`] runs for: `secs` rounded up to whole seconds
/// (sockperf's `-t`), one at least.
fn run_secs(secs: f64) -> f64 {
    secs.ceil().max(1.0)
}

/// The stretch of a [`ping_pong`] of `secs` seconds that its figures are
/// of: its run less its warm-up.
pub fn counted(secs: f64) -> Duration {
    Duration::from_secs_f64(run_secs(secs)).saturating_sub(WARM_UP)
}

/// Ping-pong latency (half round trip) of `size`-byte messages over UDP
/// or TCP on loopback, for `secs` seconds, both sides in `regime`, with
/// one thread more asleep in each of sockperf's processes where
/// `resident` is given (see [`Resident`]).
pub fn ping_pong(
    udp: bool,
    size: usize,
    secs: f64,
    regime: Regime,
    resident: Option<&Resident>,
) -> anyhow::Result<Latency> {
    let port = free_port()?.to_string();
    let proto: &[&str] = if udp { &[] } else { &["--tcp"] };
    let preload = |cmd: &mut Command| {
        if let Some(r) = resident {
            r.preload(cmd);
        }
    };
    let mut server = Command::new(TOOL.program);
    server
        .arg("sr")
        .args(proto)
        .args(regime.args(false))
        .args(["-i", "127.0.0.1", "-p", &port]);
    preload(&mut server);
    let _server = Server::start(&mut server, Duration::from_millis(400))?;
    let mut client = Command::new(TOOL.program);
    client
        .arg("pp")
        .args(proto)
        .args(regime.args(true))
        .args(["-i", "127.0.0.1", "-p", &port, "-m", &size.to_string()])
        .args(["-t", &format!("{}", run_secs(secs))]);
    preload(&mut client);
    let out = output(&mut client, Duration::from_secs(60))?;
    parse(&out).with_context(|| format!("sockperf said: {out}"))
}

/// The 50th and 99th percentile lines of sockperf's report.
pub fn parse(out: &str) -> Option<Latency> {
    let at = |p: &str| {
        out.lines()
            .find(|l| l.contains(&format!("percentile {p} ")))
            .and_then(|l| l.rsplit('=').next())
            .and_then(|v| v.trim().parse().ok())
    };
    Some(Latency {
        median: at("50.000")?,
        p99: at("99.000")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_counts_its_whole_seconds_less_the_warm_up() {
        assert_eq!(counted(2.0), Duration::from_millis(1600));
        assert_eq!(
            counted(1.2),
            Duration::from_millis(1600),
            "-t takes whole seconds"
        );
        assert_eq!(
            counted(0.1),
            Duration::from_millis(600),
            "one second at least"
        );
    }

    #[test]
    fn the_median_and_p99_are_read() {
        let s = "sockperf: ---> percentile 99.900 =   20.100\n\
                 sockperf: ---> percentile 99.000 =   14.250\n\
                 sockperf: ---> percentile 75.000 =   11.276\n\
                 sockperf: ---> percentile 50.000 =   10.313\n";
        assert_eq!(
            parse(s),
            Some(Latency {
                median: 10.313,
                p99: 14.25
            })
        );
        assert_eq!(parse("sockperf: ---> percentile 50.000 = 1.0\n"), None);
        assert_eq!(parse("nothing"), None);
    }

    /// sockperf is installed wherever the tests run (`.ci/run`). With a
    /// thread asleep preloaded into both of its processes it still runs
    /// and reports both percentiles.
    #[test]
    fn a_run_with_a_thread_asleep_reports_its_percentiles() {
        let r = Resident::new().unwrap();
        for udp in [true, false] {
            let l = ping_pong(udp, 64, 1.0, Regime::Blocking, Some(&r)).unwrap();
            assert!(l.median > 0.0 && l.median.is_finite(), "{l:?}");
            assert!(l.p99 >= l.median, "{l:?}");
        }
    }

    #[test]
    fn busy_polling_is_asked_of_both_sides() {
        assert!(Regime::BusyPoll.args(false).contains(&"--nonblocked"));
        assert!(Regime::BusyPoll.args(true).contains(&"--mps=max"));
        assert!(Regime::Blocking.args(true).is_empty());
    }
}
