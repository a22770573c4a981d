//! An endpoint's UCX worker: what arrives over UCX for any of its
//! connections comes in here, and goes where it belongs.
//!
//! One pass ([`Port::progress`]): progress the worker; take the datagrams
//! that the active-message handler left in its ring; then probe for tagged
//! messages and hand each to its connection by the index in its tag:
//!
//! - a reliable message goes straight into the waiting reader's buffer
//!   when it fits and nothing waits before it, else into the token pool
//!   when that has room, else it stays with UCX ([`Pending`]) until it is
//!   read, straight into the reader's buffer then;
//! - a control message (region query and answer, put notice, revocation,
//!   credit) is answered at once.
//!
//! Taking a reliable message off UCX earns its sender credit, returned in
//! batches. Messages whose tag names no connection of the endpoint, or
//! carries the wrong token, are dropped and counted as strangers.

use macrolink_wire::ucx::{Tag, TagKind, MAX_ADDRESS};
use macrolink_wire::{Flags, FrameKind, Header, Refusal, HEADER_LEN};
use std::ffi::c_void;
use std::io;
use std::os::fd::RawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::conn::Conn;
use super::ffi::{self, Posted, Ucp};
use super::held::{Answer, Held, ANSWERS_CAP, TOTAL_CAP};
use super::{
    control_bytes_into, error, finish, Contact, Context, Refused, Shared, Worker, CREDITS,
    DATAGRAM_AM,
};
use crate::rx::{Body, Core, Ready, Step};
use crate::transport::sys::{self, Interest};
use crate::transport::{Connection, RegionAnswer};
use crate::types::{Addr, Completion, Mode, Recv, RecvKind, RegionKey, Transport};

/// Datagrams the handler keeps between two passes; more are dropped.
const RING: usize = 64;
/// Tagged messages taken off UCX in one pass, at most.
const PROBES_PER_PASS: usize = 64;
/// Messages kept for connections their endpoint has not taken yet, at
/// most; past that, the rest wait with UCX until it has.
const LIMBO_CAP: usize = 4096;
/// Largest control message: a header, an address and a packed key.
const MAX_CONTROL: usize = HEADER_LEN + 8 + MAX_ADDRESS;

/// A reliable message left with UCX until it is read.
#[derive(Debug)]
pub(crate) struct Pending {
    msg: ffi::TagMessage,
    index: u16,
    /// The connection's token: an index given back and handed to another
    /// connection since is not credited for this message.
    token: u64,
}

// SAFETY: the message handle is UCX's, used only by the thread that owns
// the endpoint (and with it the worker the handle belongs to).
unsafe impl Send for Pending {}

/// One connection as the worker knows it.
#[derive(Debug)]
struct Entry {
    token: u64,
    slot: u32,
    gen: u32,
    peer: Addr,
    /// The connection's UCP endpoint, to answer on.
    ep: ffi::Ep,
    /// The tag of control messages to the peer.
    tx_control: u64,
    /// Messages taken off UCX since the last credit went back.
    owed: u32,
}

/// The worker's connections by index: indices are small and dense (the
/// endpoint hands them out lowest first), so a vector is the map.
#[derive(Debug)]
struct Table(Vec<Option<Entry>>);

impl Table {
    fn get(&self, i: &u16) -> Option<&Entry> {
        self.0.get(*i as usize).and_then(Option::as_ref)
    }

    fn get_mut(&mut self, i: &u16) -> Option<&mut Entry> {
        self.0.get_mut(*i as usize).and_then(Option::as_mut)
    }

    fn insert(&mut self, i: u16, e: Entry) {
        let i = i as usize;
        if self.0.len() <= i {
            self.0.resize_with(i + 1, || None);
        }
        self.0[i] = Some(e);
    }

    fn len(&self) -> usize {
        self.0.iter().flatten().count()
    }
}

impl std::ops::Index<&u16> for Table {
    type Output = Entry;
    fn index(&self, i: &u16) -> &Entry {
        self.get(i).expect("a connection of the table")
    }
}

/// Datagrams the active-message handler copied out of UCX, waiting for the
/// next pass.
struct Ring {
    mtu: usize,
    data: Box<[u8]>,
    lens: [usize; RING],
    tags: [u64; RING],
    head: usize,
    len: usize,
    dropped: u64,
}

/// What the active-message handler does with a datagram: keeps a copy in
/// the ring, or drops it (ring full, too large, or not eager).
///
/// # Safety
/// UCX calls it during `ucp_worker_progress` on the thread that drives the
/// worker, with `arg` the ring registered with the handler and valid
/// `header` and `data` for their lengths.
unsafe extern "C" fn on_datagram(
    arg: *mut c_void,
    header: *const c_void,
    header_length: usize,
    data: *mut c_void,
    length: usize,
    param: *const ffi::AmRecvParam,
) -> ffi::Status {
    // SAFETY: `arg` is the port's ring, alive while the worker is, and
    // touched by nobody else while the worker progresses.
    let ring = unsafe { &mut *arg.cast::<Ring>() };
    // SAFETY: UCX passes a valid parameter block.
    let rndv = unsafe { (*param).recv_attr } & ffi::UCP_AM_RECV_ATTR_FLAG_RNDV != 0;
    if header_length != 8 || rndv || length > ring.mtu || ring.len == RING {
        ring.dropped += 1;
        return ffi::UCS_OK;
    }
    let mut tag = [0u8; 8];
    // SAFETY: UCX hands `header_length` (8) valid bytes at `header` and
    // `length` at `data`, which fits the slot (checked above).
    unsafe {
        std::ptr::copy_nonoverlapping(header.cast::<u8>(), tag.as_mut_ptr(), 8);
        let slot = (ring.head + ring.len) % RING;
        let dst = ring.data.as_mut_ptr().add(slot * ring.mtu);
        std::ptr::copy_nonoverlapping(data.cast::<u8>(), dst, length);
        ring.lens[slot] = length;
        ring.tags[slot] = u64::from_le_bytes(tag);
    }
    ring.len += 1;
    ffi::UCS_OK
}

/// The endpoint's connections, as the worker finds them to hand over what
/// it received for them.
pub(crate) trait Conns {
    /// The UCX connection at (`slot`, `gen`), if it is still there.
    fn get(&mut self, slot: u32, gen: u32) -> Option<&mut Conn>;
}

/// An endpoint's UCP worker and the connections it serves.
pub(crate) struct Port {
    ucp: &'static Ucp,
    ctx: Arc<Context>,
    /// Boxed: connections keep its address.
    worker: Box<Worker>,
    efd: RawFd,
    shared: Arc<Shared>,
    /// The connections, by their index here.
    table: Table,
    /// The handler's ring, owned here (from `Box::into_raw`).
    ring: *mut Ring,
    /// Probed messages of a connection that a handshake agreed on but the
    /// endpoint had not taken yet (the peer heard the answer first): tried
    /// again every pass until it has, or until the handshake's index is
    /// given back.
    limbo: Vec<(ffi::TagMessage, ffi::TagRecvInfo)>,
    /// Control messages and credit this side sent, with their bytes,
    /// until UCX is done with them.
    held: Held,
    /// Whom the acceptors refuse for them.
    refused: Refused,
    control: Box<[u8]>,
    spaces: Vec<(*mut u8, usize)>,
    iov: Vec<ffi::DtIov>,
    /// Datagrams and messages of strangers dropped.
    strangers: u64,
    /// A connection owes its peer half a window of credit or more (see
    /// [`Port::took`]).
    credit_due: bool,
    /// Buffers of control messages UCX had done with at once, for the
    /// next ones (credit goes back every 32 messages: no allocation each
    /// time).
    spare: Vec<Vec<u8>>,
}

/// Spare control buffers a port keeps.
const SPARE: usize = 4;

// SAFETY: the worker and everything hanging off it (ring, message
// handles, requests, endpoint handles) is used only by the thread that
// owns the endpoint; the worker is created in serialized mode, so moving
// the endpoint to another thread between calls is allowed.
unsafe impl Send for Port {}

impl std::fmt::Debug for Port {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Port")
            .field("connections", &self.table.len())
            .field("strangers", &self.strangers)
            .finish()
    }
}

impl Port {
    /// A worker on `ctx` for one endpoint whose datagrams carry at most
    /// `mtu` bytes.
    pub(crate) fn open(ctx: &Arc<Context>, mtu: usize) -> io::Result<Port> {
        let ucp = ctx.ucp;
        let params = ffi::WorkerParams {
            field_mask: ffi::UCP_WORKER_PARAM_FIELD_THREAD_MODE
                | ffi::UCP_WORKER_PARAM_FIELD_EVENTS,
            thread_mode: ffi::UCS_THREAD_MODE_SERIALIZED,
            cpu_mask: [0; 16],
            events: ffi::UCP_WAKEUP_RX | ffi::UCP_WAKEUP_TX,
            user_data: std::ptr::null_mut(),
            event_fd: -1,
        };
        let mut h = std::ptr::null_mut();
        // SAFETY: a valid parameter block; `h` is an out-pointer.
        let s = unsafe { (ucp.worker_create)(ctx.h, &params, &mut h) };
        if s != ffi::UCS_OK {
            return Err(error(ucp, "ucp_worker_create", s));
        }
        let ring = Box::into_raw(Box::new(Ring {
            mtu,
            data: vec![0u8; RING * mtu].into_boxed_slice(),
            lens: [0; RING],
            tags: [0; RING],
            head: 0,
            len: 0,
            dropped: 0,
        }));
        // From here on, dropping `port` cleans up.
        let mut port = Port {
            ucp,
            ctx: ctx.clone(),
            worker: Box::new(Worker {
                h,
                ucp,
                stirred: std::cell::Cell::new(false),
            }),
            efd: -1,
            shared: Arc::new(Shared::new(Vec::new())),
            table: Table(Vec::new()),
            ring,
            limbo: Vec::new(),
            held: Held::default(),
            refused: Refused::default(),
            control: vec![0u8; MAX_CONTROL].into_boxed_slice(),
            spaces: Vec::new(),
            iov: Vec::new(),
            strangers: 0,
            credit_due: false,
            spare: Vec::new(),
        };
        let mut efd = -1;
        // SAFETY: a live worker; `efd` is an out-pointer.
        let s = unsafe { (ucp.worker_get_efd)(h, &mut efd) };
        if s != ffi::UCS_OK {
            return Err(error(ucp, "ucp_worker_get_efd", s));
        }
        port.efd = efd;
        let handler = ffi::AmHandlerParam {
            field_mask: ffi::UCP_AM_HANDLER_PARAM_FIELD_ID
                | ffi::UCP_AM_HANDLER_PARAM_FIELD_FLAGS
                | ffi::UCP_AM_HANDLER_PARAM_FIELD_CB
                | ffi::UCP_AM_HANDLER_PARAM_FIELD_ARG,
            id: DATAGRAM_AM,
            flags: ffi::UCP_AM_FLAG_WHOLE_MSG,
            cb: Some(on_datagram),
            arg: ring.cast(),
        };
        // SAFETY: a live worker; the ring outlives it (freed after the
        // worker is destroyed, in Drop).
        let s = unsafe { (ucp.worker_set_am_recv_handler)(h, &handler) };
        if s != ffi::UCS_OK {
            return Err(error(ucp, "ucp_worker_set_am_recv_handler", s));
        }
        let (mut addr, mut len) = (std::ptr::null_mut(), 0usize);
        // SAFETY: a live worker; out-pointers.
        let s = unsafe { (ucp.worker_get_address)(h, &mut addr, &mut len) };
        if s != ffi::UCS_OK {
            return Err(error(ucp, "ucp_worker_get_address", s));
        }
        // SAFETY: UCX handed out `len` bytes at `addr`, released after the
        // copy.
        let address = unsafe { std::slice::from_raw_parts(addr.cast::<u8>(), len) }.to_vec();
        // SAFETY: the address just obtained from this worker, released once.
        unsafe { (ucp.worker_release_address)(h, addr) };
        if address.len() > MAX_ADDRESS {
            return Err(io::Error::other(format!(
                "the UCX worker's address has {} bytes, more than {MAX_ADDRESS}",
                address.len()
            )));
        }
        port.shared = Arc::new(Shared::new(address));
        Ok(port)
    }

    /// What the endpoint's acceptors give peers that connect over UCX.
    pub(crate) fn contact_card(&self) -> Arc<Shared> {
        self.shared.clone()
    }

    /// The connection a handshake agreed on, at `id` (slot, generation) of
    /// the endpoint.
    pub(crate) fn connect(
        &mut self,
        c: Contact,
        peer: Addr,
        id: (u32, u32),
    ) -> crate::error::Result<Conn> {
        let tx_control = Tag {
            kind: TagKind::Control,
            index: c.peer.index,
            token: c.peer.token,
        }
        .encode();
        let Contact {
            sock,
            index,
            token,
            peer: card,
            guard,
            accepted,
        } = c;
        let worker: *const Worker = &*self.worker;
        let make = |failures| Conn::new(self.ucp, worker, self.efd, &sock, &card, peer, failures);
        let made = match make(self.ctx.failures()) {
            Ok(Some(c)) => Ok(c),
            Ok(None) => {
                // UCX's transports here cannot report a peer's failure
                // (shared memory): the contact socket tells of it instead.
                tracing::debug!("UCX reports no peer failures here; the contact socket will");
                self.ctx.no_failures();
                make(false).and_then(|c| c.ok_or(crate::error::Error::NoUcx))
            }
            Err(e) => Err(e),
        };
        let conn = match made {
            Ok(c) => c,
            // A peer that wrote and went before its connection here was
            // taken (its shared memory gone with it): what it sent is
            // already here, and is delivered before the loss.
            Err(e) if accepted => {
                tracing::debug!(%peer, "UCX cannot reach the peer: {e}");
                let why = format!("UCX cannot reach {peer}: {e}");
                Conn::unreachable(self.ucp, worker, self.efd, &sock, &card, peer, why)?
            }
            Err(e) => return Err(e),
        };
        guard.keep();
        self.table.insert(
            index,
            Entry {
                token,
                slot: id.0,
                gen: id.1,
                peer,
                ep: conn.ep(),
                tx_control,
                owed: 0,
            },
        );
        Ok(conn)
    }

    /// Forgets the connection at (`slot`, `gen`), which is going away.
    pub(crate) fn forget(&mut self, slot: u32, gen: u32) {
        if self.held.has_live() {
            self.reap();
        }
        for (i, e) in self.table.0.iter_mut().enumerate() {
            if let Some(gone) = e.take_if(|e| e.slot == slot && e.gen == gen) {
                self.shared.free(i as u16);
                // Answers UCX still holds for it (a peer that took none of
                // them: UCX may not end them when the connection closes)
                // are looked at now and then, not on each pass.
                self.held.orphan(i as u16, gone.token);
            }
        }
    }

    /// Frees the answers of connections gone that UCX has ended.
    fn reap_gone(&mut self) {
        let ucp = self.ucp;
        // SAFETY: live requests of this worker, each freed once, when done.
        self.held.reap_gone(|req| unsafe { finished(ucp, req) });
        self.publish();
    }

    /// Tells the acceptors whom to refuse, if that changed.
    fn publish(&mut self) {
        let Some(refused) = self.held.changed() else {
            return;
        };
        if refused != self.refused {
            if refused != Refused::default() {
                tracing::warn!(
                    held = self.held.total(),
                    nodes = ?refused.nodes,
                    all = refused.all,
                    "UCX holds answers that peers of these nodes never took: \
                     no new UCX connection with them until it ends them"
                );
            }
            self.shared.refuse(refused.clone());
            self.refused = refused;
        }
    }

    /// How many answers of connections gone UCX holds.
    #[cfg(test)]
    pub(crate) fn orphans(&self) -> usize {
        self.held.gone()
    }

    /// Prepares to sleep on the worker's descriptor; false when it has
    /// work now.
    pub(crate) fn arm(&mut self) -> bool {
        // SAFETY: a live worker, driven by this thread.
        let s = unsafe { (self.ucp.worker_arm)(self.worker.h) };
        s == ffi::UCS_OK
    }

    /// The descriptor to poll while sleeping.
    pub(crate) fn raw_fd(&self) -> RawFd {
        self.efd
    }

    /// One pass (see the module's doc); `conn` finds the endpoint's
    /// connections. A pass that finds nothing is inlined into the loop
    /// that makes it, what follows when something came is not: a busy
    /// polling reader's look is the worker's progress and a few loads.
    #[inline(always)]
    pub(crate) fn progress(
        &mut self,
        core: &mut Core,
        user: Option<&mut [u8]>,
        conn: &mut dyn Conns,
    ) -> Step {
        if self.credit_due {
            self.give_due_credit();
        }
        let progressed = self.worker.progress();
        if self.held.tick() {
            self.reap_gone();
        }
        // Nothing moved since the last look: nothing came to look for.
        let stirred = self.worker.stirred();
        if !stirred && self.limbo.is_empty() && self.ring_is_empty() {
            return Step::Idle;
        }
        self.stirred(core, user, conn, progressed)
    }

    /// The rest of a pass whose worker stirred (in it, if `progressed`),
    /// or that has datagrams or parked messages to hand over.
    #[inline(never)]
    fn stirred(
        &mut self,
        core: &mut Core,
        mut user: Option<&mut [u8]>,
        conn: &mut dyn Conns,
        progressed: bool,
    ) -> Step {
        let ring = !self.ring_is_empty();
        // Until the probe below finds UCX empty, the next pass looks again.
        self.worker.stirred.set(true);
        if self.held.has_live() {
            self.reap();
        }
        if let Some(step) = self.datagrams(core, &mut user) {
            return step;
        }
        // What moved: the worker in this pass, datagrams staged, or what the
        // probe finds. A look again after a delivery that finds the worker
        // empty moved nothing: a reader's next pass is idle, not busy.
        let mut moved = progressed || ring;
        let mut limbo = std::mem::take(&mut self.limbo).into_iter();
        while let Some((msg, info)) = limbo.next() {
            let parked = self.limbo.len();
            let step = self.dispatch(msg, info, core, &mut user, conn);
            // Parked again: its connection is still on the way.
            moved |= self.limbo.len() == parked;
            if let Some(step) = step {
                self.limbo.extend(limbo);
                return step;
            }
        }
        for _ in 0..PROBES_PER_PASS {
            if core.ready.len() >= core.ready_cap || self.limbo.len() >= LIMBO_CAP {
                break;
            }
            let mut info = ffi::TagRecvInfo::default();
            // SAFETY: a live worker; `info` is an out-pointer.
            let msg = unsafe { (self.ucp.tag_probe_nb)(self.worker.h, 0, 0, 1, &mut info) };
            if msg.is_null() {
                self.worker.stirred.set(false);
                break;
            }
            moved = true;
            if let Some(step) = self.dispatch(msg, info, core, &mut user, conn) {
                return step;
            }
        }
        Step::or_moved(moved)
    }

    #[inline(always)]
    fn ring_is_empty(&self) -> bool {
        // SAFETY: the ring lives as long as the port; the handler touches
        // it only inside worker progress, which is not running now.
        let ring = unsafe { &*self.ring };
        ring.len == 0 && ring.dropped == 0
    }

    /// Hands over the datagrams the handler kept.
    fn datagrams(&mut self, core: &mut Core, user: &mut Option<&mut [u8]>) -> Option<Step> {
        // SAFETY: the ring lives as long as the port; the handler touches
        // it only inside worker progress, which is not running now.
        let ring = unsafe { &mut *self.ring };
        if ring.len == 0 && ring.dropped == 0 {
            return None;
        }
        core.stats.dropped_datagrams += std::mem::take(&mut ring.dropped);
        while ring.len > 0 {
            let slot = ring.head;
            ring.head = (ring.head + 1) % RING;
            ring.len -= 1;
            let data = &ring.data[slot * ring.mtu..slot * ring.mtu + ring.lens[slot]];
            let from = Tag::decode(ring.tags[slot])
                .filter(|t| t.kind == TagKind::Datagram)
                .and_then(|t| self.table.get(&t.index).filter(|e| e.token == t.token));
            let Some(e) = from else {
                self.strangers += 1;
                core.stats.bad_frames += 1;
                continue;
            };
            core.header_seen();
            let (peer, via) = (e.peer, Some((e.slot, e.gen)));
            if let Some(buf) = user.as_deref_mut() {
                if core.ready.is_empty() && buf.len() >= data.len() {
                    buf[..data.len()].copy_from_slice(data);
                    core.count_in(data.len());
                    return Some(core.deliver(Recv {
                        from: peer,
                        len: data.len(),
                        kind: RecvKind::Message(Mode::Datagram),
                        transport: Transport::Ucx,
                        via,
                    }));
                }
            }
            match core.stage(data) {
                Some(chain) => core.ready.push_back(Ready::Msg {
                    from: peer,
                    mode: Mode::Datagram,
                    transport: Transport::Ucx,
                    len: data.len(),
                    body: Body::Staged(chain),
                    via,
                }),
                None => core.stats.dropped_datagrams += 1,
            }
        }
        None
    }

    /// Takes one probed message where it belongs. A message of a
    /// connection that a handshake agreed on (its index is held with that
    /// token) but that the endpoint has not taken yet is parked until it
    /// has: the peer may send as soon as it hears the answer, before the
    /// node hands the connection to its endpoint.
    fn dispatch(
        &mut self,
        msg: ffi::TagMessage,
        info: ffi::TagRecvInfo,
        core: &mut Core,
        user: &mut Option<&mut [u8]>,
        conn: &mut dyn Conns,
    ) -> Option<Step> {
        let tag = Tag::decode(info.sender_tag);
        let known = tag.and_then(|t| self.table.get(&t.index).map(|e| e.token == t.token));
        let tag = match (tag, known) {
            (Some(t), Some(true)) => t,
            (Some(t), None) if self.shared.holds(t.index, t.token) => {
                self.limbo.push((msg, info));
                return None;
            }
            _ => {
                self.strangers += 1;
                core.stats.bad_frames += 1;
                tracing::debug!(
                    tag = info.sender_tag,
                    "dropped a UCX message of no connection"
                );
                self.discard(msg);
                return None;
            }
        };
        match tag.kind {
            TagKind::Data => self.data(msg, info.length, tag.index, core, user, conn),
            TagKind::Control => {
                self.control(msg, info.length, tag.index, core, conn);
                None
            }
            TagKind::Datagram => {
                self.violation(tag.index, core, conn, "a datagram sent as a tagged message");
                self.discard(msg);
                None
            }
        }
    }

    /// A reliable message of `len` bytes for connection `index`.
    fn data(
        &mut self,
        msg: ffi::TagMessage,
        len: usize,
        index: u16,
        core: &mut Core,
        user: &mut Option<&mut [u8]>,
        conn: &mut dyn Conns,
    ) -> Option<Step> {
        if len as u64 > core.max_message {
            self.violation(
                index,
                core,
                conn,
                "message larger than the endpoint accepts",
            );
            self.discard(msg);
            return None;
        }
        core.header_seen();
        let e = &self.table[&index];
        let (peer, via) = (e.peer, Some((e.slot, e.gen)));
        let fits = user.as_ref().is_some_and(|b| b.len() >= len);
        if fits && core.ready.is_empty() {
            let Some(buf) = user.as_deref_mut() else {
                unreachable!("checked above")
            };
            return Some(
                match self.receive_into(msg, &mut buf[..len], core.completion) {
                    Ok(()) => {
                        self.took(index);
                        core.count_in(len);
                        core.deliver(Recv {
                            from: peer,
                            len,
                            kind: RecvKind::Message(Mode::Reliable),
                            transport: Transport::Ucx,
                            via,
                        })
                    }
                    Err(why) => {
                        self.fail(index, conn, why);
                        Step::Moved
                    }
                },
            );
        }
        let body = match core.pool.reserve(len, &mut self.spaces) {
            Some(chain) => match self.receive_staged(msg, core.completion) {
                Ok(()) => {
                    self.took(index);
                    Body::Staged(chain)
                }
                Err(why) => {
                    core.pool.release(chain);
                    self.fail(index, conn, why);
                    return None;
                }
            },
            None => Body::Pending(Pending {
                msg,
                index,
                token: self.table[&index].token,
            }),
        };
        core.ready.push_back(Ready::Msg {
            from: peer,
            mode: Mode::Reliable,
            transport: Transport::Ucx,
            len,
            body,
            via,
        });
        None
    }

    /// Receives a pending message into `buf` (its length), once the
    /// application reads it. The error names why it could not be had.
    pub(crate) fn receive(&mut self, m: Pending, buf: &mut [u8]) -> Result<(), String> {
        // The reader waits for it, polling: it is the next thing read.
        self.receive_into(m.msg, buf, Completion::Poll)?;
        if self.table.get(&m.index).is_some_and(|e| e.token == m.token) {
            self.took(m.index);
        }
        Ok(())
    }

    /// Receives `msg` into `buf`, waiting until it is all there.
    fn receive_into(
        &mut self,
        msg: ffi::TagMessage,
        buf: &mut [u8],
        completion: Completion,
    ) -> Result<(), String> {
        // SAFETY: `msg` was probed off this worker and not received yet;
        // `buf` is writable for its length and outlives the receive, which
        // is complete when `wait` returns.
        let r = unsafe {
            (self.ucp.tag_msg_recv_nbx)(
                self.worker.h,
                buf.as_mut_ptr().cast(),
                buf.len(),
                msg,
                ffi::DEFAULTS.get(),
            )
        };
        self.wait(r, completion)
    }

    /// Receives `msg` into the pool tokens `reserve` just gave out.
    fn receive_staged(
        &mut self,
        msg: ffi::TagMessage,
        completion: Completion,
    ) -> Result<(), String> {
        self.iov.clear();
        self.iov
            .extend(self.spaces.iter().map(|&(p, n)| ffi::DtIov {
                buffer: p.cast(),
                length: n,
            }));
        let mut p = ffi::RequestParam::new();
        p.op_attr_mask = ffi::UCP_OP_ATTR_FIELD_DATATYPE;
        p.datatype = ffi::UCP_DATATYPE_IOV;
        // SAFETY: `msg` was probed off this worker; the iovecs name pool
        // tokens reserved for this message, writable, alive while the
        // endpoint lives, and the receive is complete when `wait` returns.
        let r = unsafe {
            (self.ucp.tag_msg_recv_nbx)(
                self.worker.h,
                self.iov.as_ptr() as *mut c_void,
                self.iov.len(),
                msg,
                &p,
            )
        };
        self.wait(r, completion)
    }

    /// Waits for an operation of this worker to end: spinning while
    /// polling, sleeping on the worker's descriptor while waiting.
    #[inline(always)]
    fn wait(&mut self, r: ffi::StatusPtr, completion: Completion) -> Result<(), String> {
        match ffi::posted(r) {
            Posted::Done => Ok(()),
            Posted::Failed(s) => Err(self.ucp.describe(s)),
            Posted::Request(req) => self.wait_request(req, completion),
        }
    }

    /// Waits for a request UCX did not complete at once.
    #[inline(never)]
    fn wait_request(&mut self, req: *mut c_void, completion: Completion) -> Result<(), String> {
        loop {
            // SAFETY: a live request of this worker.
            let s = unsafe { (self.ucp.request_check_status)(req) };
            if s != ffi::UCS_INPROGRESS {
                // SAFETY: complete; freed once.
                unsafe { (self.ucp.request_free)(req) };
                return if s == ffi::UCS_OK {
                    Ok(())
                } else {
                    Err(self.ucp.describe(s))
                };
            }
            let did = self.worker.progress();
            if !did && completion == Completion::Wait && self.arm() {
                let _ = sys::wait_fd(self.efd, Interest::Read, Duration::from_millis(100));
            }
        }
    }

    /// Counts a message taken off UCX for connection `index`. Credit goes
    /// back to its sender once half of what it may send is taken: for the
    /// message that makes the half, at the start of the next pass
    /// (`credit_due`), not from inside this one, so that a reply the
    /// application writes to the message it is handed goes first and a
    /// ping-pong does not carry the credit on its way (sent at once, it
    /// rode one round trip in sixteen and set the 99th percentile of a UCX
    /// shared-memory ping-pong); a message taken after it before that
    /// pass sends it at once, so a reader that stops calling holds back
    /// no more than half the window, as before.
    fn took(&mut self, index: u16) {
        let Some(e) = self.table.get_mut(&index) else {
            return;
        };
        e.owed += 1;
        if e.owed > CREDITS / 2 {
            self.give_credit(index);
        } else if e.owed == CREDITS / 2 {
            self.credit_due = true;
        }
    }

    /// Gives connection `index`'s peer the credit owed to it.
    fn give_credit(&mut self, index: u16) {
        let Some(e) = self.table.get_mut(&index) else {
            return;
        };
        let mut h = Header::new(FrameKind::Credit);
        h.offset = u64::from(std::mem::take(&mut e.owed));
        self.send(index, &h, &[]);
    }

    /// Gives every connection that owes half a window or more its credit.
    #[cold]
    #[inline(never)]
    fn give_due_credit(&mut self) {
        self.credit_due = false;
        for i in 0..self.table.0.len() {
            let owes = self.table.0[i]
                .as_ref()
                .is_some_and(|e| e.owed >= CREDITS / 2);
            if owes {
                self.give_credit(i as u16);
            }
        }
    }

    /// A control message of `len` bytes for connection `index`.
    fn control(
        &mut self,
        msg: ffi::TagMessage,
        len: usize,
        index: u16,
        core: &mut Core,
        conn: &mut dyn Conns,
    ) {
        if !(HEADER_LEN..=MAX_CONTROL).contains(&len) {
            self.violation(index, core, conn, "control message of a wrong size");
            self.discard(msg);
            return;
        }
        let mut buf = std::mem::take(&mut self.control);
        let got = self.receive_into(msg, &mut buf[..len], Completion::Poll);
        let done = match got {
            Ok(()) => self.answer(&buf[..len], index, core, conn),
            Err(why) => {
                self.fail(index, conn, why);
                Ok(())
            }
        };
        self.control = buf;
        if let Err(what) = done {
            self.violation(index, core, conn, what);
        }
    }

    /// Does what a control message asks.
    fn answer(
        &mut self,
        b: &[u8],
        index: u16,
        core: &mut Core,
        conn: &mut dyn Conns,
    ) -> Result<(), &'static str> {
        let h = Header::decode(b).map_err(|_| "malformed control header")?;
        let payload = &b[HEADER_LEN..];
        if h.len as usize != payload.len() {
            return Err("control header and payload disagree");
        }
        let e = &self.table[&index];
        let (slot, gen, peer) = (e.slot, e.gen, e.peer);
        if matches!(h.kind, FrameKind::RegionQuery | FrameKind::Revoke) {
            if self.held.of_node(peer.node) >= ANSWERS_CAP {
                return Err("asks on without taking the answers");
            }
            if self.held.total() >= TOTAL_CAP {
                self.fail(
                    index,
                    conn,
                    "UCX holds as many untaken answers as it may".into(),
                );
                return Ok(());
            }
        }
        match h.kind {
            FrameKind::RegionQuery => {
                let mut a = Header::new(FrameKind::RegionInfo);
                a.key = h.key;
                let mut body = Vec::new();
                match core.regions.export_ucx(h.key, &self.ctx, (slot, gen)) {
                    Ok((len, base, rkey)) => {
                        a.total = len as u64;
                        body.extend_from_slice(&base.to_le_bytes());
                        body.extend_from_slice(rkey);
                    }
                    Err(r) => {
                        if r == Refusal::BadKey {
                            core.stats.puts_refused += 1;
                        }
                        a.offset = r.code();
                    }
                }
                self.send(index, &a, &body);
            }
            FrameKind::RegionInfo => {
                let answer = if h.offset != 0 {
                    Err(Refusal::from_code(h.offset))
                } else {
                    let base = payload
                        .get(..8)
                        .ok_or("region answer without its address")?;
                    let mut b8 = [0u8; 8];
                    b8.copy_from_slice(base);
                    Ok(RegionAnswer::Ucx {
                        key: h.key,
                        len: usize::try_from(h.total).map_err(|_| "region too large")?,
                        base: u64::from_le_bytes(b8),
                        rkey: payload[8..].to_vec(),
                    })
                };
                if let Some(c) = conn.get(slot, gen) {
                    c.control().region_reply = Some(answer);
                }
            }
            FrameKind::PutDone => match core.regions.check(h.key, h.offset, h.total) {
                Ok(_) => {
                    core.stats.bytes_in += h.total;
                    if h.flags.contains(Flags::NOTIFY) {
                        core.ready.push_back(Ready::Placed {
                            from: peer,
                            transport: Transport::Ucx,
                            via: Some((slot, gen)),
                            key: RegionKey(h.key),
                            offset: h.offset,
                            len: h.total as usize,
                        });
                    }
                }
                Err(r) => {
                    core.stats.bad_frames += 1;
                    tracing::warn!(%peer, "put notice for no region: {r}");
                }
            },
            FrameKind::Revoke => {
                let c = conn
                    .get(slot, gen)
                    .ok_or("revocation on a connection that is gone")?;
                if let Err(e) = c.revoke(h.key) {
                    c.fail(e.to_string());
                    return Ok(());
                }
                let mut a = Header::new(FrameKind::Revoked);
                a.key = h.key;
                self.send(index, &a, &[]);
            }
            FrameKind::Revoked => core.regions.released(Some(h.key), slot, gen),
            FrameKind::Credit => {
                let n = u32::try_from(h.offset).map_err(|_| "credit out of range")?;
                if let Some(c) = conn.get(slot, gen) {
                    c.grant(n);
                }
            }
            _ => return Err("a frame that is not a UCX control message"),
        }
        Ok(())
    }

    /// Sends a control message to a peer from here (answers and credit
    /// cannot wait for the endpoint's next write), keeping its bytes until
    /// UCX is done with them.
    fn send(&mut self, index: u16, h: &Header, payload: &[u8]) {
        let Some(e) = self.table.get_mut(&index) else {
            return;
        };
        if e.ep.is_null() {
            // A connection UCX cannot answer on (`Conn::unreachable`).
            return;
        }
        let mut bytes = self.spare.pop().unwrap_or_default();
        control_bytes_into(h, payload, &mut bytes);
        let p = ffi::RequestParam::new();
        // SAFETY: `ep` belongs to a live connection of this worker (entries
        // go when their connection does); `bytes` stays alive in `held`
        // until the request completes.
        let r = unsafe {
            (self.ucp.tag_send_nbx)(e.ep, bytes.as_ptr().cast(), bytes.len(), e.tx_control, &p)
        };
        match ffi::posted(r) {
            Posted::Done => {
                if self.spare.len() < SPARE {
                    self.spare.push(bytes);
                }
            }
            Posted::Request(req) => {
                self.held.push(Answer {
                    index,
                    token: e.token,
                    node: e.peer.node,
                    req,
                    _bytes: bytes,
                });
                self.publish();
            }
            Posted::Failed(s) => {
                tracing::debug!("a UCX control message failed: {}", self.ucp.describe(s))
            }
        }
    }

    /// Frees what UCX is done sending.
    fn reap(&mut self) {
        let ucp = self.ucp;
        // SAFETY: live requests of this worker, each freed once, when done.
        self.held.reap(|req| unsafe { finished(ucp, req) });
        self.publish();
    }

    /// Takes a message off UCX and drops it.
    fn discard(&mut self, msg: ffi::TagMessage) {
        let mut sink = [0u8; 8];
        // Too small on purpose: UCX ends it as truncated and lets it go.
        let _ = self.receive_into(msg, &mut sink[..0], Completion::Poll);
    }

    /// A peer broke the protocol: its connection ends.
    fn violation(&mut self, index: u16, core: &mut Core, conn: &mut dyn Conns, what: &str) {
        core.stats.bad_frames += 1;
        if let Some(e) = self.table.get(&index) {
            tracing::warn!(peer = %e.peer, "protocol violation: {what}; closing the connection");
        }
        self.fail(index, conn, format!("protocol violation: {what}"));
    }

    /// Ends connection `index`: its next progress reports it lost.
    fn fail(&mut self, index: u16, conn: &mut dyn Conns, why: String) {
        if let Some(e) = self.table.get(&index) {
            if let Some(c) = conn.get(e.slot, e.gen) {
                c.fail(why);
            }
        }
    }
}

/// Whether UCX is done with `req`, which is then freed.
///
/// # Safety
/// `req` is a live request of a worker this thread drives, not freed yet.
unsafe fn finished(ucp: &Ucp, req: *mut c_void) -> bool {
    // SAFETY: as the caller promised.
    if unsafe { (ucp.request_check_status)(req) } == ffi::UCS_INPROGRESS {
        return false;
    }
    // SAFETY: complete; freed once.
    unsafe { (ucp.request_free)(req) };
    true
}

impl Drop for Port {
    fn drop(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(2);
        // Their bytes are kept until the worker is gone.
        let held = self.held.take_all();
        for a in &held {
            // SAFETY: a live request of this worker, cancelled and waited
            // for until the deadline: those of connections gone UCX may
            // never end, and go with the worker.
            unsafe {
                (self.ucp.request_cancel)(self.worker.h, a.req);
                finish(self.ucp, &self.worker, a.req, Some(deadline));
            }
        }
        // Probed messages not received: UCX frees them with the worker.
        self.limbo.clear();
        // SAFETY: every connection of this worker was closed before the
        // port drops (the endpoint drops its connections first); the ring
        // is freed only after the worker, whose handler used it, is gone.
        unsafe {
            (self.ucp.worker_destroy)(self.worker.h);
            drop(Box::from_raw(self.ring));
        }
        drop(held);
    }
}

#[cfg(test)]
mod tests {
    use super::super::held::{ANSWERS_CAP, TOTAL_CAP};
    use crate::{
        Completion, EndpointConfig, Error, Mode, Node, NodeConfig, RegionKey, Transport, UcxOptions,
    };
    use macrolink_wire::Refusal;
    use std::time::{Duration, Instant};

    /// A UCX node for these tests: `None` without UCX (outside CI).
    fn ucx_node(dir: &std::path::Path, id: u32) -> Option<Node> {
        let mut c = NodeConfig::local(id, dir);
        c.ucx = Some(UcxOptions {
            tls: Some("sm".into()),
            devices: None,
        });
        macrolink_testbed::require::ucx(Node::start(c))
    }

    fn poll() -> EndpointConfig {
        EndpointConfig {
            completion: Completion::Poll,
            ..EndpointConfig::default()
        }
    }

    /// Connects `asker` to `target` over UCX and asks for a region on and
    /// on, never progressing, until `target` drops it; how many it asked.
    fn ask_until_dropped(asker: &mut crate::Endpoint, target: &mut crate::Endpoint) -> u32 {
        let t = asker
            .target_via(target.addr(), Mode::Put, Transport::Ucx)
            .unwrap();
        let before = target.stats().bad_frames;
        let mut asked = 0;
        while target.stats().bad_frames == before && asked < 4 * ANSWERS_CAP {
            asker.ask_region_and_go(t, RegionKey(77)).unwrap();
            asked += 1;
            for _ in 0..4 {
                target.progress().unwrap();
            }
        }
        let mut buf = [0u8; 64];
        match target.read_timeout(&mut buf, Duration::from_secs(5)) {
            Err(Error::PeerLost { peer, reason }) => {
                assert_eq!(peer, asker.addr());
                assert!(reason.contains("without taking the answers"), "{reason}");
            }
            other => panic!("after {asked} queries: {other:?}"),
        }
        assert_eq!(target.stats().bad_frames, before + 1);
        asked
    }

    /// Whether `from` can connect to `to` over UCX and be heard.
    fn heard(from: &mut crate::Endpoint, to: &mut crate::Endpoint) -> Result<(), Error> {
        let t = from.target_via(to.addr(), Mode::Reliable, Transport::Ucx)?;
        from.write(t, b"still served")?;
        let mut buf = [0u8; 64];
        let until = Instant::now() + Duration::from_secs(10);
        let r = loop {
            from.progress()?;
            if let Some(r) = to.try_read(&mut buf)? {
                break r;
            }
            assert!(Instant::now() < until, "not heard");
        };
        assert_eq!((r.from, &buf[..r.len]), (from.addr(), &b"still served"[..]));
        Ok(())
    }

    fn is_held(r: Result<(), Error>) -> bool {
        matches!(
            r,
            Err(Error::Refused {
                why: Refusal::Held,
                ..
            })
        )
    }

    /// A peer that asks for regions on and on, its worker never
    /// progressing to take the answers, is dropped once UCX holds
    /// `ANSWERS_CAP` of them for it, where before every further answer
    /// waited in UCX's memory. Its node then gets no new UCX connection
    /// while they are held (UCX does not end them once the connection is
    /// closed), where before each new one could leave as many more for
    /// good; other nodes are served.
    #[test]
    fn a_peer_that_asks_and_never_takes_the_answers_is_dropped_and_its_node_refused() {
        let dir = tempfile::tempdir().unwrap();
        let (Some(a), Some(b), Some(c)) = (
            ucx_node(dir.path(), 1),
            ucx_node(dir.path(), 2),
            ucx_node(dir.path(), 3),
        ) else {
            return;
        };
        for n in [&b, &c] {
            n.add_peer(1, a.tcp_addr().unwrap());
        }
        let mut target = a.open(5, poll()).unwrap();
        // Kept, never progressing.
        let mut asker = b.open(20, poll()).unwrap();
        let asked = ask_until_dropped(&mut asker, &mut target);
        assert!(asked > ANSWERS_CAP, "{asked}");
        assert_eq!(target.ucx_orphans(), ANSWERS_CAP as usize);
        let mut again = b.open(21, poll()).unwrap();
        assert!(is_held(heard(&mut again, &mut target)), "node 2 refused");
        let mut other = c.open(22, poll()).unwrap();
        heard(&mut other, &mut target).unwrap();
    }

    /// Past `TOTAL_CAP` answers of connections gone, held for several
    /// nodes, the endpoint takes no new UCX connection from any node: what
    /// UCX holds for peers that never take it stays bounded.
    #[test]
    fn answers_left_by_connections_gone_are_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let Some(a) = ucx_node(dir.path(), 1) else {
            return;
        };
        let mut target = a.open(5, poll()).unwrap();
        let nodes = TOTAL_CAP / ANSWERS_CAP as usize;
        let mut kept = Vec::new();
        for id in 0..nodes as u32 {
            let n = ucx_node(dir.path(), 10 + id).unwrap();
            n.add_peer(1, a.tcp_addr().unwrap());
            let mut asker = n.open(20, poll()).unwrap();
            ask_until_dropped(&mut asker, &mut target);
            kept.push((n, asker));
        }
        assert_eq!(target.ucx_orphans(), TOTAL_CAP);
        let fresh = ucx_node(dir.path(), 99).unwrap();
        fresh.add_peer(1, a.tcp_addr().unwrap());
        let mut asker = fresh.open(20, poll()).unwrap();
        assert!(
            is_held(heard(&mut asker, &mut target)),
            "every node refused"
        );
    }

    /// Several connections of one node asking at once, none taking the
    /// answers, share their node's `ANSWERS_CAP`: where each could leave
    /// as many before, UCX holds no more for the node than one could.
    #[test]
    fn connections_of_one_node_share_its_cap() {
        let dir = tempfile::tempdir().unwrap();
        let (Some(a), Some(b)) = (ucx_node(dir.path(), 1), ucx_node(dir.path(), 2)) else {
            return;
        };
        b.add_peer(1, a.tcp_addr().unwrap());
        let mut target = a.open(5, poll()).unwrap();
        let mut askers: Vec<_> = (0..3)
            .map(|k| {
                let mut e = b.open(20 + k, poll()).unwrap();
                let t = e
                    .target_via(target.addr(), Mode::Put, Transport::Ucx)
                    .unwrap();
                (e, t)
            })
            .collect();
        let mut asked = 0;
        while target.stats().bad_frames < 3 && asked < 4 * ANSWERS_CAP {
            for (e, t) in &mut askers {
                // One dropped already: its sends may fail.
                let _ = e.ask_region_and_go(*t, RegionKey(77));
            }
            asked += 1;
            for _ in 0..8 {
                target.progress().unwrap();
            }
        }
        // Queries of a connection dropped count as frames of none.
        assert!(target.stats().bad_frames >= 3, "after {asked} rounds");
        let mut buf = [0u8; 64];
        let mut lost = Vec::new();
        for _ in 0..3 {
            match target.read_timeout(&mut buf, Duration::from_secs(5)) {
                Err(Error::PeerLost { peer, reason }) => {
                    assert!(reason.contains("without taking the answers"), "{reason}");
                    lost.push(peer);
                }
                other => panic!("{other:?}"),
            }
        }
        lost.sort_by_key(|p| p.ep);
        let askers: Vec<_> = askers.iter().map(|(e, _)| e.addr()).collect();
        assert_eq!(lost, askers);
        assert!(
            asked < ANSWERS_CAP,
            "the three shared one cap: {asked} rounds"
        );
        assert_eq!(target.ucx_orphans(), ANSWERS_CAP as usize);
    }
}
