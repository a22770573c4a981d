//! What a relay counts, for Prometheus (`macrolink relay --metrics`): the
//! relay's [`Report`] so far, brought up to date once a second while it
//! runs.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::Report;

/// A relay's counters; clones share them.
#[derive(Clone, Debug, Default)]
pub struct Meter {
    flows_out: Counter,
    flows_in: Counter,
    resets: Counter,
    refused: Counter,
    bad_tags: Counter,
    peer_lost: Counter,
    packets_sent: Counter,
    packets_received: Counter,
    bytes_sent: Counter,
    bytes_resent: Counter,
    datagrams_out: Counter,
    datagrams_in: Counter,
    datagrams_dropped: Counter,
    bad_datagrams: Counter,
    flows_open: Gauge,
    min_rtt_us: Gauge,
    rate_kb_s: Gauge,
    /// The report the counters last took.
    last: std::sync::Arc<std::sync::Mutex<Report>>,
}

impl Meter {
    /// Registers every counter in `r`.
    pub fn register(&self, r: &mut Registry) {
        let counters = [
            ("flows_out", "Flows opened by near hosts", &self.flows_out),
            ("flows_in", "Flows opened by the peer relay", &self.flows_in),
            ("resets", "Flows ended abruptly", &self.resets),
            (
                "refused",
                "Near connections refused at a limit",
                &self.refused,
            ),
            (
                "bad_tags",
                "Long-link datagrams without the cluster's seal",
                &self.bad_tags,
            ),
            (
                "peer_lost",
                "Times the peer relay was lost",
                &self.peer_lost,
            ),
            (
                "packets_sent",
                "Packets sent on the long link",
                &self.packets_sent,
            ),
            (
                "packets_received",
                "Packets taken from the long link",
                &self.packets_received,
            ),
            (
                "bytes_sent",
                "Payload bytes sent on the long link, resends included",
                &self.bytes_sent,
            ),
            (
                "bytes_resent",
                "Payload bytes sent again",
                &self.bytes_resent,
            ),
            (
                "datagrams_out",
                "Datagrams of near hosts sent on the long link",
                &self.datagrams_out,
            ),
            (
                "datagrams_in",
                "Datagrams from the long link delivered to near hosts",
                &self.datagrams_in,
            ),
            (
                "datagrams_dropped",
                "Datagrams dropped: a queue full, too large, or for an endpoint not known",
                &self.datagrams_dropped,
            ),
            (
                "bad_datagrams",
                "Datagrams refused: not of the fabric, or not from this segment",
                &self.bad_datagrams,
            ),
        ];
        for (name, help, c) in counters {
            r.register(name, help, c.clone());
        }
        r.register("flows_open", "Flows open now", self.flows_open.clone());
        r.register(
            "min_rtt_us",
            "Smallest round trip seen, microseconds",
            self.min_rtt_us.clone(),
        );
        r.register(
            "rate_kb_s",
            "Delivery rate measured, kB/s",
            self.rate_kb_s.clone(),
        );
    }

    /// Takes `now`, the report so far, and `open` flows.
    pub fn update(&self, now: &Report, open: usize) {
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        let pairs = [
            (&self.flows_out, now.flows_out, last.flows_out),
            (&self.flows_in, now.flows_in, last.flows_in),
            (&self.resets, now.resets, last.resets),
            (&self.refused, now.refused, last.refused),
            (&self.bad_tags, now.bad_tags, last.bad_tags),
            (&self.peer_lost, now.peer_lost, last.peer_lost),
            (&self.packets_sent, now.packets_sent, last.packets_sent),
            (
                &self.packets_received,
                now.packets_received,
                last.packets_received,
            ),
            (&self.bytes_sent, now.bytes_sent, last.bytes_sent),
            (&self.bytes_resent, now.bytes_resent, last.bytes_resent),
            (&self.datagrams_out, now.datagrams_out, last.datagrams_out),
            (&self.datagrams_in, now.datagrams_in, last.datagrams_in),
            (
                &self.datagrams_dropped,
                now.datagrams_dropped,
                last.datagrams_dropped,
            ),
            (&self.bad_datagrams, now.bad_datagrams, last.bad_datagrams),
        ];
        for (c, n, l) in pairs {
            c.inc_by(n.saturating_sub(l));
        }
        self.flows_open.set(open as i64);
        self.min_rtt_us.set(now.min_rtt_us as i64);
        self.rate_kb_s.set((now.measured_mb_s * 1e3) as i64);
        *last = *now;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_add_what_the_report_added_since_last_time() {
        let m = Meter::default();
        let mut r = Registry::with_prefix("relay");
        m.register(&mut r);
        let mut rep = Report {
            bytes_sent: 100,
            flows_out: 1,
            ..Report::default()
        };
        m.update(&rep, 1);
        rep.bytes_sent = 250;
        m.update(&rep, 0);
        let text = macrolink_metrics::encode(&r);
        assert!(text.contains("relay_bytes_sent_total 250"), "{text}");
        assert!(text.contains("relay_flows_out_total 1"), "{text}");
        assert!(text.contains("relay_flows_open 0"), "{text}");
    }
}
