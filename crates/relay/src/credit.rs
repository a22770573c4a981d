//! A sender's view of one link's credit: bytes it may still put on the
//! link before the receiver has made room for them.

/// The receiver returned credit for bytes never sent: a broken peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{returned} bytes of credit returned with {in_flight} in flight")]
pub struct Overreturn {
    /// Bytes of credit returned.
    pub returned: u64,
    /// Bytes in flight then.
    pub in_flight: u64,
}

/// Credit on one link.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Credit {
    limit: u64,
    in_flight: u64,
}

impl Credit {
    /// A link whose receiver holds `limit` bytes.
    pub fn new(limit: u64) -> Credit {
        Credit {
            limit,
            in_flight: 0,
        }
    }

    /// Whether `len` bytes may go now. A packet larger than the whole
    /// window may go when nothing else is in flight.
    pub fn may_send(&self, len: u64) -> bool {
        self.in_flight == 0 || self.in_flight + len <= self.limit
    }

    /// `len` bytes went.
    pub fn sent(&mut self, len: u64) {
        self.in_flight += len;
    }

    /// The receiver made room for `n` bytes.
    pub fn returned(&mut self, n: u64) -> Result<(), Overreturn> {
        if n > self.in_flight {
            return Err(Overreturn {
                returned: n,
                in_flight: self.in_flight,
            });
        }
        self.in_flight -= n;
        Ok(())
    }

    /// Bytes in flight.
    pub fn in_flight(&self) -> u64 {
        self.in_flight
    }

    /// The window.
    pub fn limit(&self) -> u64 {
        self.limit
    }
}
