//! The put mode of an endpoint: registered regions and one-sided writes
//! into a target's region (RDMA write). Over a transport with one-sided
//! puts (shared memory, UCX) the initiator asks the target once for the
//! region and then writes into it without the target's help; elsewhere
//! (tcp) a put is a frame the target places.
//!
//! A region's memory is written by peers at any time, so the application
//! never holds a reference into it: it copies in and out
//! ([`read_region`](Endpoint::read_region),
//! [`write_region`](Endpoint::write_region)) and reads a range once the
//! put that wrote it was notified.

use macrolink_wire::{Flags, FrameKind, Header, Refusal};
use std::cell::OnceCell;
use std::ptr::NonNull;

use super::{Deadline, Endpoint, Route};
use crate::error::{Error, Result};
use crate::iobuf::IoBuf;
use crate::puts::PutStatus;
use crate::types::{Addr, Mode, PutHandle, RegionKey, Target};

/// Where a one-sided put's bytes come from.
enum Source<'a, F> {
    Data(&'a [u8]),
    Fill(&'a mut IoBuf, F),
}

impl Endpoint {
    /// Registers a region of `len` zeroed bytes that peers may put into.
    pub fn register(&mut self, len: usize) -> Result<RegionKey> {
        Ok(self.core.regions.register(len)?)
    }

    /// Removes a region; later puts naming it are refused. UCX peers that
    /// hold its key are told; until each has taken it back, its memory
    /// stays mapped (and no longer the application's).
    pub fn deregister(&mut self, key: RegionKey) -> Result<()> {
        let holders = self
            .core
            .regions
            .deregister(key)
            .ok_or(Error::NoSuchRegion)?;
        for (slot, gen) in holders {
            let conn = self.slots.get_mut(slot as usize).filter(|s| s.gen == gen);
            if let Some(c) = conn.and_then(|s| s.conn.as_mut()) {
                let mut h = Header::new(FrameKind::Revoke);
                h.key = key.0;
                c.link.control().out.push_back((h, Vec::new()));
                self.core.ctrl_queued += 1;
            }
        }
        self.flush_ctrl();
        Ok(())
    }

    /// The length of a registered region.
    pub fn region_len(&self, key: RegionKey) -> Option<usize> {
        self.core.regions.len(key)
    }

    /// Copies `dst.len()` bytes at `offset` of a registered region out. A
    /// range a put is writing meanwhile may come out as a mix of old and
    /// new bytes: read it once the put was notified.
    pub fn read_region(&self, key: RegionKey, offset: usize, dst: &mut [u8]) -> Result<()> {
        let len = self.region_len(key).ok_or(Error::NoSuchRegion)?;
        self.core
            .regions
            .read(key, offset, dst)
            .ok_or(Error::OutsideRegion {
                offset,
                len: dst.len(),
                region: len,
            })
    }

    /// Copies `src` into a registered region at `offset`, before peers read
    /// it (with puts of their own, or as an application protocol says).
    pub fn write_region(&mut self, key: RegionKey, offset: usize, src: &[u8]) -> Result<()> {
        let len = self.region_len(key).ok_or(Error::NoSuchRegion)?;
        self.core
            .regions
            .write(key, offset, src)
            .ok_or(Error::OutsideRegion {
                offset,
                len: src.len(),
                region: len,
            })
    }

    /// The first byte and length of a registered region, for code that
    /// reads and writes it through the pointer (the C interface). Peers
    /// write into it at any time: dereferencing the pointer is `unsafe`,
    /// and sound only for ranges no put is writing (as with RDMA, the
    /// application learns that from notifications). Valid until the
    /// region is deregistered or the endpoint closed.
    pub fn region_ptr(&self, key: RegionKey) -> Option<(NonNull<u8>, usize)> {
        let (p, len) = self.core.regions.raw(key)?;
        Some((NonNull::new(p)?, len))
    }

    /// Posts a one-sided write of `data` at `offset` of the target's region
    /// `key`. With `notify` the target's next read reports the placed bytes.
    /// Complete it with [`wait_put`](Self::wait_put).
    pub fn put(
        &mut self,
        t: Target,
        data: &[u8],
        offset: u64,
        key: RegionKey,
        notify: bool,
    ) -> Result<PutHandle> {
        let (peer, slot, gen, one_sided) = self.put_route(t)?;
        if offset.checked_add(data.len() as u64).is_none() {
            return Err(Error::PutRefused(Refusal::OutOfBounds));
        }
        if one_sided {
            let src = Source::<fn(&mut [u8]) -> std::io::Result<()>>::Data(data);
            return self.put_one_sided(peer, slot, gen, data.len(), offset, key, notify, src);
        }
        while self.core.puts.next_busy() {
            self.progress()?;
            if self.core.puts.next_busy() {
                self.idle(Deadline::Never, &OnceCell::new(), None)?;
            }
        }
        self.conn_mut(peer, slot, gen)?;
        let seq = self.core.puts.post(slot, gen);
        let mut h = Header::new(FrameKind::Put);
        h.flags = if notify {
            Flags::NOTIFY
        } else {
            Flags::default()
        };
        h.src_node = self.node.id;
        h.src_ep = self.id;
        h.dst_ep = peer.ep;
        h.seq = seq;
        h.key = key.0;
        h.offset = offset;
        h.total = data.len() as u64;
        self.send_frame(peer, slot, gen, &h, data)?;
        self.core.stats.bytes_out += data.len() as u64;
        Ok(PutHandle(seq))
    }

    /// Asks the target of `t` for region `key` and goes on without the
    /// answer: a peer that asks and never takes the answers, for tests.
    #[cfg(test)]
    pub(crate) fn ask_region_and_go(&mut self, t: Target, key: RegionKey) -> Result<()> {
        let (peer, slot, gen, _) = self.put_route(t)?;
        let q = self.region_query(peer, key);
        self.send_frame(peer, slot, gen, &q, &[])
    }

    /// How many answers of connections gone its UCX worker holds.
    #[cfg(test)]
    pub(crate) fn ucx_orphans(&self) -> usize {
        self.ucx.as_ref().map_or(0, |p| p.orphans())
    }

    /// The question to `peer` for its region `key`.
    fn region_query(&self, peer: Addr, key: RegionKey) -> Header {
        let mut q = Header::new(FrameKind::RegionQuery);
        q.src_node = self.node.id;
        q.src_ep = self.id;
        q.dst_ep = peer.ep;
        q.key = key.0;
        q
    }

    /// The connection a put target's traffic takes, and whether its
    /// transport puts one-sided.
    fn put_route(&mut self, t: Target) -> Result<(Addr, u32, u32, bool)> {
        let e = self.entry(t)?;
        if e.mode != Mode::Put {
            return Err(Error::WrongMode(e.mode));
        }
        let Route::Conn { slot, gen } = e.route else {
            return Err(Error::BadTarget);
        };
        let one_sided = self.conn_mut(e.peer, slot, gen)?.link.caps().one_sided_put;
        Ok((e.peer, slot, gen, one_sided))
    }

    /// Posts a put of `len` bytes that `fill` writes: where the transport
    /// maps the target's region, straight into it (reading a file into it
    /// costs one copy in all), elsewhere through `scratch` (page-aligned, so
    /// that a file read into it runs at full speed). `fill` must write the
    /// whole slice it is given; an error from it posts nothing.
    #[allow(clippy::too_many_arguments)]
    pub fn put_from(
        &mut self,
        t: Target,
        len: usize,
        offset: u64,
        key: RegionKey,
        notify: bool,
        scratch: &mut IoBuf,
        fill: impl FnOnce(&mut [u8]) -> std::io::Result<()>,
    ) -> Result<PutHandle> {
        let (peer, slot, gen, one_sided) = self.put_route(t)?;
        if one_sided {
            let src = Source::Fill(scratch, fill);
            return self.put_one_sided(peer, slot, gen, len, offset, key, notify, src);
        }
        scratch.ensure(len)?;
        fill(&mut scratch[..len])?;
        self.put(t, &scratch[..len], offset, key, notify)
    }

    /// Writes into the target's region without its help; tells it
    /// afterwards, once the bytes are placed, when asked to.
    #[allow(clippy::too_many_arguments)]
    fn put_one_sided<F>(
        &mut self,
        peer: Addr,
        slot: u32,
        gen: u32,
        len: usize,
        offset: u64,
        key: RegionKey,
        notify: bool,
        src: Source<'_, F>,
    ) -> Result<PutHandle>
    where
        F: FnOnce(&mut [u8]) -> std::io::Result<()>,
    {
        let i = self.remote_region(peer, slot, gen, key)?;
        let os = self.one_sided(peer, slot, gen)?;
        if os.revoked(i) {
            // Deregistered: refused, as the target itself would; the next
            // put naming the key asks it again.
            os.forget(i);
            self.core.stats.puts_refused += 1;
            return Err(Error::PutRefused(Refusal::BadKey));
        }
        match offset.checked_add(len as u64) {
            Some(end) if end <= os.len(i) as u64 => {}
            _ => return Err(Error::PutRefused(Refusal::OutOfBounds)),
        }
        match src {
            Source::Data(d) => os.write(i, offset as usize, d)?,
            Source::Fill(scratch, f) => {
                let mut f = Some(f);
                let mut once = |dst: &mut [u8]| match f.take() {
                    Some(f) => f(dst),
                    None => Ok(()),
                };
                os.fill(i, offset as usize, len, scratch, &mut once)?
            }
        }
        let placed = os.flush()?;
        while let Some(old) = self.core.puts.oldest_busy() {
            self.wait_put(PutHandle(old))?;
        }
        let seq = self.core.puts.post(slot, gen);
        if placed {
            self.core.puts.complete(seq, PutStatus::Done);
        }
        if notify {
            // The notice must not overtake the bytes it announces.
            self.wait_put(PutHandle(seq))?;
            let mut h = Header::new(FrameKind::PutDone);
            h.flags = Flags::NOTIFY;
            h.src_node = self.node.id;
            h.src_ep = self.id;
            h.dst_ep = peer.ep;
            h.seq = seq;
            h.key = key.0;
            h.offset = offset;
            h.total = len as u64;
            self.send_frame(peer, slot, gen, &h, &[])?;
        }
        self.core.stats.bytes_out += len as u64;
        Ok(PutHandle(seq))
    }

    /// The one-sided side of a connection.
    fn one_sided(
        &mut self,
        peer: Addr,
        slot: u32,
        gen: u32,
    ) -> Result<&mut dyn crate::transport::OneSided> {
        self.conn_mut(peer, slot, gen)?
            .link
            .one_sided()
            .ok_or(Error::WrongMode(Mode::Put))
    }

    /// Index of the target's region `key` among the connection's reached
    /// regions, asking the target for it the first time.
    fn remote_region(&mut self, peer: Addr, slot: u32, gen: u32, key: RegionKey) -> Result<usize> {
        if let Some(i) = self.one_sided(peer, slot, gen)?.find(key.0) {
            return Ok(i);
        }
        self.conn_mut(peer, slot, gen)?.link.control().region_reply = None;
        let q = self.region_query(peer, key);
        self.send_frame(peer, slot, gen, &q, &[])?;
        loop {
            let conn = self.conn_mut(peer, slot, gen)?;
            if let Some(reply) = conn.link.control().region_reply.take() {
                let answer = reply.map_err(Error::PutRefused)?;
                let i = self.one_sided(peer, slot, gen)?.adopt(answer)?;
                if self.one_sided(peer, slot, gen)?.find(key.0) == Some(i) {
                    return Ok(i);
                }
                continue;
            }
            if !self.progress()? {
                self.idle(Deadline::Never, &OnceCell::new(), None)?;
            }
        }
    }

    /// Waits until the target has placed the put, or refused it.
    pub fn wait_put(&mut self, h: PutHandle) -> Result<()> {
        loop {
            match self.core.puts.status(h.0) {
                PutStatus::Done => return Ok(()),
                PutStatus::Refused(r) => return Err(Error::PutRefused(r)),
                PutStatus::Lost(peer) => {
                    return Err(Error::PeerLost {
                        peer,
                        reason: "connection lost before the put was answered".into(),
                    })
                }
                PutStatus::Pending { slot, gen } => {
                    // A one-sided put is placed once its connection's
                    // puts are flushed to the target's memory.
                    let flushed = self
                        .slots
                        .get_mut(slot as usize)
                        .filter(|s| s.gen == gen)
                        .and_then(|s| s.conn.as_mut())
                        .and_then(|c| c.link.one_sided())
                        .map(|os| os.flush())
                        .transpose();
                    match flushed {
                        Ok(Some(true)) => {
                            self.core.puts.flushed(slot, gen, u64::MAX);
                            continue;
                        }
                        Ok(_) => {}
                        Err(e) => {
                            let reason = e.to_string();
                            self.lose(slot as usize, reason);
                            continue;
                        }
                    }
                    if !self.progress()? {
                        self.idle(Deadline::Never, &OnceCell::new(), None)?;
                    }
                }
            }
        }
    }

    /// Posts a put and waits for it to be placed.
    pub fn put_wait(
        &mut self,
        t: Target,
        data: &[u8],
        offset: u64,
        key: RegionKey,
        notify: bool,
    ) -> Result<()> {
        let h = self.put(t, data, offset, key, notify)?;
        self.wait_put(h)
    }
}
