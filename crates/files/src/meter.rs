//! What a file server counts, for Prometheus (`macrolink serve --metrics`):
//! files moved each way and their bytes, refusals by cause, connections
//! open, and of transfers through gateways the chunks sent again and the
//! gateways that carried the last one.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// Labels of a transfer.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OpLabels {
    /// `get` (to a client) or `put` (from one).
    pub op: String,
}

/// Labels of a refusal.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CodeLabels {
    /// The error code's name.
    pub code: String,
}

/// A file server's counters; clones share them.
#[derive(Clone, Debug, Default)]
pub struct Meter {
    /// Files moved whole, by direction.
    pub files: Family<OpLabels, Counter>,
    /// Bytes of those files, by direction.
    pub bytes: Family<OpLabels, Counter>,
    /// Requests answered with an error, by code.
    pub errors: Family<CodeLabels, Counter>,
    /// Client connections open.
    pub connections: Gauge,
    /// Chunks sent again through gateways.
    pub chunks_resent: Counter,
    /// Gateways that carried chunks of the last transfer through a lane.
    pub gateways_in_use: Gauge,
}

impl Meter {
    /// Registers every counter in `r` (prefix it with the service's name).
    pub fn register(&self, r: &mut Registry) {
        r.register("files", "Files moved whole, by op", self.files.clone());
        r.register(
            "bytes",
            "Bytes of files moved whole, by op",
            self.bytes.clone(),
        );
        r.register(
            "errors",
            "Requests refused or failed, by code",
            self.errors.clone(),
        );
        r.register(
            "connections",
            "Client connections open",
            self.connections.clone(),
        );
        r.register(
            "chunks_resent",
            "Chunks sent again through gateways",
            self.chunks_resent.clone(),
        );
        r.register(
            "gateways_in_use",
            "Gateways that carried the last transfer through a lane",
            self.gateways_in_use.clone(),
        );
    }

    /// A file of `bytes` moved whole by `op`.
    pub fn moved(&self, op: &str, bytes: u64) {
        let l = OpLabels { op: op.into() };
        self.files.get_or_create(&l).inc();
        self.bytes.get_or_create(&l).inc_by(bytes);
    }

    /// A request answered with error `code`.
    pub fn error(&self, code: crate::proto::Code) {
        let code = format!("{code:?}").to_lowercase();
        self.errors.get_or_create(&CodeLabels { code }).inc();
    }

    /// A transfer through gateways that carried `c`.
    pub fn carried(&self, c: &crate::lane::Carried) {
        self.chunks_resent.inc_by(c.resent);
        let used = c.per_gateway.iter().filter(|(_, n)| *n > 0).count();
        self.gateways_in_use.set(used as i64);
    }
}
