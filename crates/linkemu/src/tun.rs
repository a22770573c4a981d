//! The TUN devices a link joins: one at each end, each in its own network
//! namespace (or this process's), every IP packet routed into one read here
//! and written into the other.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::process::Command;

/// `TUNSETIFF` from `linux/if_tun.h`: `_IOW('T', 202, int)`.
const TUNSETIFF: libc::c_ulong = 0x4004_54ca;

/// One end of a link: a TUN device, and where it sits.
#[derive(Debug)]
pub struct End {
    /// The device, to read packets from and write them to.
    pub dev: File,
    /// Its name.
    pub name: String,
    /// The namespace it was moved to (`None`: this process's).
    pub ns: Option<String>,
}

impl End {
    /// Makes TUN device `name` (raw IP packets, no header), moves it into
    /// namespace `ns` (if any), gives it `addr` (CIDR) and `mtu`, and brings
    /// it up.
    pub fn open(name: &str, ns: Option<&str>, addr: &str, mtu: u32) -> io::Result<End> {
        if name.len() >= libc::IFNAMSIZ {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "device name too long",
            ));
        }
        let dev = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open("/dev/net/tun")?;
        // SAFETY: ifreq is plain data; all zeroes is a valid value.
        let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
        for (d, s) in req.ifr_name.iter_mut().zip(name.bytes()) {
            *d = s as libc::c_char;
        }
        req.ifr_ifru.ifru_flags = (libc::IFF_TUN | libc::IFF_NO_PI) as libc::c_short;
        // SAFETY: TUNSETIFF reads and writes the ifreq, which lives through
        // the call; the descriptor is open.
        if unsafe { libc::ioctl(dev.as_raw_fd(), TUNSETIFF, &mut req) } < 0 {
            return Err(io::Error::last_os_error());
        }
        let end = End {
            dev,
            name: name.to_string(),
            ns: ns.map(str::to_string),
        };
        if let Some(ns) = ns {
            ip(&["link", "set", name, "netns", ns])?;
        }
        end.ip(&["addr", "add", addr, "dev", name])?;
        end.ip(&["link", "set", name, "mtu", &mtu.to_string(), "up"])?;
        Ok(end)
    }

    /// Runs `ip ARGS` where the device sits.
    fn ip(&self, args: &[&str]) -> io::Result<()> {
        match &self.ns {
            Some(ns) => {
                let mut all = vec!["-n", ns.as_str()];
                all.extend_from_slice(args);
                ip(&all)
            }
            None => ip(args),
        }
    }
}

impl Drop for End {
    fn drop(&mut self) {
        // Closing the descriptor removes the device; say so early where the
        // namespace may go first.
        let _ = self.ip(&["link", "del", &self.name]);
    }
}

fn ip(args: &[&str]) -> io::Result<()> {
    let out = Command::new("ip").args(args).output()?;
    if out.status.success() {
        Ok(())
    } else {
        Err(io::Error::other(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}
