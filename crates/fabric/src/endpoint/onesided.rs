//! The put mode of an endpoint: registered regions and one-sided writes
//! into a target's region (RDMA write), with `put_from` filling the target's
//! region in place where the transport maps it.

use macrolink_wire::{Flags, FrameKind, Header, Refusal, MAX_FRAME};

use super::put::{PutStatus, RemoteRegion};
use super::{Deadline, Endpoint, Route};
use crate::error::{Error, Result};
use crate::iobuf::IoBuf;
use crate::transport::Stream;
use crate::types::{Addr, Mode, PutHandle, RegionKey, Target};

impl Endpoint {
    /// Registers a region of `len` zeroed bytes that peers may put into.
    pub fn register(&mut self, len: usize) -> Result<RegionKey> {
        Ok(self.core.regions.register(len)?)
    }

    /// Removes a region; later puts naming it are refused.
    pub fn deregister(&mut self, key: RegionKey) -> Result<()> {
        if self.core.regions.deregister(key) {
            Ok(())
        } else {
            Err(Error::NoSuchRegion)
        }
    }

    /// The bytes of a registered region.
    pub fn region(&self, key: RegionKey) -> Option<&[u8]> {
        self.core.regions.get(key)
    }

    /// The bytes of a registered region, to fill before peers read them.
    pub fn region_mut(&mut self, key: RegionKey) -> Option<&mut [u8]> {
        self.core.regions.get_mut(key)
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
        let (peer, slot, gen, shm) = self.put_route(t)?;
        if offset.checked_add(data.len() as u64).is_none() {
            return Err(Error::PutRefused(Refusal::OutOfBounds));
        }
        if shm {
            let fill = |dst: &mut [u8]| {
                dst.copy_from_slice(data);
                Ok(())
            };
            return self.put_direct(peer, slot, gen, data.len(), offset, key, notify, fill);
        }
        while self.core.puts.next_busy() {
            self.progress()?;
            if self.core.puts.next_busy() {
                self.idle(Deadline::Never)?;
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
        h.total = data.len() as u64;
        let mut off = 0;
        loop {
            let n = (data.len() - off).min(MAX_FRAME as usize);
            h.offset = offset + off as u64;
            h.len = n as u32;
            self.send_frame(peer, slot, gen, &h, &data[off..off + n])?;
            off += n;
            if off == data.len() {
                break;
            }
        }
        self.core.stats.bytes_out += data.len() as u64;
        Ok(PutHandle(seq))
    }

    /// The connection a put target's traffic takes, and whether it is
    /// shared memory (where puts go straight into the mapped region).
    fn put_route(&mut self, t: Target) -> Result<(Addr, u32, u32, bool)> {
        let e = self.entry(t)?;
        if e.mode != Mode::Put {
            return Err(Error::WrongMode(e.mode));
        }
        let Route::Conn { slot, gen } = e.route else {
            return Err(Error::BadTarget);
        };
        let shm = matches!(self.conn_mut(e.peer, slot, gen)?.stream, Stream::Shm(_));
        Ok((e.peer, slot, gen, shm))
    }

    /// Posts a put of `len` bytes that `fill` writes: over shared memory
    /// straight into the target's mapped region (reading a file into it
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
        let (peer, slot, gen, shm) = self.put_route(t)?;
        if shm {
            return self.put_direct(peer, slot, gen, len, offset, key, notify, fill);
        }
        scratch.ensure(len)?;
        fill(&mut scratch[..len])?;
        self.put(t, &scratch[..len], offset, key, notify)
    }

    /// Shared memory: writes straight into the target's mapped region, one
    /// copy, no work for the target; tells it afterwards when asked to.
    #[allow(clippy::too_many_arguments)]
    fn put_direct(
        &mut self,
        peer: Addr,
        slot: u32,
        gen: u32,
        len: usize,
        offset: u64,
        key: RegionKey,
        notify: bool,
        fill: impl FnOnce(&mut [u8]) -> std::io::Result<()>,
    ) -> Result<PutHandle> {
        let i = self.remote_region(peer, slot, gen, key)?;
        let conn = self.conn_mut(peer, slot, gen)?;
        if conn.remote[i].revoked() {
            // Deregistered: refused, as the target itself would; the next
            // put naming the key asks it again.
            conn.remote.swap_remove(i);
            self.core.stats.puts_refused += 1;
            return Err(Error::PutRefused(Refusal::BadKey));
        }
        let region = &conn.remote[i];
        match offset.checked_add(len as u64) {
            Some(end) if end <= region.len as u64 => region.fill(offset as usize, len, fill)?,
            _ => return Err(Error::PutRefused(Refusal::OutOfBounds)),
        }
        let seq = self.core.puts.post(slot, gen);
        self.core.puts.complete(seq, PutStatus::Done);
        if notify {
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

    /// Index of the target's region `key` among the connection's mapped
    /// regions, asking the target for it the first time.
    fn remote_region(&mut self, peer: Addr, slot: u32, gen: u32, key: RegionKey) -> Result<usize> {
        let conn = self.conn_mut(peer, slot, gen)?;
        if let Some(i) = conn.remote.iter().position(|r| r.key == key.0) {
            return Ok(i);
        }
        conn.region_reply = None;
        let mut q = Header::new(FrameKind::RegionQuery);
        q.src_node = self.node.id;
        q.src_ep = self.id;
        q.dst_ep = peer.ep;
        q.key = key.0;
        self.send_frame(peer, slot, gen, &q, &[])?;
        loop {
            if let Some(reply) = self.conn_mut(peer, slot, gen)?.region_reply.take() {
                let (k, len, fd) = reply.map_err(Error::PutRefused)?;
                if k != key.0 {
                    continue;
                }
                let region = RemoteRegion::map(k, len, fd)?;
                let conn = self.conn_mut(peer, slot, gen)?;
                conn.remote.push(region);
                return Ok(conn.remote.len() - 1);
            }
            if !self.progress()? {
                self.idle(Deadline::Never)?;
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
                PutStatus::Pending { .. } => {
                    if !self.progress()? {
                        self.idle(Deadline::Never)?;
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
