//! UCX as a transport: the path to InfiniBand and RoCE (and UCX's own
//! shared memory and TCP), through UCX's UCP layer, loaded at run time.
//!
//! ```text
//!  node:      Context (ucp_init, once per node that enables UCX)
//!  endpoint:  Port = one UCP worker, driven by the endpoint's thread
//!               │ probes tagged messages, reads datagrams an active-message
//!               │ handler left in a ring, answers control messages
//!  connection:  Conn = one UCP endpoint to the peer's worker
//!                 reliable  ucp_tag_send_nbx  (tag: Data, rendezvous for large)
//!                 datagram  ucp_am_send_nbx   (one MTU, eager)
//!                 put       ucp_put_nbx into the peer's registered region
//!                 control   ucp_tag_send_nbx  (tag: Control, a fabric header)
//! ```
//!
//! A connection starts as every fabric connection does: a TCP socket to the
//! peer's node and the hello handshake, in which both prove the cluster
//! key. Then each side sends the other a [`Card`]: its worker's address
//! and the index and token (see [`macrolink_wire::ucx`]) the other must
//! tag its messages with. The socket stays open: its end tells that the
//! peer is gone, as UCX's own error handling does.
//!
//! Reliable messages are ordered by UCX's tag matching. The receiver
//! grants credit: a sender has [`CREDITS`] messages in flight at most
//! until the receiver has taken them, so UCX's queue of messages nobody
//! asked for yet stays bounded whatever a peer sends. A message waits in
//! UCX until the application reads it when it cannot go straight into the
//! reader's buffer or the token pool, so a large one crosses once, into the
//! reader's buffer (rendezvous).

mod conn;
pub(crate) mod ffi;
mod held;
mod port;

use macrolink_wire::ucx::{Card, TOKEN_MASK};
use std::fmt;
use std::io;
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

pub(crate) use conn::Conn;
pub use ffi::Missing;
use ffi::Ucp;
pub(crate) use port::{Conns, Pending, Port};

/// Reliable messages a connection may have sent and the receiver not yet
/// taken.
pub(crate) const CREDITS: u32 = 64;

/// The active-message id of datagrams.
pub(crate) const DATAGRAM_AM: u32 = 0;

/// A node's UCX context.
pub(crate) struct Context {
    ucp: &'static Ucp,
    h: ffi::Context,
    /// UCX can report a peer's failure on the transports it uses (not on
    /// shared memory alone); learnt once, then every worker knows.
    failures: AtomicBool,
}

// SAFETY: the context is created with `mt_workers_shared`, which makes UCX
// guard its shared state (memory registration) for use from the several
// threads that drive a node's endpoints; the handle itself is an opaque
// pointer that UCX owns.
unsafe impl Send for Context {}
// SAFETY: as above.
unsafe impl Sync for Context {}

impl fmt::Debug for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "UCX context ({:?})", self.ucp)
    }
}

/// How a node's UCX is set up, beyond what UCX reads from its environment.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UcxOptions {
    /// UCX's transports (`UCX_TLS`), e.g. `rc,sm,self` or `tcp`; `None`
    /// leaves UCX's environment and defaults.
    pub tls: Option<String>,
    /// UCX's devices (`UCX_NET_DEVICES`), e.g. `mlx5_0:1`; `None` as above.
    pub devices: Option<String>,
}

/// UCX's configuration: read from the environment, then `o` applied.
struct Config<'a> {
    ucp: &'a Ucp,
    h: *mut std::ffi::c_void,
}

impl<'a> Config<'a> {
    fn new(ucp: &'a Ucp, o: &UcxOptions) -> Result<Config<'a>, Missing> {
        let mut h = std::ptr::null_mut();
        // SAFETY: null prefix and file: UCX's own defaults and `UCX_*`
        // variables; `h` is an out-pointer.
        let s = unsafe { (ucp.config_read)(std::ptr::null(), std::ptr::null(), &mut h) };
        if s != ffi::UCS_OK {
            return Err(Missing(format!("ucp_config_read: {}", ucp.describe(s))));
        }
        let c = Config { ucp, h };
        for (name, value) in [("TLS", &o.tls), ("NET_DEVICES", &o.devices)] {
            let Some(value) = value else { continue };
            let bad = |_| Missing(format!("UCX_{name}: a value with a NUL byte"));
            let (n, v) = (
                std::ffi::CString::new(name).map_err(bad)?,
                std::ffi::CString::new(value.as_str()).map_err(bad)?,
            );
            // SAFETY: a live configuration and two C strings.
            let s = unsafe { (ucp.config_modify)(c.h, n.as_ptr(), v.as_ptr()) };
            if s != ffi::UCS_OK {
                return Err(Missing(format!("UCX_{name}={value}: {}", ucp.describe(s))));
            }
        }
        Ok(c)
    }
}

impl Drop for Config<'_> {
    fn drop(&mut self) {
        // SAFETY: read in `new`, released once.
        unsafe { (self.ucp.config_release)(self.h) }
    }
}

impl Context {
    /// Initialises UCX with tag matching, remote memory access, active
    /// messages and wake-ups. UCX reads its environment (`UCX_TLS`,
    /// `UCX_NET_DEVICES`, ...) here, and `o` overrides it.
    pub(crate) fn new(o: &UcxOptions) -> Result<Arc<Context>, Missing> {
        let ucp = Ucp::get()?;
        let config = Config::new(ucp, o)?;
        let name = c"macrolink";
        let params = ffi::Params {
            field_mask: ffi::UCP_PARAM_FIELD_FEATURES
                | ffi::UCP_PARAM_FIELD_MT_WORKERS_SHARED
                | ffi::UCP_PARAM_FIELD_NAME,
            features: ffi::UCP_FEATURE_TAG
                | ffi::UCP_FEATURE_RMA
                | ffi::UCP_FEATURE_AM
                | ffi::UCP_FEATURE_WAKEUP,
            request_size: 0,
            request_init: std::ptr::null_mut(),
            request_cleanup: std::ptr::null_mut(),
            tag_sender_mask: 0,
            mt_workers_shared: 1,
            estimated_num_eps: 0,
            estimated_num_ppn: 0,
            name: name.as_ptr(),
        };
        let mut h = std::ptr::null_mut();
        // SAFETY: `params` is a valid ucp_params_t whose mask names only the
        // fields set; `config` is live; `h` is a valid out-pointer.
        let s = unsafe {
            (ucp.init_version)(
                ffi::UCP_API_MAJOR,
                ffi::UCP_API_MINOR,
                &params,
                config.h,
                &mut h,
            )
        };
        if s != ffi::UCS_OK || h.is_null() {
            return Err(Missing(format!("ucp_init: {}", ucp.describe(s))));
        }
        let tls = o.tls.clone().or_else(|| std::env::var("UCX_TLS").ok());
        Ok(Arc::new(Context {
            ucp,
            h,
            failures: AtomicBool::new(!tls.is_some_and(|t| shared_memory_only(&t))),
        }))
    }
}

impl Context {
    /// Whether to ask UCX for peer failure reports.
    pub(crate) fn failures(&self) -> bool {
        self.failures.load(Ordering::Relaxed)
    }

    /// UCX refused them: ask no more.
    pub(crate) fn no_failures(&self) {
        self.failures.store(false, Ordering::Relaxed);
    }
}

/// Whether a `UCX_TLS` list names shared-memory transports only, on which
/// UCX cannot report a peer's failure.
fn shared_memory_only(tls: &str) -> bool {
    const SHM: [&str; 9] = [
        "sm", "self", "posix", "sysv", "cma", "knem", "xpmem", "mm", "shm",
    ];
    tls.split(',')
        .map(|t| t.trim().trim_start_matches('^'))
        .all(|t| SHM.contains(&t))
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: every worker and registration holds an Arc of this
        // context, so none is left when it drops.
        unsafe { (self.ucp.cleanup)(self.h) }
    }
}

/// A region's registration with UCX: its memory handle and the packed
/// remote key peers put with.
pub(crate) struct MemReg {
    ctx: Arc<Context>,
    memh: ffi::MemH,
    rkey: Vec<u8>,
}

// SAFETY: the memory handle is UCX's, used only to unregister, which the
// context (shared between workers) allows from any thread.
unsafe impl Send for MemReg {}

impl fmt::Debug for MemReg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "UCX registration ({} byte key)", self.rkey.len())
    }
}

impl MemReg {
    /// Registers `len` bytes at `addr`, which must stay mapped as long as
    /// the registration lives.
    pub(crate) fn new(ctx: &Arc<Context>, addr: *mut u8, len: usize) -> io::Result<MemReg> {
        let ucp = ctx.ucp;
        let params = ffi::MemMapParams {
            field_mask: ffi::UCP_MEM_MAP_PARAM_FIELD_ADDRESS | ffi::UCP_MEM_MAP_PARAM_FIELD_LENGTH,
            address: addr.cast(),
            length: len,
        };
        let mut memh = std::ptr::null_mut();
        // SAFETY: a valid parameter block naming memory the caller keeps
        // mapped for the registration's life; `memh` is an out-pointer.
        let s = unsafe { (ucp.mem_map)(ctx.h, &params, &mut memh) };
        if s != ffi::UCS_OK {
            return Err(io::Error::other(format!(
                "ucp_mem_map: {}",
                ucp.describe(s)
            )));
        }
        let (mut buf, mut size) = (std::ptr::null_mut(), 0usize);
        // SAFETY: `memh` was just made on this context; out-pointers valid.
        let s = unsafe { (ucp.rkey_pack)(ctx.h, memh, &mut buf, &mut size) };
        if s != ffi::UCS_OK {
            // SAFETY: the handle made above, unregistered once.
            unsafe { (ucp.mem_unmap)(ctx.h, memh) };
            return Err(io::Error::other(format!(
                "ucp_rkey_pack: {}",
                ucp.describe(s)
            )));
        }
        // SAFETY: UCX handed out `size` bytes at `buf`, released right after
        // the copy.
        let rkey = unsafe { std::slice::from_raw_parts(buf.cast::<u8>(), size) }.to_vec();
        // SAFETY: the buffer rkey_pack returned, released once.
        unsafe { (ucp.rkey_buffer_release)(buf) };
        Ok(MemReg {
            ctx: ctx.clone(),
            memh,
            rkey,
        })
    }

    /// The packed remote key.
    pub(crate) fn rkey(&self) -> &[u8] {
        &self.rkey
    }
}

impl Drop for MemReg {
    fn drop(&mut self) {
        // SAFETY: the handle made in `new`, unregistered once, while its
        // memory is still mapped (the region drops it first).
        unsafe { (self.ctx.ucp.mem_unmap)(self.ctx.h, self.memh) };
    }
}

/// What an endpoint's acceptor threads need of its UCX worker: the
/// worker's address, and the indices of its connections.
#[derive(Debug)]
pub(crate) struct Shared {
    address: Vec<u8>,
    /// The token of each index in use.
    used: Mutex<Vec<Option<u64>>>,
    /// Nodes refused for the answers UCX holds for them (see
    /// [`Refused`]).
    refused: Mutex<Refused>,
}

/// Whom an endpoint takes no new UCX connection from: the nodes UCX holds
/// `held::ANSWERS_CAP` untaken answers for (those of connections gone
/// included: UCX 1.13 did not end a closed endpoint's sends), or every
/// node while it holds `held::TOTAL_CAP` in all; until UCX ends them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Refused {
    pub(crate) all: bool,
    pub(crate) nodes: Vec<u32>,
}

impl Shared {
    fn new(address: Vec<u8>) -> Shared {
        Shared {
            address,
            used: Mutex::new(Vec::new()),
            refused: Mutex::new(Refused::default()),
        }
    }

    /// Refuses new connections as `r` says from now on.
    pub(crate) fn refuse(&self, r: Refused) {
        *self.refused.lock().unwrap_or_else(PoisonError::into_inner) = r;
    }

    /// Whether new connections with `node` are refused for now.
    pub(crate) fn refuses(&self, node: u32) -> bool {
        let r = self.refused.lock().unwrap_or_else(PoisonError::into_inner);
        r.all || r.nodes.contains(&node)
    }

    /// A free index and a fresh token for a new connection; `None` when
    /// the endpoint has 65,536 UCX connections already.
    pub(crate) fn allocate(&self) -> io::Result<Option<(u16, u64)>> {
        let mut t = [0u8; 8];
        getrandom::fill(&mut t).map_err(|e| io::Error::other(e.to_string()))?;
        let token = u64::from_le_bytes(t) & TOKEN_MASK;
        let mut used = self.used.lock().unwrap_or_else(PoisonError::into_inner);
        let i = match used.iter().position(Option::is_none) {
            Some(i) => i,
            None if used.len() <= u16::MAX as usize => {
                used.push(None);
                used.len() - 1
            }
            None => return Ok(None),
        };
        used[i] = Some(token);
        Ok(Some((i as u16, token)))
    }

    /// Gives an index back.
    pub(crate) fn free(&self, index: u16) {
        let mut used = self.used.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(u) = used.get_mut(index as usize) {
            *u = None;
        }
    }

    /// Whether `index` is held with `token`: by a connection, or by a
    /// handshake whose connection its endpoint has not taken yet (the
    /// peer may already be sending on it).
    pub(crate) fn holds(&self, index: u16, token: u64) -> bool {
        let used = self.used.lock().unwrap_or_else(PoisonError::into_inner);
        used.get(index as usize).copied().flatten() == Some(token)
    }

    /// The card that tells a peer how to reach this worker at `index`.
    pub(crate) fn card(&self, index: u16, token: u64) -> Card {
        Card {
            address: self.address.clone(),
            index,
            token,
            credits: CREDITS,
        }
    }
}

/// A UCX connection agreed over the handshake socket, before its endpoint
/// makes it.
#[derive(Debug)]
pub(crate) struct Contact {
    /// The handshake socket, kept to tell when the peer is gone.
    pub(crate) sock: TcpStream,
    /// Where the peer's messages arrive at this side.
    pub(crate) index: u16,
    pub(crate) token: u64,
    /// The peer's card.
    pub(crate) peer: Card,
    /// Gives `index` back unless a connection takes it.
    pub(crate) guard: IndexGuard,
    /// The peer dialled this side.
    pub(crate) accepted: bool,
}

impl Contact {
    pub(crate) fn new(
        sock: TcpStream,
        index: u16,
        token: u64,
        peer: Card,
        shared: Arc<Shared>,
    ) -> Contact {
        Contact {
            sock,
            index,
            token,
            peer,
            guard: IndexGuard {
                shared: Some(shared),
                index,
            },
            accepted: false,
        }
    }

    /// The same, of a connection the peer dialled.
    pub(crate) fn accepted(self) -> Contact {
        Contact {
            accepted: true,
            ..self
        }
    }
}

/// An index of a worker's connections, given back when dropped unless
/// kept.
#[derive(Debug)]
pub(crate) struct IndexGuard {
    shared: Option<Arc<Shared>>,
    index: u16,
}

impl IndexGuard {
    /// A connection holds the index now; the port gives it back.
    pub(crate) fn keep(mut self) {
        self.shared = None;
    }
}

impl Drop for IndexGuard {
    fn drop(&mut self) {
        if let Some(s) = &self.shared {
            s.free(self.index);
        }
    }
}

/// An endpoint's UCP worker, and a note of whether its progress has moved
/// anything since the port last looked: a message UCX took in while a
/// connection waited (for a flush, a put) is probed for on the next pass,
/// and a pass where nothing moved probes for nothing.
#[derive(Debug)]
pub(crate) struct Worker {
    pub(crate) h: ffi::Worker,
    ucp: &'static Ucp,
    stirred: std::cell::Cell<bool>,
}

impl Worker {
    /// Progresses the worker; whether anything moved.
    pub(crate) fn progress(&self) -> bool {
        // SAFETY: a live worker, driven by the thread that owns its
        // endpoint (the only one that reaches this).
        let moved = unsafe { (self.ucp.worker_progress)(self.h) } > 0;
        if moved {
            self.stirred.set(true);
        }
        moved
    }

    /// Whether anything moved since the last call.
    pub(crate) fn stirred(&self) -> bool {
        self.stirred.replace(false)
    }
}

/// Waits for a request of `worker`, progressing it, and frees it; its
/// final status. With `until`, gives up at that time and leaves the request
/// to UCX (`None`).
///
/// # Safety
/// `req` is a live request of `worker`, which the calling thread drives.
pub(crate) unsafe fn finish(
    ucp: &Ucp,
    worker: &Worker,
    req: *mut std::ffi::c_void,
    until: Option<Instant>,
) -> Option<ffi::Status> {
    loop {
        // SAFETY: the caller's contract.
        let s = unsafe { (ucp.request_check_status)(req) };
        if s != ffi::UCS_INPROGRESS {
            // SAFETY: completed; freed once.
            unsafe { (ucp.request_free)(req) };
            return Some(s);
        }
        if until.is_some_and(|t| Instant::now() >= t) {
            tracing::warn!("a UCX request did not end in time; left to UCX");
            return None;
        }
        worker.progress();
    }
}

/// A control message as it goes out: `h` (its length set to the
/// payload's) and the payload, in one block that stays put until UCX has
/// sent it.
pub(crate) fn control_bytes(h: &macrolink_wire::Header, payload: &[u8]) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(macrolink_wire::HEADER_LEN + payload.len());
    control_bytes_into(h, payload, &mut bytes);
    bytes
}

/// As [`control_bytes`], into `bytes` (cleared first): a buffer used
/// before is used again without allocating.
pub(crate) fn control_bytes_into(h: &macrolink_wire::Header, payload: &[u8], bytes: &mut Vec<u8>) {
    let mut h = *h;
    h.len = payload.len() as u32;
    bytes.clear();
    bytes.extend_from_slice(&h.encode());
    bytes.extend_from_slice(payload);
}

/// A UCX status as an I/O error naming what failed.
pub(crate) fn error(ucp: &Ucp, what: &str, s: ffi::Status) -> io::Error {
    io::Error::other(format!("{what}: {}", ucp.describe(s)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_memory_lists_are_told_from_others() {
        assert!(shared_memory_only("sm,self"));
        assert!(shared_memory_only("posix, cma"));
        assert!(!shared_memory_only("tcp"));
        assert!(!shared_memory_only("rc,sm,self"));
        assert!(!shared_memory_only("all"));
    }

    #[test]
    fn indices_are_handed_out_once_and_given_back() {
        let s = Shared::new(vec![1, 2, 3]);
        let (a, ta) = s.allocate().unwrap().unwrap();
        let (b, tb) = s.allocate().unwrap().unwrap();
        assert_ne!(a, b);
        assert!(ta <= TOKEN_MASK && tb <= TOKEN_MASK);
        assert!(s.holds(a, ta) && s.holds(b, tb));
        assert!(!s.holds(a, tb), "another token");
        s.free(a);
        assert!(!s.holds(a, ta), "given back");
        let (c, tc) = s.allocate().unwrap().unwrap();
        assert_eq!(c, a, "a freed index is taken again");
        assert!(s.holds(c, tc));
        let card = s.card(b, tb);
        assert_eq!((card.index, card.token, card.credits), (b, tb, CREDITS));
        s.refuse(Refused {
            all: false,
            nodes: vec![2, u32::MAX],
        });
        assert!(s.refuses(2) && s.refuses(u32::MAX), "refused nodes");
        assert!(!s.refuses(3), "another node");
        s.refuse(Refused {
            all: true,
            nodes: Vec::new(),
        });
        assert!(s.refuses(3), "every node refused");
        s.refuse(Refused::default());
        assert!(!s.refuses(2), "taken again");
    }
}
