//! A loopback address where nobody listens, and nobody will while the
//! test runs: a socket bound to the port but not listening holds it, so
//! the kernel gives it to no other test running beside, and a connection
//! to it is refused. (A listener bound and dropped frees the port for the
//! next test that asks for any port.)

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::os::fd::OwnedFd;

use rustix::net::{self, AddressFamily, SocketType};

/// The address refuses connections as long as the returned socket lives.
pub fn refusing_addr() -> std::io::Result<(OwnedFd, SocketAddr)> {
    let sock = net::socket(AddressFamily::INET, SocketType::STREAM, None)?;
    net::bind(&sock, &SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0))?;
    let at = net::getsockname(&sock)?;
    let at = SocketAddr::try_from(at).map_err(|_| std::io::Error::other("not an inet address"))?;
    Ok((sock, at))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connection_to_it_is_refused_and_its_port_is_taken() {
        let (_hold, at) = refusing_addr().unwrap();
        let e = std::net::TcpStream::connect(at).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused);
        assert!(std::net::TcpListener::bind(at).is_err(), "the port is held");
    }
}
