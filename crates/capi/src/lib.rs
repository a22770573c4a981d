//! C ABI of the messaging core, after DP-II's calls: `dp_open`, `dp_target`,
//! `dp_write`, `dp_read`, `dp_close`, plus `dp_register` / `dp_put` for put
//! mode. The header is `include/macrolink.h`.
//!
//! A process holds one node (`dp_init`); endpoints are small integers, as
//! DP-II's were file descriptors. Each endpoint sits behind its own lock, so
//! threads may use different endpoints at once. Errors are negative
//! `DP_E*` codes; `dp_strerror` names them.

use macrolink_fabric::{
    Addr, Completion, Endpoint, EndpointConfig, Error, Mode, Node, NodeConfig, RecvKind, RegionKey,
    Target, Transport,
};
use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

/// Errors, as returned (negated) by every call.
#[repr(i32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DpError {
    /// An argument is invalid.
    Inval = 1,
    /// `dp_init` has not been called (or `dp_finalize` has).
    NotInit = 2,
    /// No such endpoint descriptor or target.
    BadF = 3,
    /// Datagram longer than one MTU.
    TooLarge = 4,
    /// The buffer cannot hold the next message (it stays queued).
    SmallBuf = 5,
    /// The remote endpoint is not open.
    NoEp = 6,
    /// No way to reach the node.
    Unreach = 7,
    /// The peer died or the connection broke.
    Lost = 8,
    /// The target refused the put (bad key or out of bounds).
    Refused = 9,
    /// Nothing arrived in time.
    TimedOut = 10,
    /// The endpoint id is already open.
    InUse = 11,
    /// The call does not fit the target's mode or transport.
    Mode = 12,
    /// An operating-system error.
    Io = 13,
    /// The peer broke the protocol.
    Proto = 14,
}

impl From<&Error> for DpError {
    fn from(e: &Error) -> DpError {
        match e {
            Error::TooLarge { .. } => DpError::TooLarge,
            Error::BufferTooSmall { .. } => DpError::SmallBuf,
            Error::EndpointInUse(_) => DpError::InUse,
            Error::NoSuchEndpoint(_) => DpError::NoEp,
            Error::Unreachable { .. } | Error::NoUcx | Error::UcxMissing(_) => DpError::Unreach,
            Error::Unsupported { .. } | Error::WrongMode(_) => DpError::Mode,
            Error::BadTarget | Error::NoSuchRegion => DpError::BadF,
            Error::PeerLost { .. } => DpError::Lost,
            Error::PutRefused(_) => DpError::Refused,
            Error::Protocol { .. } => DpError::Proto,
            Error::Timeout => DpError::TimedOut,
            _ => DpError::Io,
        }
    }
}

fn code(e: DpError) -> c_int {
    -(e as c_int)
}

fn fail(e: Error) -> c_int {
    code(DpError::from(&e))
}

/// What `dp_read` received (`struct dp_info` in the header).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct DpInfo {
    /// Sending node.
    pub node: u32,
    /// Sending endpoint.
    pub ep: u32,
    /// 0: a message (`mode` says which); 1: a put was placed.
    pub kind: u32,
    /// Mode of a message (`DP_DATAGRAM`, `DP_RELIABLE`).
    pub mode: u32,
    /// Region key of a placed put.
    pub key: u64,
    /// Region offset of a placed put.
    pub offset: u64,
}

struct Dp {
    node: Node,
    eps: Vec<Option<Arc<Mutex<Endpoint>>>>,
}

static STATE: Mutex<Option<Dp>> = Mutex::new(None);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn endpoint(fd: c_int) -> Result<Arc<Mutex<Endpoint>>, c_int> {
    let st = lock(&STATE);
    let dp = st.as_ref().ok_or(code(DpError::NotInit))?;
    usize::try_from(fd)
        .ok()
        .and_then(|i| dp.eps.get(i).cloned().flatten())
        .ok_or(code(DpError::BadF))
}

/// Reads an optional C string.
///
/// # Safety
/// `s` is null or points to a NUL-terminated string.
unsafe fn opt_str<'a>(s: *const c_char) -> Result<Option<&'a str>, c_int> {
    if s.is_null() {
        return Ok(None);
    }
    // SAFETY: the caller promises a NUL-terminated string.
    unsafe { CStr::from_ptr(s) }
        .to_str()
        .map(Some)
        .map_err(|_| code(DpError::Inval))
}

/// The caller's input buffer as a slice.
///
/// # Safety
/// `buf` points to `len` readable bytes that stay valid for `'a`, or `len` is 0.
unsafe fn input<'a>(buf: *const c_void, len: usize) -> Result<&'a [u8], c_int> {
    if len == 0 {
        return Ok(&[]);
    }
    if buf.is_null() {
        return Err(code(DpError::Inval));
    }
    // SAFETY: non-null, and the caller promises `len` readable bytes.
    Ok(unsafe { std::slice::from_raw_parts(buf.cast::<u8>(), len) })
}

/// Starts this process's node. `shm_dir` (NULL: the default) is where nodes
/// of this host meet; `tcp_listen` (NULL: "127.0.0.1:0") is the TCP address.
/// With `MACROLINK_UCX=1` in the environment the node starts UCX too (its
/// transports from `UCX_TLS`, `UCX_NET_DEVICES`), for targets over `DP_UCX`.
///
/// # Safety
/// The strings are NULL or NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn dp_init(
    node: u32,
    shm_dir: *const c_char,
    tcp_listen: *const c_char,
) -> c_int {
    // SAFETY: forwarded caller guarantee.
    let (dir, tcp) = match unsafe { (opt_str(shm_dir), opt_str(tcp_listen)) } {
        (Ok(d), Ok(t)) => (d, t),
        _ => return code(DpError::Inval),
    };
    let mut cfg = NodeConfig::local(
        node,
        dir.map_or_else(macrolink_fabric::default_shm_dir, Into::into),
    );
    if let Some(t) = tcp {
        match t.parse() {
            Ok(a) => cfg.tcp = Some(a),
            Err(_) => return code(DpError::Inval),
        }
    }
    if std::env::var("MACROLINK_UCX").is_ok_and(|v| v == "1") {
        cfg.ucx = Some(macrolink_fabric::UcxOptions::default());
    }
    let mut st = lock(&STATE);
    if st.is_some() {
        return code(DpError::InUse);
    }
    match Node::start(cfg) {
        Ok(node) => {
            *st = Some(Dp {
                node,
                eps: Vec::new(),
            });
            0
        }
        Err(e) => fail(e),
    }
}

/// The TCP port this node listens on, or a negative error.
#[no_mangle]
pub extern "C" fn dp_tcp_port() -> c_int {
    match lock(&STATE).as_ref() {
        Some(dp) => dp.node.tcp_addr().map_or(0, |a| c_int::from(a.port())),
        None => code(DpError::NotInit),
    }
}

/// Records another node's TCP address ("host:port").
///
/// # Safety
/// `tcp_addr` is NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn dp_add_peer(node: u32, tcp_addr: *const c_char) -> c_int {
    // SAFETY: forwarded caller guarantee.
    let Ok(Some(a)) = (unsafe { opt_str(tcp_addr) }) else {
        return code(DpError::Inval);
    };
    let Ok(addr) = a.parse() else {
        return code(DpError::Inval);
    };
    match lock(&STATE).as_ref() {
        Some(dp) => {
            dp.node.add_peer(node, addr);
            0
        }
        None => code(DpError::NotInit),
    }
}

/// Opens endpoint `dpid`; `completion` is `DP_POLL` or `DP_WAIT`. Returns a
/// descriptor.
#[no_mangle]
pub extern "C" fn dp_open(dpid: u32, completion: c_int) -> c_int {
    let completion = match completion {
        0 => Completion::Poll,
        1 => Completion::Wait,
        _ => return code(DpError::Inval),
    };
    let mut st = lock(&STATE);
    let Some(dp) = st.as_mut() else {
        return code(DpError::NotInit);
    };
    let cfg = EndpointConfig {
        completion,
        ..EndpointConfig::default()
    };
    match dp.node.open(dpid, cfg) {
        Ok(ep) => {
            let ep = Some(Arc::new(Mutex::new(ep)));
            match dp.eps.iter().position(Option::is_none) {
                Some(i) => {
                    dp.eps[i] = ep;
                    i as c_int
                }
                None => {
                    dp.eps.push(ep);
                    (dp.eps.len() - 1) as c_int
                }
            }
        }
        Err(e) => fail(e),
    }
}

/// Makes a target for endpoint (`nid`, `dpid`) in `mode` (`DP_DATAGRAM`,
/// `DP_RELIABLE`, `DP_PUT`) over `transport` (`DP_AUTO`, `DP_SHM`, `DP_TCP`,
/// `DP_UDP`). Returns a target number.
#[no_mangle]
pub extern "C" fn dp_target(
    fd: c_int,
    nid: u32,
    dpid: u32,
    mode: c_int,
    transport: c_int,
) -> c_int {
    let mode = match mode {
        0 => Mode::Datagram,
        1 => Mode::Reliable,
        2 => Mode::Put,
        _ => return code(DpError::Inval),
    };
    let ep = match endpoint(fd) {
        Ok(e) => e,
        Err(c) => return c,
    };
    let mut ep = lock(&ep);
    let to = Addr::new(nid, dpid);
    let r = match transport {
        0 => ep.target(to, mode),
        1 => ep.target_via(to, mode, Transport::Shm),
        2 => ep.target_via(to, mode, Transport::Tcp),
        3 => ep.target_via(to, mode, Transport::Udp),
        4 => ep.target_via(to, mode, Transport::Ucx),
        _ => return code(DpError::Inval),
    };
    match r {
        Ok(t) => c_int::try_from(t.index()).unwrap_or(code(DpError::BadF)),
        Err(e) => fail(e),
    }
}

fn target_from(n: c_int) -> Option<Target> {
    u32::try_from(n).ok().map(Target::from_index)
}

/// Sends `len` bytes to target `t`. Returns `len` or a negative error.
///
/// # Safety
/// `buf` points to `len` readable bytes (or `len` is 0).
#[no_mangle]
pub unsafe extern "C" fn dp_write(fd: c_int, t: c_int, buf: *const c_void, len: usize) -> isize {
    let Some(t) = target_from(t) else {
        return code(DpError::BadF) as isize;
    };
    // SAFETY: forwarded caller guarantee.
    let data = match unsafe { input(buf, len) } {
        Ok(d) => d,
        Err(c) => return c as isize,
    };
    let ep = match endpoint(fd) {
        Ok(e) => e,
        Err(c) => return c as isize,
    };
    let r = lock(&ep).write(t, data);
    match r {
        Ok(()) => len as isize,
        Err(e) => fail(e) as isize,
    }
}

/// Receives the next message into `buf` (or a put notification), waiting up
/// to `timeout_ms` (negative: forever). Returns the bytes received and fills
/// `info` when it is not NULL.
///
/// # Safety
/// `buf` points to `len` writable bytes; `info` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn dp_read(
    fd: c_int,
    buf: *mut c_void,
    len: usize,
    info: *mut DpInfo,
    timeout_ms: c_int,
) -> isize {
    if buf.is_null() && len != 0 {
        return code(DpError::Inval) as isize;
    }
    let dst = if len == 0 {
        &mut [][..]
    } else {
        // SAFETY: the caller promises `len` writable bytes at `buf`.
        unsafe { std::slice::from_raw_parts_mut(buf.cast::<u8>(), len) }
    };
    let ep = match endpoint(fd) {
        Ok(e) => e,
        Err(c) => return c as isize,
    };
    let mut ep = lock(&ep);
    let r = if timeout_ms < 0 {
        ep.read(dst).map(Some)
    } else {
        ep.read_timeout(dst, Duration::from_millis(timeout_ms as u64))
    };
    match r {
        Ok(Some(r)) => {
            if !info.is_null() {
                let mut i = DpInfo {
                    node: r.from.node,
                    ep: r.from.ep,
                    ..DpInfo::default()
                };
                match r.kind {
                    RecvKind::Message(m) => i.mode = m as u32,
                    RecvKind::PutPlaced { key, offset } => {
                        i.kind = 1;
                        i.mode = Mode::Put as u32;
                        i.key = key.0;
                        i.offset = offset;
                    }
                }
                // SAFETY: the caller promises `info` is writable when not null.
                unsafe { info.write(i) };
            }
            r.len as isize
        }
        Ok(None) => code(DpError::TimedOut) as isize,
        Err(e) => fail(e) as isize,
    }
}

/// Registers a zeroed region of `len` bytes that peers may put into; writes
/// its key to `*key` and its address to `*base` (valid until `dp_close`).
///
/// # Safety
/// `key` and `base` are writable (or NULL).
#[no_mangle]
pub unsafe extern "C" fn dp_register(
    fd: c_int,
    len: usize,
    key: *mut u64,
    base: *mut *mut c_void,
) -> c_int {
    let ep = match endpoint(fd) {
        Ok(e) => e,
        Err(c) => return c,
    };
    let mut ep = lock(&ep);
    match ep.register(len) {
        Ok(k) => {
            let ptr = ep
                .region_ptr(k)
                .map_or(std::ptr::null_mut(), |(p, _)| p.as_ptr().cast::<c_void>());
            // SAFETY: the caller promises writable pointers when not null.
            unsafe {
                if !key.is_null() {
                    key.write(k.0);
                }
                if !base.is_null() {
                    base.write(ptr);
                }
            }
            0
        }
        Err(e) => fail(e),
    }
}

/// Writes `len` bytes into the target's region `key` at `offset` and waits
/// until they are placed. With `notify` the target's next read reports it.
///
/// # Safety
/// `buf` points to `len` readable bytes (or `len` is 0).
#[no_mangle]
pub unsafe extern "C" fn dp_put(
    fd: c_int,
    t: c_int,
    buf: *const c_void,
    len: usize,
    offset: u64,
    key: u64,
    notify: c_int,
) -> c_int {
    let Some(t) = target_from(t) else {
        return code(DpError::BadF);
    };
    // SAFETY: forwarded caller guarantee.
    let data = match unsafe { input(buf, len) } {
        Ok(d) => d,
        Err(c) => return c,
    };
    let ep = match endpoint(fd) {
        Ok(e) => e,
        Err(c) => return c,
    };
    let r = lock(&ep).put_wait(t, data, offset, RegionKey(key), notify != 0);
    match r {
        Ok(()) => 0,
        Err(e) => fail(e),
    }
}

/// Moves incoming traffic along (places puts) without reading. Returns 1 if
/// anything moved, 0 if not.
#[no_mangle]
pub extern "C" fn dp_progress(fd: c_int) -> c_int {
    let ep = match endpoint(fd) {
        Ok(e) => e,
        Err(c) => return c,
    };
    let r = lock(&ep).progress();
    match r {
        Ok(moved) => c_int::from(moved),
        Err(e) => fail(e),
    }
}

/// Closes an endpoint; its connections close and peers see them go.
#[no_mangle]
pub extern "C" fn dp_close(fd: c_int) -> c_int {
    let mut st = lock(&STATE);
    let Some(dp) = st.as_mut() else {
        return code(DpError::NotInit);
    };
    match usize::try_from(fd).ok().and_then(|i| dp.eps.get_mut(i)) {
        Some(slot @ Some(_)) => {
            *slot = None;
            0
        }
        _ => code(DpError::BadF),
    }
}

/// Closes every endpoint and stops the node.
#[no_mangle]
pub extern "C" fn dp_finalize() -> c_int {
    match lock(&STATE).take() {
        Some(_) => 0,
        None => code(DpError::NotInit),
    }
}

/// A static description of a (negative) error code.
#[no_mangle]
pub extern "C" fn dp_strerror(err: c_int) -> *const c_char {
    let s: &'static CStr = match -err {
        0 => c"success",
        1 => c"invalid argument",
        2 => c"dp_init has not been called",
        3 => c"no such endpoint descriptor, target or region",
        4 => c"datagram exceeds the MTU",
        5 => c"buffer too small for the next message",
        6 => c"no such remote endpoint",
        7 => c"node not reachable",
        8 => c"peer lost",
        9 => c"put refused by the target",
        10 => c"timed out",
        11 => c"already open",
        12 => c"call does not fit the target's mode or transport",
        13 => c"operating-system error",
        14 => c"protocol error",
        _ => c"unknown error",
    };
    s.as_ptr()
}
