//! What macrolink's services count, over HTTP: `/metrics` in the format
//! Prometheus scrapes, from a [`Registry`] the service filled, and any
//! page a service adds (the central manager's status page).
//!
//! A peer of this listener proves nothing (Prometheus does not), so it is
//! served one request at a time, each whole exchange within
//! [`DEADLINE`], requests of at most [`MAX_REQUEST`] bytes, answers only to
//! `GET`; it reads, never changes anything.
//!
//! ```text
//!  GET /metrics ──► encode(registry)      GET /other ──► pages(path) or 404
//! ```
#![forbid(unsafe_code)]

use prometheus_client::registry::Registry;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The whole exchange with one peer, at most.
pub const DEADLINE: Duration = Duration::from_secs(2);
/// Longest request head taken.
pub const MAX_REQUEST: usize = 8192;

/// A page besides `/metrics`: its content type and body, for a path.
pub type Pages = dyn Fn(&str) -> Option<(&'static str, String)> + Send + Sync;

/// The metrics of `registry` as Prometheus scrapes them.
pub fn encode(registry: &Registry) -> String {
    let mut out = String::new();
    let _ = prometheus_client::encoding::text::encode(&mut out, registry);
    out
}

/// Serves `registry` (and `pages`) on `listener`, on a thread of its own,
/// for as long as the process lives.
pub fn serve(
    listener: TcpListener,
    registry: Arc<Registry>,
    pages: Option<Arc<Pages>>,
) -> io::Result<()> {
    std::thread::Builder::new()
        .name("ml-metrics".into())
        .spawn(move || {
            for s in listener.incoming().flatten() {
                if let Err(e) = answer(s, &registry, pages.as_deref()) {
                    tracing::debug!("metrics: {e}");
                }
            }
        })?;
    Ok(())
}

/// Binds `at` and serves `registry` there (see [`serve`]); the address
/// bound, for a port of 0.
pub fn bind(at: SocketAddr, registry: Registry) -> io::Result<SocketAddr> {
    let l = TcpListener::bind(at)
        .map_err(|e| io::Error::new(e.kind(), format!("--metrics {at}: {e}")))?;
    let bound = l.local_addr()?;
    serve(l, Arc::new(registry), None)?;
    Ok(bound)
}

/// One exchange, within the deadline.
fn answer(mut s: TcpStream, registry: &Registry, pages: Option<&Pages>) -> io::Result<()> {
    let until = Instant::now() + DEADLINE;
    let mut head = Vec::with_capacity(512);
    let mut chunk = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() || head.len() > MAX_REQUEST {
            return reply(&mut s, "408 Request Timeout", "text/plain", "");
        }
        s.set_read_timeout(Some(left))?;
        let n = s.read(&mut chunk)?;
        if n == 0 {
            return Ok(());
        }
        head.extend_from_slice(&chunk[..n]);
    }
    let line = head.split(|&b| b == b'\r').next().unwrap_or(&[]);
    let line = String::from_utf8_lossy(line);
    let mut words = line.split_whitespace();
    let (method, path) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
    if method != "GET" {
        return reply(&mut s, "405 Method Not Allowed", "text/plain", "GET only\n");
    }
    if path == "/metrics" {
        let kind = "application/openmetrics-text; version=1.0.0; charset=utf-8";
        return reply(&mut s, "200 OK", kind, &encode(registry));
    }
    match pages.and_then(|p| p(path)) {
        Some((kind, body)) => reply(&mut s, "200 OK", kind, &body),
        None => reply(&mut s, "404 Not Found", "text/plain", "not found\n"),
    }
}

fn reply(s: &mut TcpStream, status: &str, kind: &str, body: &str) -> io::Result<()> {
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let until = Instant::now() + DEADLINE;
    let mut out = head.into_bytes();
    out.extend_from_slice(body.as_bytes());
    let mut at = 0;
    // Each write gets only what is left of the deadline: a reader that
    // takes a few bytes now and then cannot stretch the exchange.
    while at < out.len() {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(io::ErrorKind::TimedOut, "reader too slow"));
        }
        s.set_write_timeout(Some(left))?;
        at += s.write(&out[at..])?;
    }
    Ok(())
}

/// `GET path` from `at`: the whole answer (for tests and checks).
pub fn get(at: SocketAddr, path: &str) -> io::Result<String> {
    let mut s = TcpStream::connect(at)?;
    s.set_read_timeout(Some(DEADLINE * 2))?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n")?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::metrics::counter::Counter;

    #[test]
    fn metrics_are_served_and_a_silent_or_endless_peer_holds_nothing_up() {
        let mut r = Registry::with_prefix("t");
        let c = Counter::<u64>::default();
        r.register("things", "Things", c.clone());
        c.inc_by(3);
        let at = bind("127.0.0.1:0".parse().unwrap(), r).unwrap();
        let _silent = TcpStream::connect(at).unwrap();
        let start = Instant::now();
        let m = get(at, "/metrics").unwrap();
        assert!(start.elapsed() < DEADLINE + Duration::from_secs(1));
        assert!(
            m.starts_with("HTTP/1.1 200") && m.contains("t_things_total 3"),
            "{m}"
        );
        assert!(get(at, "/").unwrap().starts_with("HTTP/1.1 404"));
        let mut s = TcpStream::connect(at).unwrap();
        write!(s, "POST /metrics HTTP/1.1\r\n\r\n").unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        assert!(out.starts_with("HTTP/1.1 405"), "{out}");
        let mut s = TcpStream::connect(at).unwrap();
        let _ = s.write_all(&vec![b'a'; MAX_REQUEST + 2048]);
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        assert!(out.is_empty() || out.starts_with("HTTP/1.1 408"), "{out}");
    }
}
