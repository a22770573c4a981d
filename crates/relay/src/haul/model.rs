//! How fast and how much to send over the long link: round-trip time and
//! delivery rate measured as BBR does (a windowed maximum of delivery-rate
//! samples, the minimum round trip), a send window of twice their product,
//! and a pacing rate. A rate or a window the cluster file sets replaces
//! the measured one.

use super::Nanos;

/// Pacing and window gain while the link's rate is being found.
const STARTUP_GAIN: f64 = 2.885;
/// Gain cycle once found: probe up, drain, cruise.
const CYCLE: [f64; 8] = [1.25, 0.75, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0];
/// Rounds the delivery-rate maximum is kept.
const BW_ROUNDS: usize = 10;
/// How long a minimum round trip counts.
const MIN_RTT_WINDOW: Nanos = 10_000_000_000;
/// Time at the link's rate a window holds at least.
const SCHEDULING_SLACK: Nanos = 2_000_000;
/// Round trip assumed before the first sample.
const INITIAL_RTT: Nanos = 1_000_000;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Startup,
    Drain,
    Cruise,
}

/// One delivery-rate sample (draft-cheng-iccrg-delivery-rate-estimation).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Sample {
    /// Bytes per second.
    pub rate: f64,
    /// Sent while there was less to send than the window allowed.
    pub app_limited: bool,
}

/// The sender's model of the link.
#[derive(Clone, Debug)]
pub(crate) struct Model {
    mss: u64,
    fixed_rate: Option<f64>,
    fixed_window: Option<u64>,
    phase: Phase,
    cwnd: u64,
    min_rtt: Option<(Nanos, Nanos)>,
    srtt: Option<Nanos>,
    rttvar: Nanos,
    bw: [f64; BW_ROUNDS],
    round: u64,
    full_bw: f64,
    full_bw_rounds: u32,
    cycle: usize,
    cycle_start: Nanos,
    round_lost: u64,
    round_lost_packets: u32,
    round_acked: u64,
    /// The latest rate sample was taken while the sender had too little
    /// to send: it says nothing of the link.
    app_limited: bool,
}

impl Model {
    pub fn new(mss: u64, fixed_rate: Option<f64>, fixed_window: Option<u64>) -> Model {
        Model {
            mss,
            fixed_rate,
            fixed_window,
            phase: Phase::Startup,
            cwnd: 32 * mss,
            min_rtt: None,
            srtt: None,
            rttvar: 0,
            bw: [0.0; BW_ROUNDS],
            round: 0,
            full_bw: 0.0,
            full_bw_rounds: 0,
            cycle: 0,
            cycle_start: 0,
            round_lost: 0,
            round_lost_packets: 0,
            round_acked: 0,
            app_limited: false,
        }
    }

    /// A round-trip sample, the receiver's ack delay taken off.
    pub fn rtt_sample(&mut self, now: Nanos, rtt: Nanos, ack_delay: Nanos) {
        let stale = self
            .min_rtt
            .is_none_or(|(m, at)| rtt <= m || now.saturating_sub(at) > MIN_RTT_WINDOW);
        if stale {
            self.min_rtt = Some((rtt, now));
        }
        let min = self.min_rtt.map_or(rtt, |m| m.0);
        let adjusted = if rtt >= min + ack_delay {
            rtt - ack_delay
        } else {
            rtt
        };
        match self.srtt {
            None => {
                self.srtt = Some(adjusted);
                self.rttvar = adjusted / 2;
            }
            Some(s) => {
                self.rttvar = (3 * self.rttvar + s.abs_diff(adjusted)) / 4;
                self.srtt = Some((7 * s + adjusted) / 8);
            }
        }
    }

    /// A new round trip began (the first packet sent after the previous
    /// round's start was acked).
    pub fn new_round(&mut self, now: Nanos) {
        self.round += 1;
        self.bw[self.round as usize % BW_ROUNDS] = 0.0;
        let (lost, acked) = (self.round_lost, self.round_acked);
        let lost_packets = self.round_lost_packets;
        (self.round_lost, self.round_acked, self.round_lost_packets) = (0, 0, 0);
        match self.phase {
            Phase::Startup if lost_packets >= 8 && lost * 50 > lost + acked => {
                // Many losses, more than 2 % of a round: the queue
                // overflowed (random loss rarely does both).
                self.phase = Phase::Drain;
            }
            Phase::Startup if self.app_limited => {}
            Phase::Startup => {
                let bw = self.bottleneck();
                if bw >= self.full_bw * 1.25 {
                    self.full_bw = bw;
                    self.full_bw_rounds = 0;
                } else {
                    self.full_bw_rounds += 1;
                    if self.full_bw_rounds >= 3 {
                        self.phase = Phase::Drain;
                    }
                }
            }
            Phase::Drain => {}
            Phase::Cruise => {
                if now.saturating_sub(self.cycle_start) >= self.min_rtt() {
                    self.cycle = (self.cycle + 1) % CYCLE.len();
                    self.cycle_start = now;
                }
            }
        }
    }

    /// Bytes declared lost.
    pub fn lost(&mut self, bytes: u64) {
        self.round_lost += bytes;
        self.round_lost_packets += 1;
    }

    /// A delivery-rate sample and the bytes newly acked.
    pub fn delivered(&mut self, sample: Option<Sample>, acked: u64, in_flight: u64, now: Nanos) {
        self.round_acked += acked;
        if let Some(s) = sample {
            self.app_limited = s.app_limited;
            if !s.app_limited || s.rate > self.bottleneck() {
                let slot = &mut self.bw[self.round as usize % BW_ROUNDS];
                *slot = slot.max(s.rate);
            }
        }
        if self.phase == Phase::Drain && in_flight <= self.bdp() {
            self.phase = Phase::Cruise;
            self.cycle = 2;
            self.cycle_start = now;
        }
        let target = self.target();
        self.cwnd = match self.phase {
            Phase::Startup if self.cwnd < target || self.bottleneck() <= 0.0 => {
                self.cwnd.saturating_add(acked)
            }
            Phase::Startup => self.cwnd,
            _ => self.cwnd.saturating_add(acked).min(target),
        };
    }

    /// Highest delivery rate of the last rounds, bytes per second.
    pub fn bottleneck(&self) -> f64 {
        self.bw.iter().copied().fold(0.0, f64::max)
    }

    /// Smallest round trip seen lately.
    pub fn min_rtt(&self) -> Nanos {
        self.min_rtt.map_or(INITIAL_RTT, |m| m.0)
    }

    /// Smoothed round trip.
    pub fn srtt(&self) -> Nanos {
        self.srtt.unwrap_or(INITIAL_RTT)
    }

    /// Variation of the round trip.
    pub fn rttvar(&self) -> Nanos {
        self.rttvar
    }

    fn rate(&self) -> f64 {
        self.fixed_rate.unwrap_or_else(|| self.bottleneck())
    }

    /// Bandwidth-delay product as measured (or set).
    pub fn bdp(&self) -> u64 {
        (self.rate() * self.min_rtt() as f64 / 1e9) as u64
    }

    /// Twice the bandwidth-delay product, but never less than the rate
    /// for [`SCHEDULING_SLACK`]: a relay is a process, and the time it waits
    /// for a processor is not in the round trip it measured.
    fn target(&self) -> u64 {
        let slack = (self.rate() * SCHEDULING_SLACK as f64 / 1e9) as u64;
        (2 * self.bdp()).max(slack).max(4 * self.mss)
    }

    /// Bytes that may be in flight.
    pub fn window(&self) -> u64 {
        if let Some(w) = self.fixed_window {
            return w;
        }
        if self.fixed_rate.is_some() && self.min_rtt.is_some() {
            return self.target();
        }
        self.cwnd
    }

    /// Bytes per second to pace at.
    pub fn pacing_rate(&self) -> f64 {
        if let Some(r) = self.fixed_rate {
            return r;
        }
        let bw = self.bottleneck();
        // While starting, never slower than the window per round trip: a
        // rate measured on a trickle (a handshake) must not hold it back.
        let window_rate = STARTUP_GAIN * self.cwnd as f64 * 1e9 / self.srtt() as f64;
        match self.phase {
            Phase::Startup => (STARTUP_GAIN * bw).max(window_rate),
            Phase::Drain => bw / STARTUP_GAIN,
            Phase::Cruise => CYCLE[self.cycle] * bw,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(rate: f64) -> Option<Sample> {
        Some(Sample {
            rate,
            app_limited: false,
        })
    }

    #[test]
    fn startup_ends_when_the_rate_stops_growing_and_the_window_settles_at_twice_the_bdp() {
        let mut m = Model::new(1000, None, None);
        m.rtt_sample(0, 10_000_000, 0);
        let mut now = 0;
        for rate in [1e6, 2e6, 4e6, 8e6, 8e6, 8e6, 8e6, 8e6] {
            now += 10_000_000;
            m.new_round(now);
            m.delivered(sample(rate), 10_000, 1_000_000, now);
        }
        assert_eq!(m.phase, Phase::Drain, "three rounds without growth");
        m.delivered(None, 0, 10_000, now);
        assert_eq!(m.phase, Phase::Cruise);
        assert_eq!(m.bdp(), 80_000);
        for _ in 0..100 {
            m.delivered(sample(8e6), 1_000_000, 10_000, now);
        }
        assert_eq!(m.window(), 160_000);
        assert!((m.pacing_rate() - 8e6).abs() < 1.0);
    }

    #[test]
    fn rounds_the_sender_had_too_little_to_send_do_not_end_startup() {
        let mut m = Model::new(1000, None, None);
        m.rtt_sample(0, 10_000_000, 0);
        for round in 1..10 {
            m.new_round(round * 10_000_000);
            let s = Sample {
                rate: 1e6,
                app_limited: true,
            };
            m.delivered(Some(s), 1000, 1000, round * 10_000_000);
        }
        assert_eq!(m.phase, Phase::Startup);
    }

    #[test]
    fn app_limited_samples_only_raise_the_estimate_and_a_fixed_rate_wins() {
        let mut m = Model::new(1000, None, None);
        m.delivered(sample(5e6), 0, 0, 0);
        m.delivered(
            Some(Sample {
                rate: 1e6,
                app_limited: true,
            }),
            0,
            0,
            0,
        );
        assert_eq!(m.bottleneck(), 5e6);
        let mut f = Model::new(1000, Some(125e6), None);
        f.rtt_sample(0, 20_000_000, 0);
        assert_eq!(f.pacing_rate(), 125e6);
        assert_eq!(f.window(), 2 * 2_500_000);
    }

    #[test]
    fn ack_delay_is_taken_off_but_never_below_the_minimum() {
        let mut m = Model::new(1000, None, None);
        m.rtt_sample(0, 10_000_000, 0);
        m.rtt_sample(1, 12_000_000, 1_000_000);
        assert_eq!(m.min_rtt(), 10_000_000);
        assert_eq!(m.srtt(), (7 * 10_000_000 + 11_000_000) / 8);
        m.rtt_sample(2, 10_500_000, 5_000_000);
        assert_eq!(m.min_rtt(), 10_000_000);
    }
}
