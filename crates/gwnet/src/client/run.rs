//! One striped transfer's loop state: its connections to the gateways
//! ([`Gateways`]) and what it hears and decides ([`Run`]), apart from the
//! loop that drives them (`client::stripe`).

use macrolink_fabric::{clock_ns, Addr, Endpoint, Error, Mode, Result, Target, Transport};
use macrolink_gateway::health::{Health, HealthEvent};
use macrolink_gateway::heard::Watch;
use macrolink_gateway::lanes::Lanes;
use macrolink_gateway::msg::Msg;
use macrolink_gateway::stripe::Striper;
use macrolink_manage::excluded::Excluded;
use std::time::Duration;

/// The connections of one transfer to its gateways; the decisions about
/// them are [`Lanes`]'.
pub(super) struct Gateways {
    pub(super) addrs: Vec<Addr>,
    pub(super) transport: Transport,
    pub(super) targets: Vec<Option<Target>>,
    pub(super) lanes: Lanes,
    /// Taken out of use because the central manager excluded them.
    pub(super) fenced: Vec<bool>,
}

impl Gateways {
    pub(super) fn index(&self, a: Addr) -> Option<usize> {
        self.addrs.iter().position(|g| *g == a)
    }

    /// Takes `gw` out of use (for the striper, and for heartbeats when
    /// `health` is given) and forgets its connection.
    pub(super) fn down(&mut self, gw: usize, striper: &mut Striper, health: Option<&mut Health>) {
        if let Some(h) = health {
            h.mark_down(gw);
        }
        if self.lanes.down(gw, clock_ns(), striper) {
            self.targets[gw] = None;
            tracing::info!("gateway {} out of use", self.addrs[gw]);
        }
    }

    /// Takes the gateways `excluded` names out of use, once per change of
    /// the set (`seen` is the generation last acted on). They stay out for
    /// this transfer.
    pub(super) fn fence(
        &mut self,
        excluded: Option<&Excluded>,
        seen: &mut u64,
        striper: &mut Striper,
    ) {
        let Some(x) = excluded else { return };
        let g = x.generation();
        if g == *seen {
            return;
        }
        *seen = g;
        for gw in 0..self.addrs.len() {
            if x.contains(self.addrs[gw].node) && self.lanes.down(gw, clock_ns(), striper) {
                self.targets[gw] = None;
                self.fenced[gw] = true;
                tracing::info!(
                    "gateway {} excluded by the central manager: out of use",
                    self.addrs[gw]
                );
            }
        }
    }

    /// The connection to `gw`, dialled if there is none and the last
    /// attempt is long enough ago.
    pub(super) fn target(&mut self, ep: &mut Endpoint, gw: usize) -> Option<Target> {
        let now = clock_ns();
        if self.targets[gw].is_none() && !self.fenced[gw] && self.lanes.may_dial(gw, now) {
            self.targets[gw] = ep
                .target_via(self.addrs[gw], Mode::Reliable, self.transport)
                .ok();
            if self.targets[gw].is_none() {
                self.lanes.dial_failed(gw, now);
            }
        }
        self.targets[gw]
    }
}

/// Messages read in one pass of a transfer's loop at most, before it
/// judges its gateways and sends again.
const MAX_READS: usize = 64;

/// One striped transfer's state apart from its endpoint: what its loop
/// hears and decides.
pub(super) struct Run {
    pub(super) transfer: u64,
    pub(super) striper: Striper,
    pub(super) health: Health,
    pub(super) gws: Gateways,
    /// What the other transfers of this process hear from the gateways,
    /// and have in flight through them.
    pub(super) watch: Option<Watch>,
    pub(super) events: Vec<HealthEvent>,
    pub(super) acked: u64,
    pub(super) last_ack: u64,
    /// Longest time between acknowledgements.
    pub(super) longest: u64,
}

impl Run {
    /// Reads what has arrived, waiting up to `wait` for the first message
    /// and taking at most [`MAX_READS`] (the rest wait for the next pass),
    /// and hears each.
    pub(super) fn read_inbox(
        &mut self,
        ep: &mut Endpoint,
        buf: &mut [u8],
        wait: Duration,
    ) -> Result<()> {
        for i in 0..MAX_READS {
            let got = if i == 0 {
                ep.read_timeout(buf, wait)
            } else {
                ep.try_read(buf)
            };
            match got {
                Ok(Some(r)) => self.take(&buf[..r.len], r.from),
                Ok(None) => return Ok(()),
                Err(Error::PeerLost { peer, .. }) => {
                    if let Some(gw) = self.gws.index(peer) {
                        self.gws.down(gw, &mut self.striper, Some(&mut self.health));
                    }
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Tells the other transfers that `gw` was heard from at `now`, if this
    /// transfer has it in use: what it hears from one it took out of use
    /// (an acknowledgement of a chunk that passed before it failed, an old
    /// answer) says nothing of now.
    fn publish(&mut self, gw: usize, now: u64) {
        if let Some(w) = self.watch.as_mut().filter(|_| self.health.is_up(gw)) {
            w.hear(gw, now);
        }
    }

    /// Tells the other transfers how many chunks this one has in flight
    /// through each gateway, and the striper how many they have: the
    /// window at each gateway is theirs and this one's together.
    pub(super) fn share(&mut self) {
        let Some(w) = &mut self.watch else { return };
        for gw in 0..self.gws.addrs.len() {
            w.fly(gw, self.striper.in_flight(gw));
            self.striper.set_others(gw, w.others(gw));
        }
    }

    /// Hears one message from `from`.
    fn take(&mut self, msg: &[u8], from: Addr) {
        match Msg::decode(msg) {
            Ok(Msg::Pong { seq }) => {
                if let Some(gw) = self.gws.index(from) {
                    self.health.on_reply(gw, seq, &mut self.events);
                    self.publish(gw, clock_ns());
                }
            }
            Ok(Msg::Ack { transfer, seq, .. }) if transfer == self.transfer => {
                let now = clock_ns();
                // The gateway it went through forwards: as good as an
                // answered heartbeat (which may wait behind chunks), and
                // how long it took says how long a heartbeat may wait.
                if let Some((gw, at)) = self.striper.sent_via(seq) {
                    self.health.heard(gw);
                    self.health.trip(gw, now.saturating_sub(at));
                    self.publish(gw, now);
                }
                self.striper.on_ack(seq, now);
                self.acked += 1;
                self.longest = self.longest.max(now - self.last_ack);
                self.last_ack = now;
            }
            _ => {}
        }
    }

    /// Heartbeats due, and gateways found down or back.
    pub(super) fn judge(&mut self, ep: &mut Endpoint, now: u64, head: &mut Vec<u8>) {
        if let Some(w) = &mut self.watch {
            w.news(&mut self.health);
        }
        // The answers just read may have left an Up in `events`: keep it.
        self.health.poll(now, &mut self.events);
        let (gws, striper, health) = (&mut self.gws, &mut self.striper, &mut self.health);
        for e in self.events.drain(..) {
            match e {
                HealthEvent::Probe { gw, seq } => {
                    head.clear();
                    Msg::Ping { seq }.encode(head);
                    if let Some(t) = gws.target(ep, gw) {
                        if ep.write(t, head).is_err() {
                            gws.down(gw, striper, Some(health));
                        }
                    }
                }
                HealthEvent::Down(gw) => gws.down(gw, striper, None),
                // Unless a loss read after the answer took it down again.
                HealthEvent::Up(gw) if health.is_up(gw) => {
                    if gws.lanes.is_down(gw)
                        && gws.target(ep, gw).is_some()
                        && gws.lanes.up(gw, striper)
                    {
                        tracing::info!("gateway {} back in use", gws.addrs[gw]);
                    }
                }
                HealthEvent::Up(_) => {}
            }
        }
    }
}
