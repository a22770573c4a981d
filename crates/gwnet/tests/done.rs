//! The end of a job: compute nodes say done to a service node, which
//! returns from `wait` once all of them have, and not before.

use macrolink_fabric::{Node, NodeConfig};
use macrolink_gwnet::done::{self, Pending, DONE_EP};
use std::net::SocketAddr;
use std::sync::mpsc;
use std::time::Duration;

const SERVICE: u32 = 21;

fn node(id: u32, peers: &[(u32, SocketAddr)]) -> Node {
    let mut cfg = NodeConfig::local(id, "/nonexistent");
    cfg.shm_dir = None;
    cfg.peers = peers.iter().copied().collect();
    Node::start(cfg).unwrap()
}

/// Tells the service at `at` that compute node `id` is done; those that
/// did not answer.
fn say_done(id: u32, at: SocketAddr, within: Duration) -> Vec<u32> {
    let n = node(id, &[(SERVICE, at)]);
    let mut ep = n.open(1, done::endpoint_config()).unwrap();
    done::announce(&mut ep, &[SERVICE], within)
}

#[test]
fn a_service_ends_once_every_compute_host_is_done_and_not_before() {
    let service = node(SERVICE, &[]);
    let at = service.tcp_addr().unwrap();
    let ep = service.open(DONE_EP, done::endpoint_config()).unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || tx.send(done::wait(ep, Pending::new([1, 2]))));

    let s = Duration::from_secs(5);
    assert!(say_done(1, at, s).is_empty(), "the service answers");
    assert_eq!(
        say_done(9, at, Duration::from_millis(300)),
        [SERVICE],
        "a node that is no compute host gets no answer"
    );
    assert!(say_done(1, at, s).is_empty(), "one said twice is answered");
    assert!(
        rx.recv_timeout(Duration::from_millis(300)).is_err(),
        "compute node 2 has not said done: the service goes on"
    );
    assert!(say_done(2, at, s).is_empty());
    let ended = rx
        .recv_timeout(Duration::from_secs(5))
        .expect("wait returned");
    assert!(ended.is_ok(), "{ended:?}");
}

#[test]
fn a_service_that_does_not_wait_counts_as_answered_and_a_dead_one_does_not() {
    // Node 22 runs but has no done endpoint; node 23's address has nobody.
    let plain = node(22, &[]);
    let (_hold, dead_at) = macrolink_testbed::refusing::refusing_addr().unwrap();
    let n = node(1, &[(22, plain.tcp_addr().unwrap()), (23, dead_at)]);
    let mut ep = n.open(1, done::endpoint_config()).unwrap();
    let left = done::announce(&mut ep, &[22, 23], Duration::from_millis(500));
    assert_eq!(left, [23]);
}
