//! Failure reports sent to peers: rendezvous rejects and collective aborts.

use std::net::SocketAddr;
use std::time::Duration;

use crate::error::BootstrapError;
use crate::wire::{proto, Dec, Enc};

/// A failure report sent to peers (rendezvous rejects and collective aborts), so that every
/// rank fails promptly with the same culprit instead of waiting for its own deadline.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Report {
    Duplicate { rank: usize, first: SocketAddr, second: SocketAddr },
    WorldSize { rank: usize, expected: usize, got: usize },
    RendezvousTimeout { missing: Vec<usize>, waited: Duration },
    PeerLost { by: usize, rank: usize, reason: String },
    Other { by: usize, reason: String },
}

impl Report {
    /// What to tell the others about `err`, observed by rank `me`.
    pub fn from_error(err: &BootstrapError, me: usize) -> Report {
        match err {
            BootstrapError::DuplicateRank { rank, first, second } => Report::Duplicate { rank: *rank, first: *first, second: *second },
            BootstrapError::WorldSizeMismatch { rank, expected, got } => Report::WorldSize { rank: *rank, expected: *expected, got: *got },
            BootstrapError::RendezvousTimeout { missing, waited, .. } => {
                Report::RendezvousTimeout { missing: missing.clone(), waited: *waited }
            }
            BootstrapError::PeerLost { rank, .. } => Report::PeerLost { by: me, rank: *rank, reason: err.to_string() },
            other => Report::Other { by: me, reason: other.to_string() },
        }
    }

    /// The error a rank in operation `during` returns on receiving this report.
    pub fn to_error(&self, during: &'static str, root: SocketAddr) -> BootstrapError {
        match self {
            Report::Duplicate { rank, first, second } => BootstrapError::DuplicateRank { rank: *rank, first: *first, second: *second },
            Report::WorldSize { rank, expected, got } => BootstrapError::WorldSizeMismatch { rank: *rank, expected: *expected, got: *got },
            Report::RendezvousTimeout { missing, waited } => {
                BootstrapError::RendezvousTimeout { missing: missing.clone(), waited: *waited, root }
            }
            Report::PeerLost { by, rank, reason } => {
                BootstrapError::PeerLost { rank: *rank, during, cause: format!("reported by rank {by}: {reason}") }
            }
            Report::Other { by, reason } => BootstrapError::Aborted { by: *by, during, reason: reason.clone() },
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut e = Enc::default();
        match self {
            Report::Duplicate { rank, first, second } => e.u8(1).uz(*rank).addr(first).addr(second),
            Report::WorldSize { rank, expected, got } => e.u8(2).uz(*rank).uz(*expected).uz(*got),
            Report::RendezvousTimeout { missing, waited } => {
                e.u8(3).u64(u64::try_from(waited.as_millis()).unwrap_or(u64::MAX)).uz(missing.len());
                for m in missing {
                    e.uz(*m);
                }
                &mut e
            }
            Report::PeerLost { by, rank, reason } => e.u8(4).uz(*by).uz(*rank).bytes(reason.as_bytes()),
            Report::Other { by, reason } => e.u8(5).uz(*by).bytes(reason.as_bytes()),
        };
        e.0
    }

    pub fn decode(b: &[u8], from: &str) -> Result<Report, BootstrapError> {
        let mut d = Dec::new(b, from);
        let text = |d: &mut Dec| d.bytes().map(|s| String::from_utf8_lossy(s).into_owned());
        let r = match d.u8()? {
            1 => Report::Duplicate { rank: d.uz()?, first: d.addr()?, second: d.addr()? },
            2 => Report::WorldSize { rank: d.uz()?, expected: d.uz()?, got: d.uz()? },
            3 => {
                let waited = Duration::from_millis(d.u64()?);
                let n = d.uz()?;
                if n > crate::MAX_WORLD_SIZE {
                    return Err(proto(from, format!("report lists {n} missing ranks")));
                }
                let missing = (0..n).map(|_| d.uz()).collect::<Result<Vec<_>, _>>()?;
                Report::RendezvousTimeout { missing, waited }
            }
            4 => Report::PeerLost { by: d.uz()?, rank: d.uz()?, reason: text(&mut d)? },
            5 => Report::Other { by: d.uz()?, reason: text(&mut d)? },
            k => return Err(proto(from, format!("unknown report kind {k}"))),
        };
        d.end()?;
        Ok(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_roundtrip() {
        for r in [
            Report::Duplicate { rank: 1, first: "1.2.3.4:5".parse().unwrap(), second: "1.2.3.5:6".parse().unwrap() },
            Report::WorldSize { rank: 2, expected: 3, got: 4 },
            Report::RendezvousTimeout { missing: vec![2, 5], waited: Duration::from_millis(2000) },
            Report::PeerLost { by: 4, rank: 3, reason: "gone".into() },
            Report::Other { by: 1, reason: "x".into() },
        ] {
            assert_eq!(Report::decode(&r.encode(), "x").unwrap(), r);
        }
    }

    #[test]
    fn reports_become_errors_naming_the_culprit() {
        let root: SocketAddr = "10.0.0.1:18515".parse().unwrap();
        let lost = BootstrapError::PeerLost { rank: 3, during: "allgather", cause: "reset".into() };
        let r = Report::from_error(&lost, 4);
        match r.to_error("barrier", root) {
            BootstrapError::PeerLost { rank: 3, during: "barrier", cause } => {
                assert!(cause.starts_with("reported by rank 4: rank 3 was lost during allgather"), "{cause}");
            }
            other => panic!("{other:?}"),
        }
        let t = BootstrapError::Timeout { op: "barrier", waiting_for: vec![2], after: Duration::from_secs(1) };
        let e = Report::from_error(&t, 0).to_error("allgather", root);
        assert!(matches!(e, BootstrapError::Aborted { by: 0, during: "allgather", .. }), "{e:?}");
        let rt = BootstrapError::RendezvousTimeout { missing: vec![2], waited: Duration::from_secs(2), root };
        let e = Report::decode(&Report::from_error(&rt, 0).encode(), "x").unwrap().to_error("rendezvous", root);
        assert_eq!(e.to_string(), rt.to_string());
    }
}
