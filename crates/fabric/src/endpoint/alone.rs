//! A polling read of an endpoint that has one source to look at: its UDP
//! socket, or its one connection (with the UCX worker that carries it,
//! when it is a UCX one). The general pass looks at the UCX worker, the
//! UDP socket, every connection and the control frames each time, some
//! tens of nanoseconds a pass more than the one look a busy polling
//! socket program makes, or UCX's own progress loop; a message arriving
//! meanwhile waits on the average for half of that. So a read with one
//! source looks at it alone, one look after another, and hands anything
//! but a message for the reader (a connection coming in, a message
//! staged, a control frame to answer, a part of a long message) to the
//! general pass.

use std::time::Instant;

use super::{Deadline, Endpoint, HOT_SPINS};
use crate::error::{Error, Result};
use crate::rx::Step;
use crate::transport::offer::PLACE_MIN;
use crate::types::{Completion, Mode, Recv, RecvKind};

/// What a read may look at alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum One {
    /// The UDP socket: datagrams are in use, and there is neither a
    /// connection nor a UCX worker.
    Udp,
    /// The connection at this slot, the only one; before it, the UCX
    /// worker (if the endpoint has one), and the UDP socket (not in use)
    /// when its turn comes, in the general pass's order.
    Conn(usize),
}

/// What a read of one source alone came to.
pub(super) enum Alone {
    /// A message, or `None`: the deadline came.
    Read(Option<Recv>),
    /// Something the general pass takes care of.
    General,
}

impl One {
    /// The connection looked at.
    fn conn(self) -> Option<usize> {
        match self {
            One::Udp => None,
            One::Conn(i) => Some(i),
        }
    }
}

/// Idle looks between reads of the clock for the deadline (as the
/// general pass reads it).
const DEADLINE_EVERY: u32 = 256;

impl Endpoint {
    /// The one source a read may look at alone, if it has one: it polls,
    /// has nothing queued, no control frame to send, no probe, and no wait
    /// set watching. Asked once a read.
    pub(super) fn one_source(&self) -> Option<One> {
        if self.core.completion != Completion::Poll
            || self.core.probe
            || self.watching
            || !self.core.ready.is_empty()
            || self.core.ctrl_queued != 0
        {
            return None;
        }
        if self.udp.is_some() && self.udp_look.hot() {
            let none = self.ucx.is_none() && self.slots.iter().all(|s| s.conn.is_none());
            return none.then_some(One::Udp);
        }
        self.only_conn().map(One::Conn)
    }

    /// Looks at `one` alone until a message is delivered, the deadline
    /// comes, or [`HOT_SPINS`] idle looks have gone by since the last
    /// traffic (the general pass then spins on, pausing between passes).
    pub(super) fn read_alone(
        &mut self,
        one: One,
        buf: &mut [u8],
        deadline: Deadline,
    ) -> Result<Alone> {
        loop {
            // A connection coming in: the general pass adopts it.
            if self.inbox.stirred() {
                return Ok(Alone::General);
            }
            let step = match one {
                One::Udp => match self.udp.as_mut() {
                    Some(udp) => udp.look(&mut self.core, &self.inbox, Some(&mut *buf))?,
                    None => return Ok(Alone::General),
                },
                One::Conn(i) => {
                    // The UCX worker first, as in the general pass: what it
                    // holds for the connection goes ahead of a loss the
                    // connection's look may find.
                    if let Some(port) = self.ucx.as_mut() {
                        match port.progress(&mut self.core, Some(&mut *buf), &mut self.slots) {
                            Step::Idle => {}
                            Step::Delivered => return Ok(self.delivered_alone(None)),
                            Step::TooSmall(needed) => {
                                return Err(Error::BufferTooSmall {
                                    needed: needed as usize,
                                    have: buf.len(),
                                })
                            }
                            _ => return Ok(Alone::General),
                        }
                    }
                    // The UDP socket not in use is looked at as the general
                    // pass does, before the connection: a steady stream over
                    // it does not keep a first datagram waiting.
                    match self.udp_pass(Some(&mut *buf))? {
                        Step::Idle => {}
                        Step::Delivered => return Ok(self.delivered_alone(None)),
                        _ => return Ok(Alone::General),
                    }
                    match self.slots[i].conn.as_mut() {
                        Some(c) => c.link.progress(&mut self.core, Some(&mut *buf)),
                        None => return Ok(Alone::General),
                    }
                }
            };
            let r = match (step, one) {
                (Step::Idle, _) => {
                    self.idle_spins += 1;
                    if self.idle_spins >= HOT_SPINS {
                        return Ok(Alone::General);
                    }
                    if self.idle_spins.is_multiple_of(DEADLINE_EVERY) {
                        if let Deadline::At(t) = deadline {
                            if Instant::now() >= t {
                                return Ok(Alone::Read(None));
                            }
                        }
                    }
                    continue;
                }
                (Step::Delivered, _) => return Ok(self.delivered_alone(one.conn())),
                (Step::Message { len, mode }, One::Conn(i)) => {
                    let gen = self.slots[i].gen;
                    match self.slots[i].conn.as_ref() {
                        Some(c) => c.recv(i, gen, len, mode),
                        None => return Ok(Alone::General),
                    }
                }
                (Step::TooSmall(needed), _) => {
                    return Err(Error::BufferTooSmall {
                        needed: needed as usize,
                        have: buf.len(),
                    })
                }
                (Step::Lost, One::Conn(i)) => {
                    let reason = std::mem::take(&mut self.core.lost);
                    self.lose(i, reason);
                    return Ok(Alone::General);
                }
                (Step::Moved, _) => return Ok(Alone::General),
                // A message or a loss of the UDP socket: it gives neither.
                (Step::Message { .. } | Step::Lost, One::Udp) => {
                    debug_assert!(false, "the UDP socket gave {step:?}");
                    return Ok(Alone::General);
                }
            };
            return Ok(self.deliver_alone(one.conn(), r));
        }
    }

    /// Hands the reader the message a look put in `core.got` (a look at
    /// connection `conn`, or at the UCX worker or the UDP socket).
    fn delivered_alone(&mut self, conn: Option<usize>) -> Alone {
        match self.core.got.take() {
            Some(r) => self.deliver_alone(conn, r),
            None => {
                debug_assert!(false, "a look delivered nothing");
                Alone::General
            }
        }
    }

    /// Hands the reader `r`, with what the general pass does after a
    /// delivery (by a look at connection `conn`: where the next pass
    /// starts, and whom a waiting read offers its buffer).
    fn deliver_alone(&mut self, conn: Option<usize>, r: Recv) -> Alone {
        if let Some(i) = conn {
            if r.via.is_some() {
                self.next_slot = if i + 1 == self.slots.len() { 0 } else { i + 1 };
                if r.len >= PLACE_MIN && r.kind == RecvKind::Message(Mode::Reliable) {
                    self.offer_to = Some(i);
                }
            }
        }
        self.delivered();
        self.flush_ctrl();
        Alone::Read(Some(r))
    }
}

#[cfg(test)]
mod tests {
    use super::One;
    use crate::{Completion, EndpointConfig, Error, Mode, Node, NodeConfig, Transport, UcxOptions};
    use std::time::{Duration, Instant};

    const PATIENCE: Duration = Duration::from_secs(5);

    /// Over each transport, a polling reader with one source reads it
    /// alone, and what that loop does not take goes to the general pass
    /// with nothing lost: its deadline, a message larger than the buffer
    /// (which the next read with room gets whole), a second peer coming in
    /// during a read, and the loss of its peer.
    #[test]
    fn a_polling_read_looks_at_its_one_source_alone_and_hands_the_rest_to_the_pass() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b, poll) = super::super::test_nodes(dir.path(), Completion::Poll);
        let cases = [
            (Mode::Reliable, Transport::Shm),
            (Mode::Reliable, Transport::Tcp),
            (Mode::Datagram, Transport::Udp),
        ];
        read_alone_over(&a, &b, poll, &cases);
    }

    /// The same over a UCX connection, whose loop looks at the worker
    /// before the connection; and a pass after a delivery that finds the
    /// worker empty moved nothing (a polling reader's next look is idle,
    /// not a busy pass that hands the read over).
    #[test]
    fn a_polling_read_over_ucx_looks_at_the_worker_and_its_connection_alone() {
        let dir = tempfile::tempdir().unwrap();
        let ucx_node = |id| {
            let mut c = NodeConfig::local(id, dir.path());
            c.ucx = Some(UcxOptions {
                tls: Some("sm".into()),
                devices: None,
            });
            macrolink_testbed::require::ucx(Node::start(c))
        };
        let Some(a) = ucx_node(1) else { return };
        let b = ucx_node(2).expect("a second UCX node");
        a.add_peer(2, b.tcp_addr().unwrap());
        b.add_peer(1, a.tcp_addr().unwrap());
        let poll = EndpointConfig {
            completion: Completion::Poll,
            ..EndpointConfig::default()
        };

        // A ping-pong, so that both workers have answered each other's
        // connections, then one message more: the pass after it is idle.
        let mut rx = a.open(10, poll).unwrap();
        let mut tx = b.open(11, poll).unwrap();
        let to = tx
            .target_via(rx.addr(), Mode::Reliable, Transport::Ucx)
            .unwrap();
        let back = rx
            .target_via(tx.addr(), Mode::Reliable, Transport::Ucx)
            .unwrap();
        let mut buf = [0u8; 64];
        for i in 0..20u8 {
            tx.write(to, &[i; 8]).unwrap();
            let r = rx.read_timeout(&mut buf, PATIENCE).unwrap().unwrap();
            assert_eq!((r.len, buf[0]), (8, i));
            rx.write(back, &[i; 8]).unwrap();
            let r = tx.read_timeout(&mut buf, PATIENCE).unwrap().unwrap();
            assert_eq!((r.len, buf[0]), (8, i));
        }
        tx.write(to, b"last").unwrap();
        let r = rx.read_timeout(&mut buf, PATIENCE).unwrap().unwrap();
        assert_eq!(&buf[..r.len], b"last");
        assert!(
            !rx.progress_all(None).unwrap(),
            "a pass after a delivery, with nothing come since, moved something"
        );
        drop((rx, tx));

        read_alone_over(&a, &b, poll, &[(Mode::Reliable, Transport::Ucx)]);
    }

    /// What both tests above ask of each transport in `cases`.
    fn read_alone_over(a: &Node, b: &Node, poll: EndpointConfig, cases: &[(Mode, Transport)]) {
        for (k, &(mode, transport)) in cases.iter().enumerate() {
            let ep = 20 + 3 * k as u32;
            let mut rx = a.open(ep, poll).unwrap();
            let mut tx = b.open(ep + 1, poll).unwrap();
            assert_eq!(rx.one_source(), None, "{transport}: nothing to look at yet");
            let to = tx.target_via(rx.addr(), mode, transport).unwrap();
            let mut buf = [0u8; 256];

            // The first message comes through the general pass, which
            // adopts the connection (or hears the first datagram).
            tx.write(to, b"first").unwrap();
            let r = rx.read_timeout(&mut buf, PATIENCE).unwrap().unwrap();
            assert_eq!(&buf[..r.len], b"first");
            let one = rx.one_source();
            match transport {
                Transport::Udp => assert_eq!(one, Some(One::Udp)),
                _ => assert!(matches!(one, Some(One::Conn(_))), "{transport}: {one:?}"),
            }

            // Then the source alone: messages, in order.
            for i in 0..50u8 {
                tx.write(to, &[i; 32]).unwrap();
                let r = rx.read_timeout(&mut buf, PATIENCE).unwrap().unwrap();
                assert_eq!((r.len, buf[0], r.from), (32, i, tx.addr()), "{transport}");
            }
            assert_eq!(rx.one_source(), one, "{transport}: still alone");

            // Nothing comes: the deadline ends the read, in its time.
            let t0 = Instant::now();
            let r = rx
                .read_timeout(&mut buf, Duration::from_millis(20))
                .unwrap();
            assert!(r.is_none(), "{transport}: nothing was sent");
            let took = t0.elapsed();
            assert!(took >= Duration::from_millis(20), "{transport}: {took:?}");
            assert!(
                took < PATIENCE,
                "{transport}: the deadline was missed ({took:?})"
            );

            // A message larger than the buffer: refused, and kept whole
            // for the next read with room.
            tx.write(to, &[7; 200]).unwrap();
            let mut small = [0u8; 10];
            let t0 = Instant::now();
            let err = loop {
                match rx.read_timeout(&mut small, PATIENCE) {
                    Err(e) => break e,
                    Ok(r) => assert!(r.is_none() && t0.elapsed() < PATIENCE, "{transport}"),
                }
            };
            assert!(
                matches!(err, Error::BufferTooSmall { needed: 200, .. }),
                "{transport}: {err}"
            );
            let r = rx.read_timeout(&mut buf, PATIENCE).unwrap().unwrap();
            assert_eq!((r.len, &buf[..200]), (200, &[7u8; 200][..]), "{transport}");

            // A second peer writes while the reader waits in its loop: the
            // general pass takes it in, and its message is read.
            let mut other = b.open(ep + 2, poll).unwrap();
            let other_to = other.target_via(rx.addr(), mode, transport).unwrap();
            let writer = std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(20));
                other.write(other_to, b"second peer").unwrap();
                other
            });
            let r = rx.read_timeout(&mut buf, PATIENCE).unwrap().unwrap();
            assert_eq!(&buf[..r.len], b"second peer", "{transport}");
            let other = writer.join().unwrap();
            assert_eq!(r.from, other.addr(), "{transport}");
            if transport != Transport::Udp {
                assert_eq!(rx.one_source(), None, "{transport}: two connections");
            }

            // The peer goes: a reader with its connection alone hears it.
            drop(other);
            if transport != Transport::Udp {
                let mut lost = false;
                let t0 = Instant::now();
                while !lost && t0.elapsed() < PATIENCE {
                    match rx.read_timeout(&mut buf, Duration::from_millis(100)) {
                        Err(Error::PeerLost { peer, .. }) => {
                            assert_eq!(peer.ep, ep + 2, "{transport}");
                            lost = true;
                        }
                        Ok(None) => {}
                        other => panic!("{transport}: {other:?}"),
                    }
                }
                assert!(lost, "{transport}: the loss was not told");
                assert!(
                    matches!(rx.one_source(), Some(One::Conn(_))),
                    "{transport}: alone again"
                );
                drop(tx);
                let t0 = Instant::now();
                let err = loop {
                    match rx.read_timeout(&mut buf, Duration::from_millis(100)) {
                        Err(e) => break e,
                        Ok(r) => assert!(r.is_none() && t0.elapsed() < PATIENCE, "{transport}"),
                    }
                };
                assert!(matches!(err, Error::PeerLost { .. }), "{transport}: {err}");
            }
        }
    }
}
