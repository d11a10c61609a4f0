//! [`BootstrapError`]: every failure of the bootstrap layer, each naming its culprit.

use std::net::SocketAddr;
use std::time::Duration;

/// Errors of the bootstrap layer. Every variant names the culprit (rank, address, variable,
/// limit) so that the message alone tells an operator what to fix.
#[derive(Debug, thiserror::Error)]
pub enum BootstrapError {
    /// Rendezvous did not complete within the budget (`MORI_BOOTSTRAP_TIMEOUT`).
    /// On the root, `missing` lists the ranks whose hello never arrived; the root forwards
    /// this error to the ranks that did arrive. A non-root that cannot reach the root at
    /// all reports `missing == [0]`.
    #[error("{}", rendezvous_timeout_msg(.missing, *.waited, .root))]
    RendezvousTimeout {
        /// Ranks that never checked in (sorted).
        missing: Vec<usize>,
        /// How long the reporter waited.
        waited: Duration,
        /// The root's (rank 0's) rendezvous address.
        root: SocketAddr,
    },
    /// Two processes claimed the same rank. The root tells both claimants (and every other
    /// rank already connected) and fails.
    #[error("rank {rank} was claimed twice: first by {first}, then by {second}")]
    DuplicateRank {
        /// The rank claimed twice.
        rank: usize,
        /// Address (as seen by the root) of the first claimant.
        first: SocketAddr,
        /// Address (as seen by the root) of the second claimant.
        second: SocketAddr,
    },
    /// A rank's world size disagrees with the root's.
    #[error("rank {rank} says world size is {got}, but rank 0 expects {expected}")]
    WorldSizeMismatch {
        /// The offending rank.
        rank: usize,
        /// The root's world size.
        expected: usize,
        /// The offender's world size.
        got: usize,
    },
    /// A peer closed its connection or its process died during an operation.
    #[error("rank {rank} was lost during {during}: {cause}")]
    PeerLost {
        /// The lost rank.
        rank: usize,
        /// The operation under way (`"allgather"`, `"barrier"`, `"rendezvous"`, ...).
        during: &'static str,
        /// What was observed (connection closed, reset, or who reported it).
        cause: String,
    },
    /// A collective did not finish within the per-operation deadline
    /// (`MORI_BOOTSTRAP_OP_TIMEOUT`).
    #[error("{op} timed out after {} s waiting for ranks {waiting_for:?}", secs(*.after))]
    Timeout {
        /// The collective.
        op: &'static str,
        /// The ranks this rank was blocked on when the deadline expired.
        waiting_for: Vec<usize>,
        /// The deadline that expired.
        after: Duration,
    },
    /// Another rank failed and aborted the group; `reason` is its own error message.
    #[error("rank {by} aborted the group while this rank was in {during}: {reason}")]
    Aborted {
        /// The rank whose failure started the abort.
        by: usize,
        /// The operation this rank was in.
        during: &'static str,
        /// The aborting rank's error message.
        reason: String,
    },
    /// An earlier failure left this bootstrap unusable (streams are out of step).
    #[error("bootstrap is unusable after an earlier failure: {first}")]
    Poisoned {
        /// The message of the first failure.
        first: String,
    },
    /// Bad configuration: an environment variable or config field, named with its value.
    #[error("invalid bootstrap configuration: {0}")]
    InvalidConfig(String),
    /// A collective was called with bad arguments (nothing was sent; the group stays usable).
    #[error("invalid arguments to {op}: {detail}")]
    InvalidArgument {
        /// The collective.
        op: &'static str,
        /// What is wrong.
        detail: String,
    },
    /// A peer announced a frame larger than [`crate::MAX_FRAME_LEN`].
    #[error("{from} announced a frame of {len} bytes, over the {max}-byte limit")]
    FrameTooLarge {
        /// Who sent it (rank or address).
        from: String,
        /// The declared length.
        len: u64,
        /// The limit ([`crate::MAX_FRAME_LEN`]).
        max: u64,
    },
    /// A peer sent something that is not the expected protocol message.
    #[error("protocol error from {from}: {detail}")]
    Protocol {
        /// Who sent it (rank or address).
        from: String,
        /// What was wrong.
        detail: String,
    },
    /// The rendezvous port is already bound by another process.
    #[error("port {} on {} is in use (rank 0 binds the master address; pick another port or stop the other process)", .addr.port(), .addr.ip())]
    AddressInUse {
        /// The address that could not be bound.
        addr: SocketAddr,
    },
    /// Any other I/O failure; `what` says what was being done.
    #[error("{what}: {source}")]
    Io {
        /// What was being done (with addresses).
        what: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

impl BootstrapError {
    /// Builds an [`BootstrapError::Io`] from a description and an OS error.
    pub fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        BootstrapError::Io { what: what.into(), source }
    }
}

/// Seconds with one decimal, as used in every message (`2.0`).
pub(crate) fn secs(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64())
}

fn rendezvous_timeout_msg(missing: &[usize], waited: Duration, root: &SocketAddr) -> String {
    if missing == [0] {
        format!("root (rank 0) at {root} did not answer within {} s (MORI_BOOTSTRAP_TIMEOUT)", secs(waited))
    } else {
        format!("ranks {missing:?} never arrived at root {root} within {} s (MORI_BOOTSTRAP_TIMEOUT)", secs(waited))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_the_culprit() {
        let root: SocketAddr = "10.0.0.1:18515".parse().unwrap();
        let e = BootstrapError::RendezvousTimeout { missing: vec![2, 5], waited: Duration::from_secs(2), root };
        assert_eq!(e.to_string(), "ranks [2, 5] never arrived at root 10.0.0.1:18515 within 2.0 s (MORI_BOOTSTRAP_TIMEOUT)");
        let e = BootstrapError::AddressInUse { addr: "127.0.0.1:18515".parse().unwrap() };
        assert!(e.to_string().starts_with("port 18515 on 127.0.0.1 is in use"));
        let e = BootstrapError::Timeout { op: "barrier", waiting_for: vec![3], after: Duration::from_millis(1500) };
        assert_eq!(e.to_string(), "barrier timed out after 1.5 s waiting for ranks [3]");
    }

    #[test]
    fn error_is_send_sync_static() {
        fn check<T: Send + Sync + 'static + std::error::Error>() {}
        check::<BootstrapError>();
    }
}
