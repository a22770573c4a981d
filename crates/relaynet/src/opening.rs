//! A flow in its handshake: the near host's hello crosses the long link as
//! the flow's first bytes, and the far node's answer comes back as the
//! first bytes the other way. Only then does the flow carry the hosts'
//! bytes (see [`crate::greet`]).

use macrolink_fabric::{Heard, Key};
use macrolink_relay::haul::Link;
use macrolink_wire::{Flags, FrameKind, Header, HEADER_LEN};
use std::io::{self, Write};
use std::net::{IpAddr, TcpStream};
use std::time::Duration;

/// How long the answer to a near host may take to be written.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(1);

/// Where a flow's handshake is.
#[derive(Debug)]
pub(crate) enum Opening {
    /// Far side: the hello's bytes as they arrive from the link.
    Hello { node: u32, got: Got },
    /// Far side: a thread dials the node with `hello`.
    Dialling { node: u32, hello: Header },
    /// Near side: the host's hello went out; the far node's answer is
    /// awaited.
    Answer {
        node: u32,
        sock: TcpStream,
        source: IpAddr,
        heard: Box<Heard>,
        got: Got,
    },
}

/// The first bytes of a flow, as they arrive.
#[derive(Debug)]
pub(crate) struct Got {
    bytes: [u8; HEADER_LEN],
    n: usize,
}

impl Default for Got {
    fn default() -> Got {
        Got {
            bytes: [0; HEADER_LEN],
            n: 0,
        }
    }
}

impl Got {
    /// Takes what the link has of the header; the header once whole.
    /// Never more than the header is consumed, so what follows it stays
    /// in the flow for the connection.
    pub fn take(&mut self, link: &mut Link, flow: u32) -> Option<&[u8; HEADER_LEN]> {
        while self.n < HEADER_LEN {
            let (a, _) = link.readable(flow);
            if a.is_empty() {
                return None;
            }
            let k = a.len().min(HEADER_LEN - self.n);
            self.bytes[self.n..self.n + k].copy_from_slice(&a[..k]);
            self.n += k;
            link.consume(flow, k);
        }
        Some(&self.bytes)
    }
}

/// What a step of an opening came to.
#[derive(Debug)]
pub(crate) enum Step {
    /// Nothing yet.
    Wait,
    /// Far side: dial the node with this hello.
    Dial { node: u32, hello: Header },
    /// Near side: the host has its answer and the connection is taken:
    /// carry its bytes.
    Open { sock: TcpStream, source: IpAddr },
    /// The handshake ended without a connection (a refusal, a resolve);
    /// the flow ends cleanly.
    Ended,
    /// Broken: reset the flow.
    Failed(String),
}

impl Opening {
    /// The near address that dialled, on the near side.
    pub fn source(&self) -> Option<IpAddr> {
        match self {
            Opening::Answer { source, .. } => Some(*source),
            _ => None,
        }
    }

    /// Moves the handshake on with what the link holds; `udp_port(node)`
    /// is the port this relay gives near hosts for the datagrams of far
    /// node `node`.
    pub fn step(
        &mut self,
        link: &mut Link,
        flow: u32,
        key: &Key,
        udp_port: impl Fn(u32) -> Option<u16>,
    ) -> Step {
        match self {
            Opening::Hello { node, got } => {
                let Some(b) = got.take(link, flow) else {
                    return Step::Wait;
                };
                match Header::decode(b) {
                    Ok(hello) if hello.kind == FrameKind::Hello => {
                        let node = *node;
                        *self = Opening::Dialling { node, hello };
                        Step::Dial { node, hello }
                    }
                    _ => Step::Failed("the peer relay sent no hello".into()),
                }
            }
            Opening::Dialling { .. } => Step::Wait,
            Opening::Answer { got, .. } => {
                let Some(b) = got.take(link, flow) else {
                    return Step::Wait;
                };
                let mut a = match Header::decode(b) {
                    Ok(a) if matches!(a.kind, FrameKind::HelloOk | FrameKind::HelloRefused) => a,
                    _ => return Step::Failed("the peer relay sent no answer".into()),
                };
                // The opening ends here, whatever the answer: take it apart.
                let ended = Opening::Dialling { node: 0, hello: a };
                let Opening::Answer {
                    node,
                    sock,
                    source,
                    heard,
                    ..
                } = std::mem::replace(self, ended)
                else {
                    unreachable!("matched above")
                };
                let resolve = heard.hello.flags.contains(Flags::RESOLVE_UDP);
                if resolve && a.kind == FrameKind::HelloOk {
                    match udp_port(node) {
                        Some(p) => a.offset = u64::from(p),
                        None => {
                            a = Header::new(FrameKind::HelloRefused);
                            a.offset = macrolink_fabric::Refusal::NoSuchEndpoint.code();
                        }
                    }
                }
                if let Err(e) = write_answer(&sock, heard.answer(key, &a).as_slice()) {
                    return Step::Failed(format!("answering {source}: {e}"));
                }
                if a.kind == FrameKind::HelloOk && !resolve {
                    Step::Open { sock, source }
                } else {
                    Step::Ended
                }
            }
        }
    }
}

/// Writes a handshake's answer to a socket that has sent nothing else.
fn write_answer(mut sock: &TcpStream, bytes: &[u8]) -> io::Result<()> {
    sock.set_write_timeout(Some(ANSWER_TIMEOUT))?;
    sock.write_all(bytes)
}
