//! How an endpoint names its peers: targets (DP-II's `dp_target`), each on
//! a route (a connection's slot, or the UDP socket), and the connections
//! behind them, made by dialling or adopted from the node's acceptor.

use std::time::Duration;

use super::{lost, Conn, Endpoint, Route, Slot, TargetEntry};
use crate::error::{Error, Result};
use crate::transport::contact::{self, Dialled, RAIL_USER_TIMEOUT_MS};
use crate::types::{Addr, Mode, Recv, Target, Transport};

impl Endpoint {
    /// Makes a target for endpoint `to` in `mode` (DP-II's `dp_target`),
    /// choosing the transport: shared memory when `to`'s node is on this host,
    /// else tcp.
    pub fn target(&mut self, to: Addr, mode: Mode) -> Result<Target> {
        let transport = if self.node.shm_reaches(to.node) {
            Transport::Shm
        } else if self.node.tcp_peer(to.node).is_some() {
            Transport::Tcp
        } else if mode == Mode::Datagram && self.udp.is_some() {
            Transport::Udp
        } else {
            return Err(Error::Unreachable {
                node: to.node,
                transport: Transport::Tcp,
            });
        };
        self.target_via(to, mode, transport)
    }

    /// Makes a target for endpoint `to` in `mode` over `transport`.
    pub fn target_via(&mut self, to: Addr, mode: Mode, transport: Transport) -> Result<Target> {
        if let Some(t) = self.target_index.get(&(to, mode, transport)) {
            if self.route_alive(self.targets[t.0 as usize].route) {
                return Ok(*t);
            }
        }
        if transport == Transport::Udp && mode != Mode::Datagram {
            return Err(Error::Unsupported { transport, mode });
        }
        let route = match transport {
            Transport::Udp => {
                let me = self.addr();
                let udp = self.udp.as_mut().ok_or(Error::Unreachable {
                    node: to.node,
                    transport,
                })?;
                let route = match udp.learned(to) {
                    Some(sa) => Route::Udp(sa),
                    None => {
                        let sa = self.node.resolve_udp(me, to)?;
                        udp.learn(to, sa);
                        Route::Udp(sa)
                    }
                };
                self.udp_look.heat();
                route
            }
            Transport::Shm | Transport::Tcp | Transport::Ucx => {
                self.adopt_incoming();
                match self.find_conn(to, transport) {
                    Some(r) => r,
                    None => {
                        let link = self.node.connect(
                            self.addr(),
                            to,
                            transport,
                            self.inbox.token(),
                            self.ucx.as_ref().map(|p| p.contact_card()),
                        )?;
                        self.insert_conn(to, link, None)?
                    }
                }
            }
        };
        let t = self.add_target(to, mode, route);
        self.target_index.insert((to, mode, transport), t);
        Ok(t)
    }

    pub(super) fn add_target(&mut self, peer: Addr, mode: Mode, route: Route) -> Target {
        let t = Target(self.targets.len() as u32);
        self.targets.push(TargetEntry { peer, mode, route });
        t
    }

    /// A target for `to` in `mode` over a connection this endpoint already
    /// has to it, of whatever transport, if any: to answer a peer the way
    /// it came.
    pub fn connected_target(&mut self, to: Addr, mode: Mode) -> Option<Target> {
        self.adopt_incoming();
        let (transport, route) = self.slots.iter().enumerate().find_map(|(i, s)| {
            let c = s
                .conn
                .as_ref()
                .filter(|c| c.peer == to && c.rail.is_none())?;
            let route = Route::Conn {
                slot: i as u32,
                gen: s.gen,
            };
            Some((c.link.transport(), route))
        })?;
        if let Some(t) = self.target_index.get(&(to, mode, transport)) {
            if self.targets[t.0 as usize].route == route {
                return Some(*t);
            }
        }
        let t = self.add_target(to, mode, route);
        self.target_index.insert((to, mode, transport), t);
        Some(t)
    }

    /// A target that answers `r` over the connection it came in on (the
    /// same rail, when a peer reaches this endpoint over several); falls
    /// back to [`target_via`](Self::target_via) once that connection is gone.
    pub fn reply_target(&mut self, r: &Recv, mode: Mode) -> Result<Target> {
        if let Some((slot, gen)) = r.via.filter(|_| mode != Mode::Datagram) {
            let route = Route::Conn { slot, gen };
            if self.route_alive(route) {
                if let Some(t) = self.reply_index.get(&(slot, gen, mode)) {
                    return Ok(*t);
                }
                let t = self.add_target(r.from, mode, route);
                self.reply_index.insert((slot, gen, mode), t);
                return Ok(t);
            }
        }
        self.target_via(r.from, mode, r.transport)
    }

    /// Makes a TCP target for `to` through the remote address `addr`: one
    /// rail of several links to the same peer (link aggregation). Each
    /// address gets a connection of its own, which fails with
    /// [`Error::PeerLost`] when its link stays dark for
    /// [`RAIL_USER_TIMEOUT_MS`].
    pub fn target_at(
        &mut self,
        to: Addr,
        mode: Mode,
        addr: std::net::SocketAddr,
    ) -> Result<Target> {
        if mode == Mode::Datagram {
            return Err(Error::Unsupported {
                transport: Transport::Tcp,
                mode,
            });
        }
        if let Some(t) = self.rail_index.get(&(to, mode, addr)) {
            if self.route_alive(self.targets[t.0 as usize].route) {
                return Ok(*t);
            }
        }
        let found = self.slots.iter().enumerate().find_map(|(i, s)| {
            s.conn
                .as_ref()
                .filter(|c| c.peer == to && c.rail == Some(addr))
                .map(|_| Route::Conn {
                    slot: i as u32,
                    gen: s.gen,
                })
        });
        let route = match found {
            Some(r) => r,
            None => {
                // A rail whose link is dark must fail soon, so that its
                // traffic moves to the others: short dial, user timeout.
                let dial = Duration::from_millis(u64::from(RAIL_USER_TIMEOUT_MS) / 4);
                let rail = Some(RAIL_USER_TIMEOUT_MS);
                let link = self.node.connect_tcp_within(
                    self.addr(),
                    to,
                    addr,
                    dial,
                    rail,
                    self.inbox.token(),
                )?;
                self.insert_conn(to, link, Some(addr))?
            }
        };
        let t = self.add_target(to, mode, route);
        self.rail_index.insert((to, mode, addr), t);
        Ok(t)
    }

    pub(super) fn route_alive(&self, r: Route) -> bool {
        match r {
            Route::Udp(_) => true,
            Route::Conn { slot, gen } => {
                let s = &self.slots[slot as usize];
                s.gen == gen && s.conn.is_some()
            }
        }
    }

    pub(super) fn find_conn(&self, to: Addr, transport: Transport) -> Option<Route> {
        self.slots.iter().enumerate().find_map(|(i, s)| {
            s.conn
                .as_ref()
                .filter(|c| c.peer == to && c.link.transport() == transport)
                .map(|_| Route::Conn {
                    slot: i as u32,
                    gen: s.gen,
                })
        })
    }

    /// Makes a connection of `link` to `peer` in a free slot.
    pub(super) fn insert_conn(
        &mut self,
        peer: Addr,
        link: Dialled,
        rail: Option<std::net::SocketAddr>,
    ) -> Result<Route> {
        let i = match self.slots.iter().position(|s| s.conn.is_none()) {
            Some(i) => i,
            None => {
                self.slots.push(Slot::default());
                self.slots.len() - 1
            }
        };
        let gen = self.slots[i].gen.wrapping_add(1);
        let mut link = link.connect(peer, (i as u32, gen), self.ucx.as_mut())?;
        let started = self.waits.add(i, link.read_fd(), link.read_edge())?;
        link.watched(self.waits.watching());
        let s = &mut self.slots[i];
        s.gen = gen;
        s.conn = Some(Conn {
            peer,
            rail,
            tx_seq: 0,
            link,
        });
        if started {
            self.rewatch();
        }
        Ok(Route::Conn {
            slot: i as u32,
            gen,
        })
    }

    #[inline]
    pub(super) fn adopt_incoming(&mut self) {
        if self.inbox.stirred() {
            self.adopt();
        }
    }

    pub(super) fn adopt(&mut self) {
        self.inbox.take(&mut self.incoming);
        if let Some(d) = &self.dock {
            contact::collect(
                d,
                &self.node,
                self.id,
                self.inbox.serial,
                &mut self.incoming,
            );
        }
        while let Some(inc) = self.incoming.pop() {
            // Accepted before the endpoint was bound to a session?
            if self.inbox.admits(inc.peer, None) {
                if let Err(e) = self.insert_conn(inc.peer, inc.link, None) {
                    tracing::warn!(peer = %inc.peer, "cannot take a connection: {e}");
                }
            }
        }
    }

    /// What is kept for a connection that is gone: regions it may write
    /// into, and its place in the UCX worker.
    pub(super) fn forget_conn(&mut self, slot: u32, gen: u32) {
        self.core.regions.released(None, slot, gen);
        if let Some(p) = self.ucx.as_mut() {
            p.forget(slot, gen);
        }
    }

    pub(super) fn entry(&self, t: Target) -> Result<TargetEntry> {
        // Not `ok_or`: an error made and dropped on every send.
        match self.targets.get(t.0 as usize) {
            Some(e) => Ok(*e),
            None => Err(Error::BadTarget),
        }
    }

    pub(super) fn conn_mut(&mut self, peer: Addr, slot: u32, gen: u32) -> Result<&mut Conn> {
        match self.slots.get_mut(slot as usize) {
            Some(s) if s.gen == gen => s.conn.as_mut().ok_or_else(|| lost(peer)),
            _ => Err(lost(peer)),
        }
    }
}
