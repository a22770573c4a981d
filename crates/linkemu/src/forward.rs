//! The loop of `macrolink link`: packets read from one end go through that
//! direction's [`Pipe`] and are written to the other end when due. The only
//! I/O of the emulator; the decisions are the pipes'.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::pipe::{flip, Pipe};
use crate::stats::Stats;
use crate::Nanos;

/// Largest packet a TUN device hands over.
const MAX_PACKET: usize = 65_536;
/// Packets read from one end in one pass, so the other is not starved.
const BURST: usize = 64;
/// Longest sleep, so that the flags are looked at.
const TICK: Duration = Duration::from_millis(20);

/// Signals from outside the loop (shared with signal handlers).
#[derive(Debug, Default)]
pub struct Control {
    /// End the loop.
    pub stop: Arc<AtomicBool>,
    /// Report the counters now.
    pub report: Arc<AtomicBool>,
}

/// Forwards between `a` and `b` until `ctl.stop`: A to B through `ab`, B
/// to A through `ba`. `report` hears the counters (A to B, B to A) when
/// `ctl.report` is raised and at the end.
pub fn run(
    a: &File,
    b: &File,
    ab: &mut Pipe<Vec<u8>>,
    ba: &mut Pipe<Vec<u8>>,
    ctl: &Control,
    report: &mut dyn FnMut(Stats, Stats),
) -> io::Result<()> {
    // Wake-ups to the microsecond, not the default 50 us of slack.
    // SAFETY: PR_SET_TIMERSLACK takes a number and touches no memory.
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1) };
    let start = Instant::now();
    let now = || start.elapsed().as_nanos() as Nanos;
    let mut buf = vec![0u8; MAX_PACKET];
    while !ctl.stop.load(Ordering::Relaxed) {
        if ctl.report.swap(false, Ordering::Relaxed) {
            report(ab.stats(), ba.stats());
        }
        let due = [ab.next_due(), ba.next_due()].into_iter().flatten().min();
        let wait = due.map_or(TICK, |d| {
            Duration::from_nanos(d.saturating_sub(now())).min(TICK)
        });
        sleep_on(&[a, b], wait)?;
        take(a, ab, &mut buf, now())?;
        take(b, ba, &mut buf, now())?;
        give(ab, b, now())?;
        give(ba, a, now())?;
    }
    report(ab.stats(), ba.stats());
    Ok(())
}

/// Offers what `from` has to `pipe`.
fn take(mut from: &File, pipe: &mut Pipe<Vec<u8>>, buf: &mut [u8], now: Nanos) -> io::Result<()> {
    for _ in 0..BURST {
        match from.read(buf) {
            Ok(n) => {
                pipe.offer(now, n, buf[..n].to_vec());
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Writes what is due in `pipe` to `to`.
fn give(pipe: &mut Pipe<Vec<u8>>, mut to: &File, now: Nanos) -> io::Result<()> {
    while let Some(mut d) = pipe.pop_due(now) {
        if let Some(bit) = d.flip_bit {
            flip(&mut d.packet, bit);
        }
        match to.write(&d.packet) {
            Ok(_) => {}
            // The kernel would not take it (queue full, a packet it cannot
            // route): lost on the far side, as on a wire.
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Sleeps until one of `files` is readable or `wait` has passed, to the
/// microsecond (ppoll), so that packets leave on time.
fn sleep_on(files: &[&File], wait: Duration) -> io::Result<()> {
    let mut fds: Vec<libc::pollfd> = files
        .iter()
        .map(|f| libc::pollfd {
            fd: f.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    let ts = libc::timespec {
        tv_sec: wait.as_secs() as libc::time_t,
        tv_nsec: wait.subsec_nanos() as libc::c_long,
    };
    // SAFETY: `fds` and `ts` live through the call, and the length is
    // theirs; no signal mask is passed.
    let r = unsafe {
        libc::ppoll(
            fds.as_mut_ptr(),
            fds.len() as libc::nfds_t,
            &ts,
            std::ptr::null(),
        )
    };
    if r < 0 {
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
    Ok(())
}

/// What `macrolink link` is asked for.
#[derive(Clone, Debug)]
pub struct Emulate {
    /// Namespace of each end (`None`: this process's), and the address
    /// (CIDR) of its device.
    pub ends: [(Option<String>, String); 2],
    /// What the link does from A to B.
    pub a_to_b: crate::Spec,
    /// What the link does from B to A.
    pub b_to_a: crate::Spec,
    /// Counters as JSON rather than text.
    pub json: bool,
    /// MTU of both devices.
    pub mtu: u32,
}

/// Joins the two ends through TUN devices and forwards until SIGINT or
/// SIGTERM; SIGUSR1 prints the counters, as does the end. `ready` is called
/// once the devices are up, with their names.
pub fn emulate(e: &Emulate, ready: impl FnOnce(&str, &str) -> io::Result<()>) -> io::Result<()> {
    use signal_hook::consts::{SIGINT, SIGTERM, SIGUSR1};
    let ctl = Control::default();
    for sig in [SIGINT, SIGTERM] {
        signal_hook::flag::register(sig, ctl.stop.clone())?;
    }
    signal_hook::flag::register(SIGUSR1, ctl.report.clone())?;
    // Names unique on the host while both devices still sit in it.
    let tag = std::process::id() % 100_000;
    let [(ns_a, addr_a), (ns_b, addr_b)] = &e.ends;
    let a = crate::tun::End::open(&format!("mlk{tag}a"), ns_a.as_deref(), addr_a, e.mtu)?;
    let b = crate::tun::End::open(&format!("mlk{tag}b"), ns_b.as_deref(), addr_b, e.mtu)?;
    ready(&a.name, &b.name)?;
    let (mut ab, mut ba) = (Pipe::new(e.a_to_b), Pipe::new(e.b_to_a));
    let json = e.json;
    run(&a.dev, &b.dev, &mut ab, &mut ba, &ctl, &mut |x, y| {
        if json {
            println!("{}", serde_json::json!({ "a_to_b": x, "b_to_a": y }));
        } else {
            println!("A to B: {x}\nB to A: {y}");
        }
    })
}
