//! Messages of macro-cluster management, one UDP datagram each, between
//! the agents of the hosts, the local managers of their groups and the
//! central manager. A keyed hash (added by the sender, not here) follows
//! the encoded bytes.
//!
//! ```text
//!  "MG" ver kind │ from u32 (node id) │ body
//!  Ping      seq u64, origin u32            probe; answered with Ack
//!  PingReq   seq u64, member u32            probe `member` for me (indirect)
//!  Ack       seq u64, member u32, origin u32, health u8, text
//!  Beat      group u16, epoch u64, n u64    manager to fallback
//!  Report    group u16, epoch u64, n u64, host u32, seen u8, text
//!  Refused   group u16, epoch u64, holder u32     central: that epoch holds
//!  Order     nonce u64, sent_ms u64, host u32, order u8, text    operator to central
//!  Status    nonce u64, sent_ms u64         ask the central for its state
//!  Reply     nonce u64, ok u8, text         central's answer (JSON or a reason)
//!  Fenced    nonce u64, sent_ms u64         ask the central which hosts are excluded
//!  Excluded  nonce u64, count u16, node u32 × count    its answer
//!  text: len u16, UTF-8 bytes
//! ```

/// First bytes of every message.
pub const MANAGE_MAGIC: [u8; 2] = *b"MG";
/// Version of the management messages.
pub const MANAGE_VERSION: u8 = 1;
/// Longest text of a health check, a report or an order.
pub const MAX_TEXT: usize = 512;
/// Longest reply text (a status in JSON): one datagram.
pub const MAX_REPLY: usize = 60_000;
/// Most hosts one answer names as excluded.
pub const MAX_EXCLUDED: usize = 8192;

/// What is wrong with a message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ManageError {
    /// It ends before its fields do.
    #[error("truncated management message")]
    Truncated,
    /// Not a management message.
    #[error("not a management message")]
    BadMagic,
    /// A version this side does not speak.
    #[error("management version {0}, this side speaks {MANAGE_VERSION}")]
    BadVersion(u8),
    /// An unknown kind, health, observation or order.
    #[error("unknown management message field {0}")]
    Unknown(u8),
    /// Text longer than its limit.
    #[error("management text over its limit")]
    Oversize,
    /// Text that is not UTF-8, or bytes after the body.
    #[error("malformed management message")]
    Malformed,
}

/// A host's health as its agent's check last said.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Health {
    /// No check configured, or none run yet.
    NotChecked,
    /// Exit 0.
    Healthy,
    /// Exit 1: the text says why.
    Unhealthy,
    /// The check itself failed (another status, a signal, a timeout).
    Unknown,
}

/// What a local manager saw of a host.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Seen {
    /// Answers; its check passes (or none is configured).
    Alive,
    /// Suspect.
    Suspect,
    /// Failed.
    Failed,
    /// Answers, but unhealthy: the text says why.
    Unhealthy,
    /// Answers; its check itself failed: the text says how.
    Unknown,
}

/// An operator's order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OrderKind {
    /// Reset the host.
    Reset,
    /// Exclude it.
    Exclude,
    /// Include it again.
    Include,
}

/// Node ids packed as they travel (little-endian u32 each).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Nodes<'a>(&'a [u8]);

impl<'a> Nodes<'a> {
    /// `nodes` packed, for [`Nodes::new`].
    pub fn pack(nodes: impl IntoIterator<Item = u32>) -> Vec<u8> {
        nodes.into_iter().flat_map(u32::to_le_bytes).collect()
    }

    /// The node ids packed in `b` (by [`Nodes::pack`]); `None` when its
    /// length is no whole number of them or over [`MAX_EXCLUDED`].
    pub fn new(b: &'a [u8]) -> Option<Nodes<'a>> {
        (b.len().is_multiple_of(4) && b.len() / 4 <= MAX_EXCLUDED).then_some(Nodes(b))
    }

    /// How many.
    pub fn len(&self) -> usize {
        self.0.len() / 4
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The node ids.
    pub fn iter(&self) -> impl Iterator<Item = u32> + 'a {
        self.0
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
    }
}

/// What a message carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Body<'a> {
    /// A probe.
    Ping {
        /// Probe number.
        seq: u64,
        /// The manager that wants the answer.
        origin: u32,
    },
    /// Probe `member` on the sender's behalf.
    PingReq {
        /// Probe number.
        seq: u64,
        /// The host to probe.
        member: u32,
    },
    /// The answer to a probe.
    Ack {
        /// Probe number.
        seq: u64,
        /// The host that answers.
        member: u32,
        /// The manager that wants it.
        origin: u32,
        /// Its health.
        health: Health,
        /// The check's words.
        text: &'a str,
    },
    /// The managing side of a group is alive.
    Beat {
        /// Group index in the cluster file.
        group: u16,
        /// Its epoch.
        epoch: u64,
        /// Beat number within the epoch.
        n: u64,
    },
    /// What a local manager saw of a host.
    Report {
        /// Group index.
        group: u16,
        /// The sender's epoch.
        epoch: u64,
        /// Report number within the epoch.
        n: u64,
        /// The host's node id.
        host: u32,
        /// What was seen.
        seen: Seen,
        /// Health words.
        text: &'a str,
    },
    /// A report of an older epoch was ignored: this epoch holds.
    Refused {
        /// Group index.
        group: u16,
        /// The epoch that holds.
        epoch: u64,
        /// The node that holds it.
        holder: u32,
    },
    /// An operator's order.
    Order {
        /// Unique per order.
        nonce: u64,
        /// When it was sent, wall-clock milliseconds (old ones are refused).
        sent_ms: u64,
        /// The host's node id.
        host: u32,
        /// What to do.
        order: OrderKind,
        /// Why.
        text: &'a str,
    },
    /// Asks the central manager for its state.
    Status {
        /// Echoed in the reply.
        nonce: u64,
        /// When it was sent, wall-clock milliseconds (old ones are refused).
        sent_ms: u64,
    },
    /// The central manager's answer to an order or a status request.
    Reply {
        /// The request's nonce.
        nonce: u64,
        /// Done (or the state follows), or refused (the reason follows).
        ok: bool,
        /// The state in JSON, or the reason.
        text: &'a str,
    },
    /// Asks the central manager which hosts are excluded.
    Fenced {
        /// Echoed in the answer.
        nonce: u64,
        /// When it was sent, wall-clock milliseconds (old ones are refused).
        sent_ms: u64,
    },
    /// The hosts excluded now.
    Excluded {
        /// The request's nonce.
        nonce: u64,
        /// Their node ids.
        nodes: Nodes<'a>,
    },
}

/// A message: its sender and what it carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Message<'a> {
    /// The sender's node id.
    pub from: u32,
    /// The body.
    pub body: Body<'a>,
}

const HEADER: usize = 4 + 4;

fn health_code(h: Health) -> u8 {
    match h {
        Health::NotChecked => 0,
        Health::Healthy => 1,
        Health::Unhealthy => 2,
        Health::Unknown => 3,
    }
}

fn seen_code(s: Seen) -> u8 {
    match s {
        Seen::Alive => 0,
        Seen::Suspect => 1,
        Seen::Failed => 2,
        Seen::Unhealthy => 3,
        Seen::Unknown => 4,
    }
}

fn order_code(o: OrderKind) -> u8 {
    match o {
        OrderKind::Reset => 0,
        OrderKind::Exclude => 1,
        OrderKind::Include => 2,
    }
}

impl<'a> Message<'a> {
    /// Encodes into a new buffer; `None` when a text is over its limit.
    pub fn encode(&self) -> Option<Vec<u8>> {
        let mut b = Vec::with_capacity(64);
        b.extend_from_slice(&MANAGE_MAGIC);
        b.push(MANAGE_VERSION);
        let text = |b: &mut Vec<u8>, t: &str, max: usize| -> Option<()> {
            if t.len() > max {
                return None;
            }
            b.extend_from_slice(&(t.len() as u16).to_le_bytes());
            b.extend_from_slice(t.as_bytes());
            Some(())
        };
        let kind = match self.body {
            Body::Ping { .. } => 1,
            Body::PingReq { .. } => 2,
            Body::Ack { .. } => 3,
            Body::Beat { .. } => 4,
            Body::Report { .. } => 5,
            Body::Refused { .. } => 6,
            Body::Order { .. } => 7,
            Body::Status { .. } => 8,
            Body::Reply { .. } => 9,
            Body::Fenced { .. } => 10,
            Body::Excluded { .. } => 11,
        };
        b.push(kind);
        b.extend_from_slice(&self.from.to_le_bytes());
        match self.body {
            Body::Ping { seq, origin } => {
                b.extend_from_slice(&seq.to_le_bytes());
                b.extend_from_slice(&origin.to_le_bytes());
            }
            Body::PingReq { seq, member } => {
                b.extend_from_slice(&seq.to_le_bytes());
                b.extend_from_slice(&member.to_le_bytes());
            }
            Body::Ack {
                seq,
                member,
                origin,
                health,
                text: t,
            } => {
                b.extend_from_slice(&seq.to_le_bytes());
                b.extend_from_slice(&member.to_le_bytes());
                b.extend_from_slice(&origin.to_le_bytes());
                b.push(health_code(health));
                text(&mut b, t, MAX_TEXT)?;
            }
            Body::Beat { group, epoch, n } => {
                b.extend_from_slice(&group.to_le_bytes());
                b.extend_from_slice(&epoch.to_le_bytes());
                b.extend_from_slice(&n.to_le_bytes());
            }
            Body::Report {
                group,
                epoch,
                n,
                host,
                seen,
                text: t,
            } => {
                b.extend_from_slice(&group.to_le_bytes());
                b.extend_from_slice(&epoch.to_le_bytes());
                b.extend_from_slice(&n.to_le_bytes());
                b.extend_from_slice(&host.to_le_bytes());
                b.push(seen_code(seen));
                text(&mut b, t, MAX_TEXT)?;
            }
            Body::Refused {
                group,
                epoch,
                holder,
            } => {
                b.extend_from_slice(&group.to_le_bytes());
                b.extend_from_slice(&epoch.to_le_bytes());
                b.extend_from_slice(&holder.to_le_bytes());
            }
            Body::Order {
                nonce,
                sent_ms,
                host,
                order,
                text: t,
            } => {
                b.extend_from_slice(&nonce.to_le_bytes());
                b.extend_from_slice(&sent_ms.to_le_bytes());
                b.extend_from_slice(&host.to_le_bytes());
                b.push(order_code(order));
                text(&mut b, t, MAX_TEXT)?;
            }
            Body::Status { nonce, sent_ms } => {
                b.extend_from_slice(&nonce.to_le_bytes());
                b.extend_from_slice(&sent_ms.to_le_bytes());
            }
            Body::Reply { nonce, ok, text: t } => {
                b.extend_from_slice(&nonce.to_le_bytes());
                b.push(u8::from(ok));
                text(&mut b, t, MAX_REPLY)?;
            }
            Body::Fenced { nonce, sent_ms } => {
                b.extend_from_slice(&nonce.to_le_bytes());
                b.extend_from_slice(&sent_ms.to_le_bytes());
            }
            Body::Excluded { nonce, nodes } => {
                b.extend_from_slice(&nonce.to_le_bytes());
                b.extend_from_slice(&(nodes.len() as u16).to_le_bytes());
                b.extend_from_slice(nodes.0);
            }
        }
        Some(b)
    }

    /// Decodes one message; never panics.
    pub fn decode(b: &'a [u8]) -> Result<Message<'a>, ManageError> {
        let mut r = Reader { b, at: 0 };
        if r.take(2)? != MANAGE_MAGIC {
            return Err(ManageError::BadMagic);
        }
        let version = r.u8()?;
        if version != MANAGE_VERSION {
            return Err(ManageError::BadVersion(version));
        }
        let kind = r.u8()?;
        let from = r.u32()?;
        debug_assert_eq!(r.at, HEADER);
        let body = match kind {
            1 => Body::Ping {
                seq: r.u64()?,
                origin: r.u32()?,
            },
            2 => Body::PingReq {
                seq: r.u64()?,
                member: r.u32()?,
            },
            3 => Body::Ack {
                seq: r.u64()?,
                member: r.u32()?,
                origin: r.u32()?,
                health: match r.u8()? {
                    0 => Health::NotChecked,
                    1 => Health::Healthy,
                    2 => Health::Unhealthy,
                    3 => Health::Unknown,
                    x => return Err(ManageError::Unknown(x)),
                },
                text: r.text(MAX_TEXT)?,
            },
            4 => Body::Beat {
                group: r.u16()?,
                epoch: r.u64()?,
                n: r.u64()?,
            },
            5 => Body::Report {
                group: r.u16()?,
                epoch: r.u64()?,
                n: r.u64()?,
                host: r.u32()?,
                seen: match r.u8()? {
                    0 => Seen::Alive,
                    1 => Seen::Suspect,
                    2 => Seen::Failed,
                    3 => Seen::Unhealthy,
                    4 => Seen::Unknown,
                    x => return Err(ManageError::Unknown(x)),
                },
                text: r.text(MAX_TEXT)?,
            },
            6 => Body::Refused {
                group: r.u16()?,
                epoch: r.u64()?,
                holder: r.u32()?,
            },
            7 => Body::Order {
                nonce: r.u64()?,
                sent_ms: r.u64()?,
                host: r.u32()?,
                order: match r.u8()? {
                    0 => OrderKind::Reset,
                    1 => OrderKind::Exclude,
                    2 => OrderKind::Include,
                    x => return Err(ManageError::Unknown(x)),
                },
                text: r.text(MAX_TEXT)?,
            },
            8 => Body::Status {
                nonce: r.u64()?,
                sent_ms: r.u64()?,
            },
            9 => Body::Reply {
                nonce: r.u64()?,
                ok: match r.u8()? {
                    0 => false,
                    1 => true,
                    _ => return Err(ManageError::Malformed),
                },
                text: r.text(MAX_REPLY)?,
            },
            10 => Body::Fenced {
                nonce: r.u64()?,
                sent_ms: r.u64()?,
            },
            11 => Body::Excluded {
                nonce: r.u64()?,
                nodes: {
                    let n = r.u16()? as usize;
                    if n > MAX_EXCLUDED {
                        return Err(ManageError::Oversize);
                    }
                    Nodes(r.take(n * 4)?)
                },
            },
            x => return Err(ManageError::Unknown(x)),
        };
        if r.at != b.len() {
            return Err(ManageError::Malformed);
        }
        Ok(Message { from, body })
    }
}

struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], ManageError> {
        let end = self.at.checked_add(n).ok_or(ManageError::Truncated)?;
        let s = self.b.get(self.at..end).ok_or(ManageError::Truncated)?;
        self.at = end;
        Ok(s)
    }

    fn u8(&mut self) -> Result<u8, ManageError> {
        Ok(self.take(1)?[0])
    }

    fn u16(&mut self) -> Result<u16, ManageError> {
        let s = self.take(2)?;
        Ok(u16::from_le_bytes([s[0], s[1]]))
    }

    fn u32(&mut self) -> Result<u32, ManageError> {
        let s = self.take(4)?;
        Ok(u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
    }

    fn u64(&mut self) -> Result<u64, ManageError> {
        let s = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(s);
        Ok(u64::from_le_bytes(a))
    }

    fn text(&mut self, max: usize) -> Result<&'a str, ManageError> {
        let n = self.u16()? as usize;
        if n > max {
            return Err(ManageError::Oversize);
        }
        std::str::from_utf8(self.take(n)?).map_err(|_| ManageError::Malformed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const PACKED: [u8; 8] = [21, 0, 0, 0, 0, 1, 0, 0];

    fn every_kind() -> Vec<Message<'static>> {
        let from = 7;
        [
            Body::Ping { seq: 1, origin: 2 },
            Body::PingReq { seq: 3, member: 4 },
            Body::Ack {
                seq: 5,
                member: 6,
                origin: 2,
                health: Health::Unhealthy,
                text: "disk full",
            },
            Body::Beat {
                group: 1,
                epoch: 9,
                n: 10,
            },
            Body::Report {
                group: 1,
                epoch: 9,
                n: 11,
                host: 12,
                seen: Seen::Unknown,
                text: "exit status 139",
            },
            Body::Refused {
                group: 0,
                epoch: 3,
                holder: 21,
            },
            Body::Order {
                nonce: 77,
                sent_ms: 1_790_000_000_000,
                host: 12,
                order: OrderKind::Exclude,
                text: "bad memory",
            },
            Body::Status {
                nonce: 78,
                sent_ms: 1_790_000_000_001,
            },
            Body::Reply {
                nonce: 78,
                ok: true,
                text: "{\"hosts\":{}}",
            },
            Body::Fenced {
                nonce: 79,
                sent_ms: 1_790_000_000_002,
            },
            Body::Excluded {
                nonce: 79,
                nodes: Nodes::new(&PACKED).unwrap(),
            },
        ]
        .into_iter()
        .map(|body| Message { from, body })
        .collect()
    }

    #[test]
    fn every_kind_round_trips_and_every_cut_is_refused() {
        for m in every_kind() {
            let b = m.encode().unwrap();
            assert_eq!(Message::decode(&b), Ok(m));
            for cut in 0..b.len() {
                assert!(Message::decode(&b[..cut]).is_err(), "{m:?} cut at {cut}");
            }
            let mut long = b.clone();
            long.push(0);
            assert_eq!(Message::decode(&long), Err(ManageError::Malformed));
        }
    }

    #[test]
    fn texts_over_their_limit_are_neither_sent_nor_taken() {
        let long = "x".repeat(MAX_TEXT + 1);
        let m = Message {
            from: 1,
            body: Body::Order {
                nonce: 1,
                sent_ms: 0,
                host: 2,
                order: OrderKind::Reset,
                text: &long,
            },
        };
        assert_eq!(m.encode(), None);
        let ok = Message {
            from: 1,
            body: Body::Order {
                nonce: 1,
                sent_ms: 0,
                host: 2,
                order: OrderKind::Reset,
                text: "x",
            },
        };
        let mut b = ok.encode().unwrap();
        let at = b.len() - 3;
        b[at..at + 2].copy_from_slice(&((MAX_TEXT + 1) as u16).to_le_bytes());
        assert_eq!(Message::decode(&b), Err(ManageError::Oversize));
    }

    #[test]
    fn excluded_nodes_travel_in_order_and_a_list_over_the_limit_is_refused() {
        let packed = Nodes::pack([21, 256, u32::MAX]);
        let nodes = Nodes::new(&packed).unwrap();
        assert_eq!(nodes.iter().collect::<Vec<_>>(), [21, 256, u32::MAX]);
        assert!(Nodes::new(&packed[1..]).is_none(), "not whole ids");
        let big = Nodes::pack(0..=MAX_EXCLUDED as u32);
        assert!(Nodes::new(&big).is_none(), "over the limit");
        let m = Message {
            from: 1,
            body: Body::Excluded { nonce: 5, nodes },
        };
        let mut b = m.encode().unwrap();
        b[16..18].copy_from_slice(&(MAX_EXCLUDED as u16 + 1).to_le_bytes());
        assert_eq!(Message::decode(&b), Err(ManageError::Oversize));
    }

    proptest! {
        #[test]
        fn any_bytes_decode_without_panic(b in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = Message::decode(&b);
        }

        #[test]
        fn any_report_round_trips(group: u16, epoch: u64, n: u64, host: u32, s in 0u8..5, text in "[a-z ]{0,40}") {
            let seen = [Seen::Alive, Seen::Suspect, Seen::Failed, Seen::Unhealthy, Seen::Unknown][s as usize];
            let m = Message { from: 3, body: Body::Report { group, epoch, n, host, seen, text: &text } };
            let b = m.encode().unwrap();
            prop_assert_eq!(Message::decode(&b), Ok(m));
        }
    }
}
