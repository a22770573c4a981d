//! How much buffer a long link needs: its bandwidth-delay product.

/// Bytes in flight on a link of `bytes_per_sec` whose credit comes back a
/// round trip of `rtt_ns` after the data left.
pub fn bdp(bytes_per_sec: u64, rtt_ns: u64) -> u64 {
    (u128::from(bytes_per_sec) * u128::from(rtt_ns)).div_ceil(1_000_000_000) as u64
}

/// The buffer a relay needs on a long link of one-way `delay_ns` at
/// `bytes_per_sec`: the bandwidth-delay product of the credit loop's round
/// trip, plus `packet` bytes for the one being sent.
pub fn relay_buffer(bytes_per_sec: u64, delay_ns: u64, packet: u64) -> u64 {
    bdp(bytes_per_sec, 2 * delay_ns) + packet
}

/// The share of a link's rate that a credit window of `window` bytes keeps
/// busy over a credit loop of `rtt_ns` (1.0 when the window covers it).
pub fn utilisation(window: u64, bytes_per_sec: u64, rtt_ns: u64) -> f64 {
    let need = bdp(bytes_per_sec, rtt_ns).max(1);
    (window as f64 / need as f64).min(1.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_papers_link_needs_the_papers_buffer() {
        // 4X SDR: 8 Gbit/s of data; 2 km of fibre, 10 us each way.
        let rate = 1_000_000_000;
        assert_eq!(bdp(rate, 20_000), 20_000);
        assert_eq!(relay_buffer(rate, 10_000, 2048), 22_048);
        // 8,600 miles (13,840 km, 69.2 ms each way) at 8 Gbit/s: 138 MB.
        assert_eq!(bdp(rate, 138_400_000), 138_400_000);
        // A host adapter's 32 KiB of link credit over that: almost nothing.
        assert!(utilisation(32 << 10, rate, 138_400_000) < 0.001);
        assert_eq!(utilisation(22_048, rate, 20_000), 1.0);
    }
}
