//! Any bytes into the management message decoder: an error or a message
//! that encodes back to the same bytes. Runs of messages (u16 length,
//! bytes) then go into the state machines they would reach: a local
//! manager's detector and lease, the central manager's epoch gate and
//! policy; none of them panics, whatever it is fed.
#![no_main]

use libfuzzer_sys::fuzz_target;
use macrolink_manage::detect::{DetectConfig, Detector};
use macrolink_manage::lease::{EpochGate, Lease, LeaseConfig};
use macrolink_manage::policy::{Observed, Order, Policy, PolicyConfig};
use macrolink_wire::manage::{Body, Message, OrderKind, Seen};

fuzz_target!(|data: &[u8]| {
    if let Ok(m) = Message::decode(data) {
        assert_eq!(m.encode().as_deref(), Some(data));
    }
    let groups = vec![("g".to_string(), (0..4).map(|i| format!("h{i}")).collect())];
    let mut policy = Policy::new(PolicyConfig::default(), &groups, None, 0);
    let mut gate = EpochGate::default();
    let mut det = Detector::new(4, DetectConfig::default(), 0);
    let mut lease = Lease::new(LeaseConfig::default(), true, 0);
    let (mut now, mut out, mut ev) = (0u64, Vec::new(), Vec::new());
    let mut rest = data;
    while rest.len() >= 2 {
        let n = usize::from(u16::from_le_bytes([rest[0], rest[1]])).min(rest.len() - 2);
        let (d, tail) = rest[2..].split_at(n);
        rest = tail;
        now += 50_000_000;
        det.poll(now, &mut out);
        lease.poll(now, &mut ev);
        let _ = policy.tick(now);
        let Ok(m) = Message::decode(d) else { continue };
        match m.body {
            Body::Ack { seq, member, .. } => {
                let _ = det.on_ack(member as usize, seq, &mut out);
            }
            Body::Beat { epoch, .. } => lease.on_beat(epoch, now, &mut ev),
            Body::Refused { epoch, .. } => lease.on_refused(epoch, now, &mut ev),
            Body::Report { epoch, host, seen, text, .. } => {
                let _ = gate.check(epoch, m.from);
                let seen = match seen {
                    Seen::Alive => Observed::Alive,
                    Seen::Suspect => Observed::Suspect,
                    Seen::Failed => Observed::Failed,
                    Seen::Unhealthy => Observed::Unhealthy(text.into()),
                    Seen::Unknown => Observed::Unknown(text.into()),
                };
                let _ = policy.observe(&format!("h{}", host % 5), seen, now);
            }
            Body::Order { host, order, text, .. } => {
                let order = match order {
                    OrderKind::Reset => Order::Reset,
                    OrderKind::Exclude => Order::Exclude,
                    OrderKind::Include => Order::Include,
                };
                let _ = policy.order(&format!("h{}", host % 5), order, text, now);
            }
            _ => {}
        }
        out.clear();
        ev.clear();
    }
});
