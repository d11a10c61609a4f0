//! Failure propagation: a rank that gives up (a write failed, a deadline passed) stores
//! `failed + 1 | reporter << 32` in the abort word of every other rank's window (shared memory
//! inside the node, a signal across nodes, best effort), so that every rank of the job fails
//! promptly with an error naming the rank found failed, instead of each waiting for its own
//! deadline and naming whichever peer gave up first.

use super::HostEp;
use crate::error::{EpError, EpResult};
use crate::internode::{SignalOp, Window};
use std::time::{Duration, Instant};

/// How long the abort signals to other nodes may take in all.
const ABORT_BUDGET: Duration = Duration::from_millis(500);

impl HostEp {
    /// Errors when an earlier phase failed.
    pub(super) fn usable(&self) -> EpResult<()> {
        match &self.poisoned {
            None => Ok(()),
            Some(m) => {
                Err(EpError::Host { what: "this HostEp".into(), detail: format!("an earlier phase failed ({m}); set up a new one") })
            }
        }
    }

    /// `PeerFailed` when another rank stored an abort in a local rank's window.
    pub(super) fn check_abort(&self, phase: &'static str) -> EpResult<()> {
        for r in self.local.clone() {
            let v = self.wins.get(&r).map_or(0, |w| w.load(self.abort_off));
            if v != 0 {
                let failed = ((v & 0xffff_ffff) - 1) as usize;
                return Err(EpError::PeerFailed { rank: r, phase, failed, reporter: (v >> 32) as usize });
            }
        }
        Ok(())
    }

    /// Marks this HostEp unusable and, for an error this process found itself, tells every
    /// other rank which rank failed. Returns `e`.
    pub(super) fn fail(&mut self, e: EpError) -> EpError {
        self.poisoned = Some(e.to_string());
        let failed = match &e {
            EpError::Transport { peer, .. } if *peer != usize::MAX => Some(*peer),
            EpError::Timeout { writers, .. } => writers.iter().copied().find(|w| !self.local.contains(w)).or(writers.first().copied()),
            _ => None,
        };
        let (Some(failed), Some(reporter)) = (failed, self.local.clone().next()) else { return e };
        let word = (failed as u64 + 1) | (reporter as u64) << 32;
        for (&r, w) in &self.wins {
            if !self.local.contains(&r) {
                let _ = w.signal(self.abort_off, SignalOp::Set(word));
            }
        }
        if let (Some(eng), Some(peers)) = (self.engines.first(), self.peer_mems.first()) {
            let sts: Vec<_> = peers
                .iter()
                .enumerate()
                .filter(|(p, m)| m.is_some() && *p != failed)
                .filter_map(|(_, m)| m.clone())
                .map(|m| eng.signal(&[mori_io::Signal { remote: m, offset: self.abort_off as u64, op: mori_io::SignalOp::Set(word) }]))
                .collect();
            let end = Instant::now() + ABORT_BUDGET;
            for st in sts {
                let _ = st.wait_for(end.saturating_duration_since(Instant::now()));
            }
        }
        e
    }
}
