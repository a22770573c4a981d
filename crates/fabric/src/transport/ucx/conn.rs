//! One UCX connection: a UCP endpoint to the peer's worker, what it may
//! send, and the peer's regions it puts into.
//!
//! Sending: a reliable message is one tagged send of the whole message
//! (UCX picks eager or rendezvous), if the peer has granted credit; a
//! datagram is one eager active message; a control frame is a tagged send
//! of its header and payload, copied so that the caller need not wait. A
//! put is `ucp_put_nbx` into the region the peer exported, and is placed
//! once a flush of the endpoint completes.

use macrolink_wire::ucx::{Card, Tag, TagKind};
use macrolink_wire::{FrameKind, Header};
use std::ffi::c_void;
use std::io;
use std::net::TcpStream;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant};

use super::ffi::{self, Posted, Ucp};
use super::{control_bytes, error, finish, Worker, DATAGRAM_AM};
use crate::rx::{Core, Step};
use crate::transport::sys::{self, Interest};
use crate::transport::{Connection, Control, OneSided, RegionAnswer, SendState};
use crate::types::{Addr, Mode, Transport};

/// Longest a writer waiting for UCX sleeps before it looks again.
const WRITE_NAP: Duration = Duration::from_millis(1);

/// UCX's error handler: records what it says for the connection's next look.
///
/// # Safety
/// `arg` is the connection's status cell, which outlives its endpoint.
unsafe extern "C" fn on_error(arg: *mut c_void, _ep: ffi::Ep, status: ffi::Status) {
    // SAFETY: the caller's contract.
    let cell = unsafe { &*arg.cast::<AtomicI32>() };
    cell.store(i32::from(status), Ordering::Release);
}

/// A peer's region this side puts into.
#[derive(Debug)]
struct Remote {
    key: u64,
    len: usize,
    base: u64,
    rkey: ffi::RKey,
    revoked: bool,
}

/// A connection over UCX.
#[derive(Debug)]
pub(crate) struct Conn {
    ucp: &'static Ucp,
    /// The port's worker, which outlives its connections.
    worker: *const Worker,
    efd: RawFd,
    ep: ffi::Ep,
    /// What UCX's error handler said (0: nothing); from `Box::into_raw`.
    err: *mut AtomicI32,
    /// The handshake socket: its end means the peer is gone.
    sock: TcpStream,
    peer: Addr,
    tag_data: u64,
    tag_control: u64,
    /// The active-message header of datagrams to the peer.
    datagram: u64,
    /// Reliable messages the peer lets this side send now.
    credits: u32,
    /// A send of the caller's bytes that UCX still holds.
    sending: Option<*mut c_void>,
    /// Control messages UCX still holds, with their bytes.
    control_out: Vec<(*mut c_void, Vec<u8>)>,
    control: Control,
    remote: Vec<Remote>,
    /// Puts made since the last flush began.
    unflushed: bool,
    flushing: Option<*mut c_void>,
    lost: Option<String>,
    /// When the peer's contact socket ended: what its UCX endpoint sent
    /// before travels on another connection and may still be coming.
    eof_at: Option<Instant>,
    /// Why UCX could not make an endpoint back to the peer, and since
    /// when (`ep` is null then): an accepted connection whose peer already
    /// went (its shared memory with it) still delivers what it sent, for
    /// [`EOF_GRACE`], then is lost; nothing is sent on it.
    unreachable: Option<(String, Instant)>,
}

// SAFETY: every UCX handle here belongs to the endpoint's worker and is
// used only by the thread that drives the endpoint (see `Port`).
unsafe impl Send for Conn {}

/// How long closing a connection may wait for UCX.
const CLOSE_WAIT: Duration = Duration::from_secs(2);
/// How long after the peer's contact socket ends its messages still count:
/// a peer that closes sends its last messages on UCX's own connection
/// first, which the end of the contact socket may overtake.
const EOF_GRACE: Duration = Duration::from_millis(200);

impl Conn {
    /// The connection to `peer` whose card is `card`, on `worker`. With
    /// `failures`, UCX reports the peer's failure (not every UCX transport
    /// can: shared memory cannot); `None` when UCX refused that, to try
    /// again without.
    pub(super) fn new(
        ucp: &'static Ucp,
        worker: *const Worker,
        efd: RawFd,
        sock: &TcpStream,
        card: &Card,
        peer: Addr,
        failures: bool,
    ) -> crate::error::Result<Option<Conn>> {
        let err = Box::into_raw(Box::new(AtomicI32::new(0)));
        let params = ffi::EpParams {
            field_mask: if failures {
                ffi::UCP_EP_PARAM_FIELD_REMOTE_ADDRESS
                    | ffi::UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE
                    | ffi::UCP_EP_PARAM_FIELD_ERR_HANDLER
            } else {
                ffi::UCP_EP_PARAM_FIELD_REMOTE_ADDRESS
            },
            address: card.address.as_ptr().cast(),
            err_mode: ffi::UCP_ERR_HANDLING_MODE_PEER,
            err_handler_cb: Some(on_error),
            err_handler_arg: err.cast(),
        };
        let mut ep = std::ptr::null_mut();
        // SAFETY: a live worker driven by this thread; the address bytes
        // are the peer's worker address (UCX checks their form); the error
        // cell outlives the endpoint (freed after it is closed).
        let s = unsafe { (ucp.ep_create)((*worker).h, &params, &mut ep) };
        if s != ffi::UCS_OK {
            // SAFETY: made above, never handed to UCX.
            drop(unsafe { Box::from_raw(err) });
            if failures {
                return Ok(None);
            }
            return Err(error(ucp, "ucp_ep_create", s).into());
        }
        Ok(Some(Conn::with_ep(
            ucp, worker, efd, ep, err, sock, card, peer,
        )?))
    }

    /// An accepted connection to a peer UCX cannot reach (`why`): what the
    /// peer sent before it went is delivered, then the connection is lost.
    pub(super) fn unreachable(
        ucp: &'static Ucp,
        worker: *const Worker,
        efd: RawFd,
        sock: &TcpStream,
        card: &Card,
        peer: Addr,
        why: String,
    ) -> io::Result<Conn> {
        let err = Box::into_raw(Box::new(AtomicI32::new(0)));
        let null = std::ptr::null_mut();
        let mut c = Conn::with_ep(ucp, worker, efd, null, err, sock, card, peer)?;
        c.unreachable = Some((why, Instant::now()));
        Ok(c)
    }

    #[allow(clippy::too_many_arguments)]
    fn with_ep(
        ucp: &'static Ucp,
        worker: *const Worker,
        efd: RawFd,
        ep: ffi::Ep,
        err: *mut AtomicI32,
        sock: &TcpStream,
        card: &Card,
        peer: Addr,
    ) -> io::Result<Conn> {
        let sock = sock.try_clone()?;
        sock.set_nonblocking(true)?;
        let tag = |kind| {
            Tag {
                kind,
                index: card.index,
                token: card.token,
            }
            .encode()
        };
        Ok(Conn {
            ucp,
            worker,
            efd,
            ep,
            err,
            sock,
            peer,
            tag_data: tag(TagKind::Data),
            tag_control: tag(TagKind::Control),
            datagram: tag(TagKind::Datagram),
            credits: card.credits,
            sending: None,
            control_out: Vec::new(),
            control: Control::default(),
            remote: Vec::new(),
            unflushed: false,
            flushing: None,
            lost: None,
            eof_at: None,
            unreachable: None,
        })
    }

    /// The UCP endpoint, for the worker to answer on (null: none, see
    /// [`Conn::unreachable`]).
    pub(super) fn ep(&self) -> ffi::Ep {
        self.ep
    }

    /// The peer lets this side send `n` more reliable messages.
    pub(super) fn grant(&mut self, n: u32) {
        self.credits = self.credits.saturating_add(n);
    }

    /// Ends the connection: its next progress reports it lost.
    pub(super) fn fail(&mut self, why: String) {
        self.lost.get_or_insert(why);
    }

    /// The peer deregistered region `key`: puts into it are refused from
    /// now on, and every put made so far is placed before the peer hears
    /// that this side let go of the key.
    pub(super) fn revoke(&mut self, key: u64) -> io::Result<()> {
        for r in self.remote.iter_mut().filter(|r| r.key == key) {
            r.revoked = true;
        }
        let until = Instant::now() + CLOSE_WAIT;
        while !self.flush()? {
            if Instant::now() >= until {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "puts not placed in time",
                ));
            }
            self.worker().progress();
        }
        Ok(())
    }

    /// The worker this connection was made on.
    fn worker(&self) -> &Worker {
        // SAFETY: the port owns the worker in a box of its own and drops it
        // only after every connection made on it.
        unsafe { &*self.worker }
    }

    /// Whether nothing has befallen the connection: no loss, no UCX error,
    /// no end of the contact socket, nothing unreachable (the few loads of
    /// an idle pass; [`Conn::broken`] says whether what befell it has
    /// ended it).
    #[inline(always)]
    fn whole(&self) -> bool {
        // SAFETY: the cell lives as long as the connection.
        self.lost.is_none()
            && unsafe { &*self.err }.load(Ordering::Relaxed) == 0
            && self.eof_at.is_none()
            && self.unreachable.is_none()
    }

    /// A pass's look at a connection with control messages out or
    /// something befallen it: reaps the first, tells the loss.
    #[cold]
    #[inline(never)]
    fn progress_rest(&mut self, core: &mut Core) -> Step {
        if !self.control_out.is_empty() {
            if let Err(e) = self.reap() {
                self.fail(e.to_string());
            }
        }
        if !self.broken() {
            return Step::Idle;
        }
        core.broken(self.why_lost().unwrap_or_default())
    }

    /// Whether the connection is gone (cheap: for every send and pass).
    #[inline]
    fn broken(&self) -> bool {
        // SAFETY: the cell lives as long as the connection.
        self.lost.is_some()
            || unsafe { &*self.err }.load(Ordering::Relaxed) != 0
            || self.eof_at.is_some_and(|t| t.elapsed() >= EOF_GRACE)
            || self
                .unreachable
                .as_ref()
                .is_some_and(|(_, t)| t.elapsed() >= EOF_GRACE)
    }

    /// Why nothing can be sent on the connection now, if so.
    #[inline(always)]
    fn cannot_send(&self) -> Option<io::Error> {
        if self.whole() {
            return None;
        }
        self.why_not_send()
    }

    #[cold]
    #[inline(never)]
    fn why_not_send(&self) -> Option<io::Error> {
        let why = match &self.unreachable {
            Some((why, _)) => why.clone(),
            None if self.broken() => self.why_lost().unwrap_or_default(),
            None => return None,
        };
        Some(io::Error::new(io::ErrorKind::ConnectionAborted, why))
    }

    fn why_lost(&self) -> Option<String> {
        if let Some(r) = &self.lost {
            return Some(r.clone());
        }
        if let Some((why, t)) = &self.unreachable {
            return (t.elapsed() >= EOF_GRACE).then(|| why.clone());
        }
        if self.eof_at.is_some_and(|t| t.elapsed() >= EOF_GRACE) {
            return Some("the peer closed its contact socket".into());
        }
        // SAFETY: the cell lives as long as the connection.
        let s = unsafe { &*self.err }.load(Ordering::Acquire);
        (s != 0).then(|| format!("UCX to {}: {}", self.peer, self.ucp.describe(s as i8)))
    }

    /// Posts one send of `payload` with header `h`: `None` when it must
    /// wait for credit, else what UCX said (null: done). A message UCX
    /// cannot take at once (a connection the peer's worker has not answered
    /// yet, a full socket, a rendezvous) is left with UCX from the caller's
    /// buffer, and the write waits for it.
    fn post(&mut self, h: &Header, payload: &[u8]) -> io::Result<Option<ffi::StatusPtr>> {
        match h.kind {
            FrameKind::Data if self.credits == 0 => Ok(None),
            FrameKind::Data | FrameKind::Datagram => {
                let r = self.send_one(h.kind, payload);
                if h.kind == FrameKind::Data && !matches!(ffi::posted(r), Posted::Failed(_)) {
                    self.credits -= 1;
                }
                Ok(Some(r))
            }
            FrameKind::Put | FrameKind::PutAck | FrameKind::PutNack => Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "puts over UCX are one-sided",
            )),
            _ => {
                let bytes = control_bytes(h, payload);
                let p = ffi::RequestParam::new();
                // SAFETY: `bytes` moves into `control_out` (the heap block
                // does not move) until the request completes.
                let r = unsafe {
                    (self.ucp.tag_send_nbx)(
                        self.ep,
                        bytes.as_ptr().cast(),
                        bytes.len(),
                        self.tag_control,
                        &p,
                    )
                };
                match ffi::posted(r) {
                    Posted::Request(req) => self.control_out.push((req, bytes)),
                    Posted::Failed(s) => return Err(error(self.ucp, "ucp_tag_send_nbx", s)),
                    Posted::Done => {}
                }
                Ok(Some(std::ptr::null_mut()))
            }
        }
    }

    /// One tagged send of a message, or one active message of a datagram.
    fn send_one(&self, kind: FrameKind, payload: &[u8]) -> ffi::StatusPtr {
        if kind == FrameKind::Data {
            // SAFETY: a live endpoint; `payload` stays alive until this
            // send reports done: the caller's until `SendState.posted` ends
            // (or the connection is dropped, which cancels and waits).
            unsafe {
                (self.ucp.tag_send_nbx)(
                    self.ep,
                    payload.as_ptr().cast(),
                    payload.len(),
                    self.tag_data,
                    ffi::DEFAULTS.get(),
                )
            }
        } else {
            let mut p = ffi::RequestParam::new();
            p.op_attr_mask = ffi::UCP_OP_ATTR_FIELD_FLAGS;
            p.flags = ffi::UCP_AM_SEND_FLAG_EAGER;
            // SAFETY: as above; the header is a field of `self`, which
            // outlives the send.
            unsafe {
                (self.ucp.am_send_nbx)(
                    self.ep,
                    DATAGRAM_AM,
                    (&self.datagram as *const u64).cast(),
                    8,
                    payload.as_ptr().cast(),
                    payload.len(),
                    &p,
                )
            }
        }
    }

    /// Frees control sends UCX is done with.
    fn reap(&mut self) -> io::Result<()> {
        let ucp = self.ucp;
        let mut failed = None;
        self.control_out.retain(|&(req, _)| {
            // SAFETY: a live request of this connection's worker.
            let s = unsafe { (ucp.request_check_status)(req) };
            if s == ffi::UCS_INPROGRESS {
                return true;
            }
            // SAFETY: complete; freed once.
            unsafe { (ucp.request_free)(req) };
            if s != ffi::UCS_OK {
                failed = Some(s);
            }
            false
        });
        match failed {
            Some(s) => Err(error(ucp, "a control message", s)),
            None => Ok(()),
        }
    }

    /// Waits, progressing the worker, until a request ends; its status.
    fn wait(&self, req: *mut c_void) -> ffi::Status {
        // SAFETY: a live request of this connection's worker, which this
        // thread drives.
        unsafe { finish(self.ucp, self.worker(), req, None) }.unwrap_or(ffi::UCS_ERR_CANCELED)
    }
}

impl Connection for Conn {
    fn transport(&self) -> Transport {
        Transport::Ucx
    }

    /// A reliable message waits for the peer's credit (see
    /// `Port::took`), so there is room for one while there is credit; a
    /// datagram needs none.
    fn can_take(&self, _len: usize, mode: Mode) -> bool {
        mode == Mode::Datagram || self.credits > 0
    }

    fn send(&mut self, h: &Header, payload: &[u8], st: &mut SendState) -> io::Result<bool> {
        if let Some(e) = self.cannot_send() {
            return Err(e);
        }
        if st.posted {
            let Some(req) = self.sending else {
                return Ok(true);
            };
            // SAFETY: a live request of this connection's worker.
            let s = unsafe { (self.ucp.request_check_status)(req) };
            if s == ffi::UCS_INPROGRESS {
                return Ok(false);
            }
            // SAFETY: complete; freed once.
            unsafe { (self.ucp.request_free)(req) };
            self.sending = None;
            return match s {
                ffi::UCS_OK => Ok(true),
                s => Err(error(self.ucp, "send", s)),
            };
        }
        let Some(r) = self.post(h, payload)? else {
            return Ok(false);
        };
        match ffi::posted(r) {
            Posted::Done => Ok(true),
            Posted::Failed(s) => Err(error(self.ucp, "send", s)),
            Posted::Request(req) => {
                self.sending = Some(req);
                st.posted = true;
                Ok(false)
            }
        }
    }

    fn progress(&mut self, core: &mut Core, _user: Option<&mut [u8]>) -> Step {
        // The worker's pass reads the connection's messages: a look here is
        // for control messages UCX still holds and for the loss of the
        // connection. Nothing of either (a few loads) returns at once, in
        // a function too small to save registers.
        if self.control_out.is_empty() && self.whole() {
            return Step::Idle;
        }
        self.progress_rest(core)
    }

    fn arm_read(&mut self) -> bool {
        !self.broken()
    }

    fn arm_write(&mut self, _need: usize) -> bool {
        if self.broken() {
            return false;
        }
        // SAFETY: a live worker, driven by this thread.
        unsafe { (self.ucp.worker_arm)(self.worker().h) == ffi::UCS_OK }
    }

    /// After a sleep: the contact socket may have woken it by closing.
    fn disarm(&mut self) {
        self.check_alive();
    }

    fn read_fd(&self) -> RawFd {
        self.sock.as_raw_fd()
    }

    fn write_wait(&self) -> (RawFd, Interest) {
        (self.efd, Interest::Read)
    }

    /// The worker's event fd does not always wake a writer whose first
    /// send waits for UCX to finish connecting (over UCX's tcp, about
    /// one first write in three slept the whole nap, 200 ms): look again
    /// after a millisecond.
    fn write_nap(&self) -> Duration {
        WRITE_NAP
    }

    fn check_alive(&mut self) {
        let mut b = [0u8; 1];
        match sys::recv(self.sock.as_raw_fd(), &mut b, true) {
            Ok(None) => {}
            Ok(Some(0)) => {
                self.eof_at.get_or_insert_with(Instant::now);
            }
            Ok(Some(_)) => self.fail("the peer spoke on its contact socket".into()),
            Err(e) => self.fail(format!("contact socket: {e}")),
        }
    }

    fn control(&mut self) -> &mut Control {
        &mut self.control
    }

    fn one_sided(&mut self) -> Option<&mut dyn OneSided> {
        Some(self)
    }

    fn ucx(&mut self) -> Option<&mut Conn> {
        Some(self)
    }
}

impl OneSided for Conn {
    fn find(&self, key: u64) -> Option<usize> {
        self.remote.iter().position(|r| r.key == key)
    }

    fn adopt(&mut self, answer: RegionAnswer) -> io::Result<usize> {
        let RegionAnswer::Ucx {
            key,
            len,
            base,
            rkey,
        } = answer
        else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "a region answer of another transport",
            ));
        };
        if base.checked_add(len as u64).is_none() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "a region that wraps the address space",
            ));
        }
        if let Some(e) = self.cannot_send() {
            return Err(e);
        }
        let mut h = std::ptr::null_mut();
        // SAFETY: a live endpoint; UCX checks the packed key's form and
        // refuses one it cannot read.
        let s = unsafe { (self.ucp.ep_rkey_unpack)(self.ep, rkey.as_ptr().cast(), &mut h) };
        if s != ffi::UCS_OK {
            return Err(error(self.ucp, "ucp_ep_rkey_unpack", s));
        }
        self.remote.push(Remote {
            key,
            len,
            base,
            rkey: h,
            revoked: false,
        });
        Ok(self.remote.len() - 1)
    }

    fn len(&self, i: usize) -> usize {
        self.remote[i].len
    }

    fn revoked(&self, i: usize) -> bool {
        self.remote[i].revoked
    }

    fn forget(&mut self, i: usize) {
        let r = self.remote.swap_remove(i);
        // SAFETY: a key unpacked on this endpoint, destroyed once.
        unsafe { (self.ucp.rkey_destroy)(r.rkey) };
    }

    fn write(&mut self, i: usize, offset: usize, data: &[u8]) -> io::Result<()> {
        if let Some(e) = self.cannot_send() {
            return Err(e);
        }
        let r = &self.remote[i];
        assert!(offset + data.len() <= r.len, "bounds checked by the caller");
        let p = ffi::RequestParam::new();
        // The range was checked by the caller against the exported length.
        // SAFETY: a live endpoint and remote key; the range lies inside the
        // region the peer exported; `data` is borrowed until the put is
        // complete locally, waited for below.
        let at = unsafe {
            (self.ucp.put_nbx)(
                self.ep,
                data.as_ptr().cast(),
                data.len(),
                r.base + offset as u64,
                r.rkey,
                &p,
            )
        };
        self.unflushed = true;
        let s = match ffi::posted(at) {
            Posted::Done => ffi::UCS_OK,
            Posted::Failed(s) => s,
            Posted::Request(req) => self.wait(req),
        };
        if s != ffi::UCS_OK {
            return Err(error(self.ucp, "ucp_put_nbx", s));
        }
        Ok(())
    }

    fn flush(&mut self) -> io::Result<bool> {
        if let Some(req) = self.flushing {
            // SAFETY: a live request of this connection's worker.
            let s = unsafe { (self.ucp.request_check_status)(req) };
            if s == ffi::UCS_INPROGRESS {
                self.worker().progress();
                return Ok(false);
            }
            // SAFETY: complete; freed once.
            unsafe { (self.ucp.request_free)(req) };
            self.flushing = None;
            if s != ffi::UCS_OK {
                return Err(error(self.ucp, "ucp_ep_flush_nbx", s));
            }
        }
        if !self.unflushed || self.ep.is_null() {
            return Ok(true);
        }
        self.unflushed = false;
        let p = ffi::RequestParam::new();
        // SAFETY: a live endpoint.
        let r = unsafe { (self.ucp.ep_flush_nbx)(self.ep, &p) };
        match ffi::posted(r) {
            Posted::Done => Ok(true),
            Posted::Failed(s) => Err(error(self.ucp, "ucp_ep_flush_nbx", s)),
            Posted::Request(req) => {
                self.flushing = Some(req);
                Ok(false)
            }
        }
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        let until = Some(Instant::now() + CLOSE_WAIT);
        // What was sent goes out before the connection closes, as bytes
        // written to a socket do: while the peer is there, sends and
        // control messages UCX holds are waited for; a peer that is gone
        // gets them cancelled.
        let healthy = !self.broken() && self.eof_at.is_none();
        let pending = self
            .sending
            .take()
            .into_iter()
            .chain(self.flushing.take())
            .chain(self.control_out.iter().map(|(r, _)| *r))
            .collect::<Vec<_>>();
        let mut unfinished = false;
        for req in pending {
            // SAFETY: live requests of this worker, waited for (or
            // cancelled, then waited for) so that no buffer they name is
            // freed under UCX.
            unsafe {
                if !healthy || finish(self.ucp, self.worker(), req, until).is_none() {
                    (self.ucp.request_cancel)(self.worker().h, req);
                    unfinished |= finish(self.ucp, self.worker(), req, until).is_none();
                }
            }
        }
        let control_out = std::mem::take(&mut self.control_out);
        if unfinished {
            // UCX may still read them: leave them to it.
            std::mem::forget(control_out);
        }
        for r in self.remote.drain(..) {
            // SAFETY: keys unpacked on this endpoint, destroyed once,
            // before it closes.
            unsafe { (self.ucp.rkey_destroy)(r.rkey) };
        }
        if self.ep.is_null() {
            // SAFETY: the error cell, never handed to UCX, freed once.
            drop(unsafe { Box::from_raw(self.err) });
            return;
        }
        let mut p = ffi::RequestParam::new();
        p.op_attr_mask = ffi::UCP_OP_ATTR_FIELD_FLAGS;
        p.flags = ffi::UCP_EP_CLOSE_FLAG_FORCE;
        // SAFETY: the endpoint, closed once; the error cell is freed only
        // once the close is over (or left to UCX if it never ends).
        unsafe {
            let r = (self.ucp.ep_close_nbx)(self.ep, &p);
            let closed = match ffi::posted(r) {
                Posted::Request(req) => finish(self.ucp, self.worker(), req, until).is_some(),
                _ => true,
            };
            if closed {
                drop(Box::from_raw(self.err));
            }
        }
    }
}
