//! Handshakes on the nodes' behalf, each on a thread of its own so that the
//! relay's loop never waits for one.
//!
//! ```text
//!  near host ──tcp──► relay A: hear (challenge, hello, proof checked)
//!                       │ the hello, as a flow's first bytes
//!                       ▼
//!                     relay B: dial the node, handshake as the initiator
//!                       │ the node's answer, as the flow's first bytes back
//!                       ▼
//!  near host ◄──────── relay A: the answer, with relay A's proof
//! ```
//!
//! A relay knows the cluster key, so it checks a near host's proof itself
//! before anything of the connection crosses the long link: a stranger gets
//! no flow, no buffer and no packet sent for it. Unproven connections pass
//! a [`Gate`]: one deadline for the whole exchange, and a cap per source and
//! in all, as at a node.

use macrolink_fabric::gate::{Gate, Limits, Source};
use macrolink_fabric::{Error as FabricError, Heard, Key, Refusal};
use macrolink_wire::{Flags, FrameKind, Header};
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Arc;
use std::time::Duration;

/// How long a handshake with a node of this segment may take.
const DIAL_TIMEOUT: Duration = Duration::from_secs(5);

/// A handshake that ended.
#[derive(Debug)]
pub(crate) enum Done {
    /// A near host proved the key and asks for far node `node`.
    Heard {
        node: u32,
        sock: TcpStream,
        from: SocketAddr,
        heard: Box<Heard>,
    },
    /// A node of this segment answered the hello of `flow`: its answer,
    /// and the connection if it took it.
    Dialled {
        flow: u32,
        answer: Header,
        sock: Option<TcpStream>,
    },
    /// The node of `flow` could not be reached or answered nonsense.
    Failed { flow: u32, why: String },
}

/// Starts handshakes and collects their ends.
#[derive(Debug)]
pub(crate) struct Greeter {
    key: Key,
    gate: Arc<Gate>,
    tx: Sender<Done>,
    rx: Receiver<Done>,
    wake_tx: Arc<UnixStream>,
    wake_rx: UnixStream,
}

impl Greeter {
    pub fn new(key: Key, per_source: usize) -> io::Result<Greeter> {
        let (wake_tx, wake_rx) = UnixStream::pair()?;
        wake_tx.set_nonblocking(true)?;
        wake_rx.set_nonblocking(true)?;
        let (tx, rx) = mpsc::channel();
        let limits = Limits {
            per_source: per_source.min(Limits::default().per_source),
            ..Limits::default()
        };
        Ok(Greeter {
            key,
            gate: Arc::new(Gate::new(limits)),
            tx,
            rx,
            wake_tx: Arc::new(wake_tx),
            wake_rx,
        })
    }

    pub fn key(&self) -> &Key {
        &self.key
    }

    /// What the loop polls to hear that a handshake ended.
    pub fn wake_fd(&self) -> BorrowedFd<'_> {
        self.wake_rx.as_fd()
    }

    /// Handshakes that ended since the last call.
    pub fn take(&self) -> impl Iterator<Item = Done> + '_ {
        let mut b = [0u8; 256];
        while matches!((&self.wake_rx).read(&mut b), Ok(n) if n > 0) {}
        self.rx.try_iter()
    }

    fn spawn(&self, name: &str, job: impl FnOnce() -> Option<Done> + Send + 'static) {
        let (tx, wake) = (self.tx.clone(), self.wake_tx.clone());
        let spawned = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                if let Some(d) = job() {
                    if tx.send(d).is_ok() {
                        let _ = (&*wake).write(&[1]);
                    }
                }
            });
        if let Err(e) = spawned {
            tracing::warn!("cannot start a handshake: {e}");
        }
    }

    /// Hears the hello of a near host that dialled far node `node`.
    pub fn hear(&self, node: u32, mut sock: TcpStream, from: SocketAddr) {
        let (gate, key) = (self.gate.clone(), self.key.clone());
        self.spawn("ml-relay-hear", move || {
            let pass = gate.enter(Source::Ip(from.ip()), &sock).ok()?;
            match macrolink_fabric::hear(&mut sock, &key, pass.until) {
                Ok(Ok(heard)) if heard.hello.flags.contains(Flags::UCX) => {
                    // UCX's data goes worker to worker, which the long link
                    // does not carry: refused by name, before it crosses.
                    let mut no = Header::new(FrameKind::HelloRefused);
                    no.offset = Refusal::Unsupported.code();
                    let _ = sock.write_all(heard.answer(&key, &no).as_slice());
                    tracing::info!("refused {from}: UCX does not cross the relays");
                    None
                }
                Ok(Ok(heard)) => Some(Done::Heard {
                    node,
                    sock,
                    from,
                    heard: Box::new(heard),
                }),
                Ok(Err(why)) => {
                    tracing::info!("refused {from}: {why:?}");
                    None
                }
                Err(e) => {
                    tracing::debug!("handshake with {from}: {e}");
                    None
                }
            }
        });
    }

    /// Dials node `addr` for `flow` and offers it `hello`.
    pub fn dial(&self, flow: u32, addr: SocketAddr, hello: Header) {
        let key = self.key.clone();
        self.spawn("ml-relay-dial", move || {
            Some(match dial(addr, &key, hello) {
                Ok((answer, sock)) => Done::Dialled { flow, answer, sock },
                Err(e) => Done::Failed {
                    flow,
                    why: format!("{addr}: {e}"),
                },
            })
        })
    }
}

impl Greeter {
    /// Connects `flow` to the file service contact at `addr` (none: this
    /// segment has no such host): the host proved the key to the peer
    /// relay, and the file service checks its own.
    pub fn contact(&self, flow: u32, addr: Option<SocketAddr>) {
        self.spawn("ml-relay-contact", move || {
            let refused = || {
                let mut a = Header::new(FrameKind::HelloRefused);
                a.offset = Refusal::NoSuchEndpoint.code();
                a
            };
            let sock = addr.and_then(|a| TcpStream::connect_timeout(&a, DIAL_TIMEOUT).ok());
            let answer = match sock {
                Some(_) => Header::new(FrameKind::HelloOk),
                None => refused(),
            };
            Some(Done::Dialled { flow, answer, sock })
        })
    }
}

/// The initiator's handshake with a node of this segment, with a near
/// host's hello: the node's answer, and the connection when it took it.
fn dial(
    addr: SocketAddr,
    key: &Key,
    hello: Header,
) -> Result<(Header, Option<TcpStream>), FabricError> {
    let mut s = TcpStream::connect_timeout(&addr, DIAL_TIMEOUT)?;
    s.set_nodelay(true)?;
    let refused = |why: Refusal| {
        let mut a = Header::new(FrameKind::HelloRefused);
        a.offset = why.code();
        Ok((a, None))
    };
    match macrolink_fabric::handshake(&mut s, key, hello) {
        Ok(offset) => {
            let mut a = Header::new(FrameKind::HelloOk);
            a.offset = offset;
            Ok((a, Some(s)))
        }
        Err(FabricError::NoSuchEndpoint(_)) => refused(Refusal::NoSuchEndpoint),
        Err(FabricError::Unauthenticated { .. }) => refused(Refusal::Unauthenticated),
        Err(FabricError::Refused { why, .. }) => refused(why),
        Err(e) => Err(e),
    }
}
