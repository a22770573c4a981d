//! The few calls of UCX's UCP layer that the transport uses, loaded from
//! `libucp.so.0` at run time: a build of macrolink needs no UCX, and a host
//! without it is told which package to install when `ucx` is asked for.
//!
//! The structures below copy the layout of UCX 1.x's `ucp.h` up to the last
//! field used; every one is passed with a field mask naming only fields
//! that UCX has had since 1.10, so a newer library reads nothing past them.
//! `layouts_match_the_installed_headers` checks each offset against the C
//! compiler's view of the installed headers.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::sync::OnceLock;

/// `ucs_status_t`: a packed enum, one byte.
pub(crate) type Status = i8;
pub(crate) const UCS_OK: Status = 0;
pub(crate) const UCS_INPROGRESS: Status = 1;
pub(crate) const UCS_ERR_CANCELED: Status = -16;
const UCS_ERR_LAST: isize = -100;

/// `ucs_status_ptr_t`: null (done at once), a request, or an error code.
pub(crate) type StatusPtr = *mut c_void;

/// What a `ucs_status_ptr_t` says (`UCS_PTR_IS_ERR`, `UCS_PTR_IS_PTR`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Posted {
    /// Completed at once.
    Done,
    /// Goes on; the request is to be tested and freed.
    Request(*mut c_void),
    /// Failed at once.
    Failed(Status),
}

pub(crate) fn posted(p: StatusPtr) -> Posted {
    let v = p as usize;
    if v == 0 {
        Posted::Done
    } else if v >= UCS_ERR_LAST as usize {
        Posted::Failed(v as isize as Status)
    } else {
        Posted::Request(p)
    }
}

pub(crate) type Context = *mut c_void;
pub(crate) type Worker = *mut c_void;
pub(crate) type Ep = *mut c_void;
pub(crate) type MemH = *mut c_void;
pub(crate) type RKey = *mut c_void;
pub(crate) type TagMessage = *mut c_void;
pub(crate) type Tag = u64;

pub(crate) const UCP_API_MAJOR: c_uint = 1;
pub(crate) const UCP_API_MINOR: c_uint = 10;

pub(crate) const UCP_PARAM_FIELD_FEATURES: u64 = 1 << 0;
pub(crate) const UCP_PARAM_FIELD_MT_WORKERS_SHARED: u64 = 1 << 5;
pub(crate) const UCP_PARAM_FIELD_NAME: u64 = 1 << 8;
pub(crate) const UCP_FEATURE_TAG: u64 = 1 << 0;
pub(crate) const UCP_FEATURE_RMA: u64 = 1 << 1;
pub(crate) const UCP_FEATURE_WAKEUP: u64 = 1 << 4;
pub(crate) const UCP_FEATURE_AM: u64 = 1 << 6;

/// `ucp_params_t`.
#[repr(C)]
pub(crate) struct Params {
    pub field_mask: u64,
    pub features: u64,
    pub request_size: usize,
    pub request_init: *mut c_void,
    pub request_cleanup: *mut c_void,
    pub tag_sender_mask: u64,
    pub mt_workers_shared: c_int,
    pub estimated_num_eps: usize,
    pub estimated_num_ppn: usize,
    pub name: *const c_char,
}

pub(crate) const UCP_WORKER_PARAM_FIELD_THREAD_MODE: u64 = 1 << 0;
pub(crate) const UCP_WORKER_PARAM_FIELD_EVENTS: u64 = 1 << 2;
pub(crate) const UCS_THREAD_MODE_SERIALIZED: c_int = 1;
pub(crate) const UCP_WAKEUP_TX: c_uint = 1 << 10;
pub(crate) const UCP_WAKEUP_RX: c_uint = 1 << 11;

/// `ucp_worker_params_t`, up to `events`.
#[repr(C)]
pub(crate) struct WorkerParams {
    pub field_mask: u64,
    pub thread_mode: c_int,
    /// `ucs_cpu_set_t`: 1024 bits.
    pub cpu_mask: [u64; 16],
    pub events: c_uint,
    pub user_data: *mut c_void,
    pub event_fd: c_int,
}

pub(crate) const UCP_EP_PARAM_FIELD_REMOTE_ADDRESS: u64 = 1 << 0;
pub(crate) const UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE: u64 = 1 << 1;
pub(crate) const UCP_EP_PARAM_FIELD_ERR_HANDLER: u64 = 1 << 2;
pub(crate) const UCP_ERR_HANDLING_MODE_PEER: c_int = 1;

/// `ucp_err_handler_cb_t`.
pub(crate) type ErrHandlerCb = unsafe extern "C" fn(arg: *mut c_void, ep: Ep, status: Status);

/// `ucp_ep_params_t`, up to `err_handler`.
#[repr(C)]
pub(crate) struct EpParams {
    pub field_mask: u64,
    pub address: *const c_void,
    pub err_mode: c_int,
    pub err_handler_cb: Option<ErrHandlerCb>,
    pub err_handler_arg: *mut c_void,
}

pub(crate) const UCP_OP_ATTR_FIELD_DATATYPE: u32 = 1 << 3;
pub(crate) const UCP_OP_ATTR_FIELD_FLAGS: u32 = 1 << 4;

pub(crate) const UCP_EP_CLOSE_FLAG_FORCE: u32 = 1 << 0;
pub(crate) const UCP_AM_SEND_FLAG_EAGER: u32 = 1 << 1;
pub(crate) const UCP_DATATYPE_IOV: u64 = 2;

/// `ucp_request_param_t`, up to `recv_info`.
#[repr(C)]
pub(crate) struct RequestParam {
    pub op_attr_mask: u32,
    pub flags: u32,
    pub request: *mut c_void,
    pub cb: *mut c_void,
    pub datatype: u64,
    pub user_data: *mut c_void,
    pub reply_buffer: *mut c_void,
    pub memory_type: c_int,
    pub recv_info: *mut c_void,
}

/// A request parameter block with no field set, shared: UCX only reads it.
pub(crate) struct Defaults(RequestParam);

// SAFETY: the block holds only null pointers and zeros, and nobody writes it.
unsafe impl Sync for Defaults {}

/// No field set: UCX's defaults (contiguous host memory, no callback).
pub(crate) static DEFAULTS: Defaults = Defaults(RequestParam {
    op_attr_mask: 0,
    flags: 0,
    request: std::ptr::null_mut(),
    cb: std::ptr::null_mut(),
    datatype: 0,
    user_data: std::ptr::null_mut(),
    reply_buffer: std::ptr::null_mut(),
    memory_type: 0,
    recv_info: std::ptr::null_mut(),
});

impl Defaults {
    /// The block, to pass to UCX.
    pub(crate) fn get(&self) -> &RequestParam {
        &self.0
    }
}

impl RequestParam {
    /// No field set: UCX's defaults (contiguous host memory, no callback).
    pub(crate) fn new() -> RequestParam {
        RequestParam {
            op_attr_mask: 0,
            flags: 0,
            request: std::ptr::null_mut(),
            cb: std::ptr::null_mut(),
            datatype: 0,
            user_data: std::ptr::null_mut(),
            reply_buffer: std::ptr::null_mut(),
            memory_type: 0,
            recv_info: std::ptr::null_mut(),
        }
    }
}

/// `ucp_tag_recv_info_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct TagRecvInfo {
    pub sender_tag: Tag,
    pub length: usize,
}

/// `ucp_dt_iov_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct DtIov {
    pub buffer: *mut c_void,
    pub length: usize,
}

pub(crate) const UCP_AM_HANDLER_PARAM_FIELD_ID: u64 = 1 << 0;
pub(crate) const UCP_AM_HANDLER_PARAM_FIELD_FLAGS: u64 = 1 << 1;
pub(crate) const UCP_AM_HANDLER_PARAM_FIELD_CB: u64 = 1 << 2;
pub(crate) const UCP_AM_HANDLER_PARAM_FIELD_ARG: u64 = 1 << 3;
pub(crate) const UCP_AM_FLAG_WHOLE_MSG: u32 = 1 << 0;
pub(crate) const UCP_AM_RECV_ATTR_FLAG_RNDV: u64 = 1 << 17;

/// `ucp_am_recv_param_t`.
#[repr(C)]
pub(crate) struct AmRecvParam {
    pub recv_attr: u64,
    pub reply_ep: Ep,
}

/// `ucp_am_recv_callback_t`.
pub(crate) type AmRecvCb = unsafe extern "C" fn(
    arg: *mut c_void,
    header: *const c_void,
    header_length: usize,
    data: *mut c_void,
    length: usize,
    param: *const AmRecvParam,
) -> Status;

/// `ucp_am_handler_param_t`.
#[repr(C)]
pub(crate) struct AmHandlerParam {
    pub field_mask: u64,
    pub id: c_uint,
    pub flags: u32,
    pub cb: Option<AmRecvCb>,
    pub arg: *mut c_void,
}

pub(crate) const UCP_MEM_MAP_PARAM_FIELD_ADDRESS: u64 = 1 << 0;
pub(crate) const UCP_MEM_MAP_PARAM_FIELD_LENGTH: u64 = 1 << 1;

/// `ucp_mem_map_params_t`, up to `length`.
#[repr(C)]
pub(crate) struct MemMapParams {
    pub field_mask: u64,
    pub address: *mut c_void,
    pub length: usize,
}

/// The UCP library: its calls, resolved once.
#[allow(clippy::type_complexity)]
pub(crate) struct Ucp {
    _lib: libloading::Library,
    pub version: (u32, u32, u32),
    pub init_version:
        unsafe extern "C" fn(c_uint, c_uint, *const Params, *const c_void, *mut Context) -> Status,
    pub cleanup: unsafe extern "C" fn(Context),
    pub config_read: unsafe extern "C" fn(*const c_char, *const c_char, *mut *mut c_void) -> Status,
    pub config_modify: unsafe extern "C" fn(*mut c_void, *const c_char, *const c_char) -> Status,
    pub config_release: unsafe extern "C" fn(*mut c_void),
    pub worker_create: unsafe extern "C" fn(Context, *const WorkerParams, *mut Worker) -> Status,
    pub worker_destroy: unsafe extern "C" fn(Worker),
    pub worker_get_address: unsafe extern "C" fn(Worker, *mut *mut c_void, *mut usize) -> Status,
    pub worker_release_address: unsafe extern "C" fn(Worker, *mut c_void),
    pub worker_progress: unsafe extern "C" fn(Worker) -> c_uint,
    pub worker_get_efd: unsafe extern "C" fn(Worker, *mut c_int) -> Status,
    pub worker_arm: unsafe extern "C" fn(Worker) -> Status,
    pub worker_set_am_recv_handler: unsafe extern "C" fn(Worker, *const AmHandlerParam) -> Status,
    pub ep_create: unsafe extern "C" fn(Worker, *const EpParams, *mut Ep) -> Status,
    pub ep_close_nbx: unsafe extern "C" fn(Ep, *const RequestParam) -> StatusPtr,
    pub ep_flush_nbx: unsafe extern "C" fn(Ep, *const RequestParam) -> StatusPtr,
    pub tag_send_nbx:
        unsafe extern "C" fn(Ep, *const c_void, usize, Tag, *const RequestParam) -> StatusPtr,
    pub tag_probe_nb: unsafe extern "C" fn(Worker, Tag, Tag, c_int, *mut TagRecvInfo) -> TagMessage,
    pub tag_msg_recv_nbx: unsafe extern "C" fn(
        Worker,
        *mut c_void,
        usize,
        TagMessage,
        *const RequestParam,
    ) -> StatusPtr,
    pub am_send_nbx: unsafe extern "C" fn(
        Ep,
        c_uint,
        *const c_void,
        usize,
        *const c_void,
        usize,
        *const RequestParam,
    ) -> StatusPtr,
    pub request_check_status: unsafe extern "C" fn(*mut c_void) -> Status,
    pub request_cancel: unsafe extern "C" fn(Worker, *mut c_void),
    pub request_free: unsafe extern "C" fn(*mut c_void),
    pub mem_map: unsafe extern "C" fn(Context, *const MemMapParams, *mut MemH) -> Status,
    pub mem_unmap: unsafe extern "C" fn(Context, MemH) -> Status,
    pub rkey_pack: unsafe extern "C" fn(Context, MemH, *mut *mut c_void, *mut usize) -> Status,
    pub rkey_buffer_release: unsafe extern "C" fn(*mut c_void),
    pub ep_rkey_unpack: unsafe extern "C" fn(Ep, *const c_void, *mut RKey) -> Status,
    pub rkey_destroy: unsafe extern "C" fn(RKey),
    pub put_nbx:
        unsafe extern "C" fn(Ep, *const c_void, usize, u64, RKey, *const RequestParam) -> StatusPtr,
    status_string: unsafe extern "C" fn(Status) -> *const c_char,
}

impl std::fmt::Debug for Ucp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (a, b, c) = self.version;
        write!(f, "libucp {a}.{b}.{c}")
    }
}

/// Why UCX could not be used.
#[derive(Clone, Debug, thiserror::Error)]
#[error("UCX is not installed or not usable here ({0}): install it (Debian: apt-get install libucx0 ucx-utils) or choose another transport")]
pub struct Missing(pub String);

/// The library the process loads, once.
static UCP: OnceLock<Result<Ucp, Missing>> = OnceLock::new();

/// Where to look for the library, first to last.
const NAMES: [&str; 2] = ["libucp.so.0", "libucp.so"];

impl Ucp {
    /// The loaded library, loading it the first time.
    pub(crate) fn get() -> Result<&'static Ucp, Missing> {
        UCP.get_or_init(Ucp::load).as_ref().map_err(Missing::clone)
    }

    fn load() -> Result<Ucp, Missing> {
        let mut why = String::new();
        for name in NAMES {
            // SAFETY: loading libucp runs its initialisers, which set up
            // UCX's own state and nothing of this process's.
            match unsafe { libloading::Library::new(name) } {
                Ok(lib) => return Ucp::resolve(lib).map_err(|e| Missing(format!("{name}: {e}"))),
                Err(e) => why = format!("{name}: {e}"),
            }
        }
        Err(Missing(why))
    }

    fn resolve(lib: libloading::Library) -> Result<Ucp, libloading::Error> {
        macro_rules! sym {
            ($name:literal) => {
                // SAFETY: the symbol is the UCP function of that name, whose
                // C signature the field's type copies from ucp.h; the
                // library stays loaded as long as the `Ucp` that holds it.
                unsafe { *lib.get(concat!($name, "\0").as_bytes())? }
            };
        }
        let get_version: unsafe extern "C" fn(*mut c_uint, *mut c_uint, *mut c_uint) =
            sym!("ucp_get_version");
        let (mut a, mut b, mut c) = (0, 0, 0);
        // SAFETY: three valid out-pointers.
        unsafe { get_version(&mut a, &mut b, &mut c) };
        Ok(Ucp {
            version: (a, b, c),
            init_version: sym!("ucp_init_version"),
            cleanup: sym!("ucp_cleanup"),
            config_read: sym!("ucp_config_read"),
            config_modify: sym!("ucp_config_modify"),
            config_release: sym!("ucp_config_release"),
            worker_create: sym!("ucp_worker_create"),
            worker_destroy: sym!("ucp_worker_destroy"),
            worker_get_address: sym!("ucp_worker_get_address"),
            worker_release_address: sym!("ucp_worker_release_address"),
            worker_progress: sym!("ucp_worker_progress"),
            worker_get_efd: sym!("ucp_worker_get_efd"),
            worker_arm: sym!("ucp_worker_arm"),
            worker_set_am_recv_handler: sym!("ucp_worker_set_am_recv_handler"),
            ep_create: sym!("ucp_ep_create"),
            ep_close_nbx: sym!("ucp_ep_close_nbx"),
            ep_flush_nbx: sym!("ucp_ep_flush_nbx"),
            tag_send_nbx: sym!("ucp_tag_send_nbx"),
            tag_probe_nb: sym!("ucp_tag_probe_nb"),
            tag_msg_recv_nbx: sym!("ucp_tag_msg_recv_nbx"),
            am_send_nbx: sym!("ucp_am_send_nbx"),
            request_check_status: sym!("ucp_request_check_status"),
            request_cancel: sym!("ucp_request_cancel"),
            request_free: sym!("ucp_request_free"),
            mem_map: sym!("ucp_mem_map"),
            mem_unmap: sym!("ucp_mem_unmap"),
            rkey_pack: sym!("ucp_rkey_pack"),
            rkey_buffer_release: sym!("ucp_rkey_buffer_release"),
            ep_rkey_unpack: sym!("ucp_ep_rkey_unpack"),
            rkey_destroy: sym!("ucp_rkey_destroy"),
            put_nbx: sym!("ucp_put_nbx"),
            status_string: sym!("ucs_status_string"),
            _lib: lib,
        })
    }

    /// UCX's words for a status.
    pub(crate) fn describe(&self, s: Status) -> String {
        // SAFETY: ucs_status_string returns a static string for any value.
        let p = unsafe { (self.status_string)(s) };
        if p.is_null() {
            return format!("status {s}");
        }
        // SAFETY: a NUL-terminated static string (above).
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    #[test]
    fn status_pointers_are_told_apart() {
        assert_eq!(posted(std::ptr::null_mut()), Posted::Done);
        let err = (-16isize) as usize as *mut c_void;
        assert_eq!(posted(err), Posted::Failed(UCS_ERR_CANCELED));
        let last = UCS_ERR_LAST as usize as *mut c_void;
        assert_eq!(posted(last), Posted::Failed(-100));
        let req = 0x7f00_1234_5000usize as *mut c_void;
        assert_eq!(posted(req), Posted::Request(req));
    }

    /// The C compiler's offsets of every field used, from the installed
    /// `ucp.h`, against ours. Needs `libucx-dev` and a C compiler; without
    /// them it fails under `MACROLINK_REQUIRE_UCX=1` and passes otherwise.
    #[test]
    fn layouts_match_the_installed_headers() {
        let header = std::path::Path::new("/usr/include/ucp/api/ucp.h");
        if !header.exists() {
            assert!(
                std::env::var_os("MACROLINK_REQUIRE_UCX").is_none(),
                "MACROLINK_REQUIRE_UCX is set but ucp.h is missing (apt-get install libucx-dev)"
            );
            eprintln!("ucp.h is not installed: layouts not checked");
            return;
        }
        let fields: &[(&str, &str, usize)] = &[
            ("ucp_params_t", "features", offset_of!(Params, features)),
            (
                "ucp_params_t",
                "request_size",
                offset_of!(Params, request_size),
            ),
            (
                "ucp_params_t",
                "tag_sender_mask",
                offset_of!(Params, tag_sender_mask),
            ),
            (
                "ucp_params_t",
                "mt_workers_shared",
                offset_of!(Params, mt_workers_shared),
            ),
            (
                "ucp_params_t",
                "estimated_num_ppn",
                offset_of!(Params, estimated_num_ppn),
            ),
            ("ucp_params_t", "name", offset_of!(Params, name)),
            (
                "ucp_worker_params_t",
                "thread_mode",
                offset_of!(WorkerParams, thread_mode),
            ),
            (
                "ucp_worker_params_t",
                "cpu_mask",
                offset_of!(WorkerParams, cpu_mask),
            ),
            (
                "ucp_worker_params_t",
                "events",
                offset_of!(WorkerParams, events),
            ),
            (
                "ucp_worker_params_t",
                "event_fd",
                offset_of!(WorkerParams, event_fd),
            ),
            ("ucp_ep_params_t", "address", offset_of!(EpParams, address)),
            (
                "ucp_ep_params_t",
                "err_mode",
                offset_of!(EpParams, err_mode),
            ),
            (
                "ucp_ep_params_t",
                "err_handler.cb",
                offset_of!(EpParams, err_handler_cb),
            ),
            (
                "ucp_ep_params_t",
                "err_handler.arg",
                offset_of!(EpParams, err_handler_arg),
            ),
            (
                "ucp_request_param_t",
                "flags",
                offset_of!(RequestParam, flags),
            ),
            (
                "ucp_request_param_t",
                "request",
                offset_of!(RequestParam, request),
            ),
            ("ucp_request_param_t", "cb", offset_of!(RequestParam, cb)),
            (
                "ucp_request_param_t",
                "datatype",
                offset_of!(RequestParam, datatype),
            ),
            (
                "ucp_request_param_t",
                "user_data",
                offset_of!(RequestParam, user_data),
            ),
            (
                "ucp_request_param_t",
                "memory_type",
                offset_of!(RequestParam, memory_type),
            ),
            (
                "ucp_request_param_t",
                "recv_info",
                offset_of!(RequestParam, recv_info),
            ),
            (
                "ucp_tag_recv_info_t",
                "length",
                offset_of!(TagRecvInfo, length),
            ),
            ("ucp_dt_iov_t", "length", offset_of!(DtIov, length)),
            (
                "ucp_am_handler_param_t",
                "id",
                offset_of!(AmHandlerParam, id),
            ),
            (
                "ucp_am_handler_param_t",
                "flags",
                offset_of!(AmHandlerParam, flags),
            ),
            (
                "ucp_am_handler_param_t",
                "cb",
                offset_of!(AmHandlerParam, cb),
            ),
            (
                "ucp_am_handler_param_t",
                "arg",
                offset_of!(AmHandlerParam, arg),
            ),
            (
                "ucp_am_recv_param_t",
                "reply_ep",
                offset_of!(AmRecvParam, reply_ep),
            ),
            (
                "ucp_mem_map_params_t",
                "address",
                offset_of!(MemMapParams, address),
            ),
            (
                "ucp_mem_map_params_t",
                "length",
                offset_of!(MemMapParams, length),
            ),
        ];
        let sizes: &[(&str, usize)] = &[
            ("ucp_tag_recv_info_t", size_of::<TagRecvInfo>()),
            ("ucp_dt_iov_t", size_of::<DtIov>()),
            ("ucp_am_recv_param_t", size_of::<AmRecvParam>()),
            ("ucs_status_t", size_of::<Status>()),
        ];
        let mut c = String::from(
            "#include <stdio.h>\n#include <stddef.h>\n#include <ucp/api/ucp.h>\nint main(void) {\n",
        );
        for (t, f, _) in fields {
            c += &format!("printf(\"%zu\\n\", offsetof({t}, {f}));\n");
        }
        for (t, _) in sizes {
            c += &format!("printf(\"%zu\\n\", sizeof({t}));\n");
        }
        c += "return 0; }\n";
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("layout.c");
        let exe = dir.path().join("layout");
        std::fs::write(&src, c).unwrap();
        let built = std::process::Command::new("cc")
            .arg(&src)
            .arg("-o")
            .arg(&exe)
            .status()
            .expect("a C compiler (cc)");
        assert!(built.success(), "cc could not build the layout probe");
        let out = std::process::Command::new(&exe).output().unwrap();
        let theirs: Vec<usize> = String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .map(|l| l.parse().unwrap())
            .collect();
        let ours: Vec<(String, usize)> = fields
            .iter()
            .map(|(t, f, o)| (format!("offsetof({t}, {f})"), *o))
            .chain(sizes.iter().map(|(t, s)| (format!("sizeof({t})"), *s)))
            .collect();
        assert_eq!(theirs.len(), ours.len());
        for ((what, o), t) in ours.iter().zip(&theirs) {
            assert_eq!(o, t, "{what}: ours {o}, ucp.h {t}");
        }
    }
}
