//! The put mode over a framed stream: the target places a put's frames in
//! the registered region once the whole put is checked and answers it; the
//! initiator over shared memory maps the target's regions and writes into
//! them itself ([`OneSided`]), asking for each region once.
//!
//! ```text
//!  initiator ── Put frames (key, offset, total) ──► target: check, place, answer
//!  initiator ── RegionQuery ──► target ── RegionInfo + the region's memfd ──► mapped here
//! ```

use macrolink_wire::{Flags, FrameKind, Header, Refusal};
use std::io;
use std::os::fd::AsFd;

use super::{Asm, Framed, CTRL_CAP};
use crate::iobuf::IoBuf;
use crate::rx::{Core, Ready, Step};
use crate::transport::region::RemoteRegion;
use crate::transport::{ByteStream, OneSided, RegionAnswer};
use crate::types::RegionKey;

impl<S: ByteStream> Framed<S> {
    /// Whether the frame `h` would queue a notice for the application
    /// (`notify`) or an answer that the queues have no room for: the
    /// connection is then not read on until they have.
    fn no_room(&self, core: &Core, notify: bool) -> bool {
        self.control.out.len() >= CTRL_CAP || (notify && core.ready.len() >= core.ready_cap)
    }

    /// A peer asks for a region to write into: its memory goes over the
    /// socket first, and the answer that names it follows in the ring.
    pub(super) fn region_query(&mut self, core: &mut Core, h: Header) -> Step {
        if self.no_room(core, false) {
            return Step::Idle;
        }
        self.rx.finish();
        let mut answer = Header::new(FrameKind::RegionInfo);
        answer.key = h.key;
        match core.regions.backing(h.key) {
            Some((len, file)) => match self.stream.send_fd(file.as_fd()) {
                Ok(()) => answer.total = len as u64,
                // An initiator asks for one region at a time and takes its
                // memory with the answer: a socket full of descriptors is
                // one of a peer that asks and does not take them.
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    return self.violation(core, "region queries whose answers it does not take");
                }
                Err(e) => {
                    tracing::warn!(peer = %self.peer, "cannot send a region: {e}");
                    answer.offset = Refusal::Malformed.code();
                }
            },
            None => {
                core.stats.puts_refused += 1;
                answer.offset = Refusal::BadKey.code();
            }
        }
        core.ctrl_queued += 1;
        self.control.out.push_back((answer, Vec::new()));
        Step::Moved
    }

    /// A peer wrote into one of our regions itself (shared memory) and
    /// says so.
    pub(super) fn put_done(&mut self, core: &mut Core, h: Header) -> Step {
        let notify = h.flags.contains(Flags::NOTIFY);
        if self.no_room(core, notify) {
            return Step::Idle;
        }
        self.rx.finish();
        match core.regions.check(h.key, h.offset, h.total) {
            Ok(_) => {
                core.stats.bytes_in += h.total;
                if notify {
                    core.ready.push_back(Ready::Placed {
                        from: self.peer,
                        transport: self.stream.transport(),
                        via: Some(self.id),
                        key: RegionKey(h.key),
                        offset: h.offset,
                        len: h.total as usize,
                    });
                }
            }
            Err(r) => {
                core.stats.bad_frames += 1;
                tracing::warn!(peer = %self.peer, "put notice for no region: {r}");
            }
        }
        Step::Moved
    }

    pub(super) fn region_info(&mut self, core: &mut Core, h: Header) -> Step {
        if h.len != 0 {
            return self.violation(core, "region answer with a payload");
        }
        self.rx.finish();
        self.frame_started = false;
        self.control.region_reply = Some(if h.offset != 0 {
            Err(Refusal::from_code(h.offset))
        } else {
            match self.stream.take_fd() {
                Some(fd) => Ok(RegionAnswer::Mapped {
                    key: h.key,
                    len: h.total as usize,
                    fd,
                }),
                None => return self.violation(core, "region answer without its memory"),
            }
        });
        Step::Moved
    }

    pub(super) fn put(&mut self, core: &mut Core, h: Header) -> Step {
        if !self.frame_started {
            match &self.asm {
                Asm::Idle => {
                    // Its answer, and its notice, are queued when the last
                    // fragment is in: room for them is made sure of now (a
                    // notice may so go one past the queue's cap for each
                    // connection, never more).
                    let notify = h.flags.contains(Flags::NOTIFY);
                    if self.no_room(core, notify) {
                        return Step::Idle;
                    }
                    self.asm = Asm::Put {
                        seq: h.seq,
                        key: h.key,
                        start: h.offset,
                        total: h.total,
                        got: 0,
                        region: core.regions.check(h.key, h.offset, h.total),
                        notify,
                    };
                }
                Asm::Put {
                    seq,
                    key,
                    start,
                    total,
                    got,
                    ..
                } => {
                    if h.seq != *seq
                        || h.key != *key
                        || h.total != *total
                        || h.offset != start + got
                        || got + u64::from(h.len) > *total
                    {
                        return self.violation(core, "put fragment does not continue its put");
                    }
                }
                _ => return self.violation(core, "put inside a message"),
            }
            self.frame_started = true;
        }
        let Asm::Put { region, got, .. } = &mut self.asm else {
            unreachable!("put state")
        };
        let end = h.offset as usize + h.len as usize;
        let mut moved = false;
        while self.rx.left() > 0 {
            let r = match region {
                Ok(i) => {
                    let at = end - self.rx.left();
                    let mem = core.regions.slot_mut(*i);
                    self.rx.payload(&mut self.stream, &mut mem[at..end])
                }
                Err(_) => self.rx.discard(&mut self.stream),
            };
            match r {
                Ok(0) => return Step::or_moved(moved),
                Ok(_) => moved = true,
                Err(e) => return core.broken(e.to_string()),
            }
        }
        self.rx.finish();
        self.frame_started = false;
        *got += u64::from(h.len);
        let Asm::Put {
            seq,
            key,
            start,
            total,
            got,
            region,
            notify,
        } = &self.asm
        else {
            unreachable!("put state")
        };
        if got < total {
            return Step::Moved;
        }
        let mut answer = Header::new(FrameKind::PutAck);
        answer.seq = *seq;
        match region {
            Ok(_) => {
                core.stats.bytes_in += total;
                if *notify {
                    core.ready.push_back(Ready::Placed {
                        from: self.peer,
                        transport: self.stream.transport(),
                        via: Some(self.id),
                        key: RegionKey(*key),
                        offset: *start,
                        len: *total as usize,
                    });
                }
            }
            Err(r) => {
                core.stats.puts_refused += 1;
                answer.kind = FrameKind::PutNack;
                answer.offset = r.code();
                tracing::debug!(peer = %self.peer, "put refused: {r}");
            }
        }
        core.ctrl_queued += 1;
        self.control.out.push_back((answer, Vec::new()));
        self.asm = Asm::Idle;
        Step::Moved
    }
}

/// Shared memory: the target's regions mapped into this process, written
/// in place.
impl<S: ByteStream> OneSided for Framed<S> {
    fn find(&self, key: u64) -> Option<usize> {
        self.remote.iter().position(|r| r.key == key)
    }

    fn adopt(&mut self, answer: RegionAnswer) -> io::Result<usize> {
        let RegionAnswer::Mapped { key, len, fd } = answer else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "a region answer of another transport",
            ));
        };
        self.remote.push(RemoteRegion::map(key, len, fd)?);
        Ok(self.remote.len() - 1)
    }

    fn len(&self, i: usize) -> usize {
        self.remote[i].len
    }

    fn revoked(&self, i: usize) -> bool {
        self.remote[i].revoked()
    }

    fn forget(&mut self, i: usize) {
        self.remote.swap_remove(i);
    }

    fn write(&mut self, i: usize, offset: usize, data: &[u8]) -> io::Result<()> {
        self.remote[i].fill(offset, data.len(), |dst| {
            dst.copy_from_slice(data);
            Ok(())
        })
    }

    fn fill(
        &mut self,
        i: usize,
        offset: usize,
        len: usize,
        _scratch: &mut IoBuf,
        fill: &mut dyn FnMut(&mut [u8]) -> io::Result<()>,
    ) -> io::Result<()> {
        self.remote[i].fill(offset, len, fill)
    }
}
