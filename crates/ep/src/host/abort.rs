//! Failure propagation: a rank that gives up (a write failed, a deadline passed) stores
//! `suspect + 1 | reporter << 32 | timed_out << 63` in the abort word of every other rank's
//! window (shared memory inside the node, a signal across nodes, best effort), so that every
//! rank of the job fails promptly, instead of each waiting for its own deadline. The word says
//! "failed" only for a rank the reporter saw fail (a write to it failed, its connection was
//! lost); after a timeout it names the first other process's rank whose writes were missing,
//! as missing, not as failed.

use super::HostEp;
use crate::error::{EpError, EpResult};
use crate::internode::{SignalOp, Window};
use std::time::{Duration, Instant};

/// How long a rank that saw a failure itself waits for an earlier one to be reported
/// ([`HostEp::earlier_cause`]).
const CAUSE_GRACE: Duration = Duration::from_millis(250);

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

    /// `PeerFailed` when another rank stored an abort in a local rank's window (a word naming
    /// a rank seen to fail before one that only timed out, when local ranks hold both).
    pub(super) fn check_abort(&self, phase: &'static str) -> EpResult<()> {
        let words = self.abort_words();
        match words.iter().find(|w| w.3).or(words.first()) {
            Some(&(rank, failed, reporter, seen_dead)) => Err(EpError::PeerFailed { rank, phase, failed, reporter, seen_dead }),
            None => Ok(()),
        }
    }

    /// `e`, a failure this process saw itself (a write failed, a writer closed its
    /// connections), unless within [`CAUSE_GRACE`] an abort word arrives in one of this
    /// process's windows that explains it: one naming a rank its reporter saw fail, or one
    /// reported by the very rank `e` names (it gave up first, then exited). Then that earlier
    /// cause. A rank that aborted exits and closes its connections, which fails the writes
    /// other ranks still had in flight to it; those ranks name the first failure, not the exit
    /// it caused. A word naming one of this process's own ranks as failed is not taken.
    pub(super) fn earlier_cause(&self, phase: &'static str, e: EpError) -> EpError {
        let saw = match &e {
            EpError::Transport { peer, .. } | EpError::PeerLost { peer, .. } => Some(*peer),
            _ => None,
        };
        let end = Instant::now() + CAUSE_GRACE;
        loop {
            if let Some((rank, failed, reporter, seen_dead)) = earlier(&self.abort_words(), &self.local, saw) {
                return EpError::PeerFailed { rank, phase, failed, reporter, seen_dead };
            }
            if Instant::now() >= end {
                return e;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Every abort word set in this process's ranks' windows: (the local rank, failed,
    /// reporter, seen_dead).
    fn abort_words(&self) -> Vec<(usize, usize, usize, bool)> {
        self.local
            .clone()
            .filter_map(|r| {
                let v = self.wins.get(&r).map_or(0, |w| w.load(self.abort_off));
                (v != 0).then(|| {
                    let (failed, reporter, seen_dead) = decode(v);
                    (r, failed, reporter, seen_dead)
                })
            })
            .collect()
    }

    /// Marks this HostEp unusable (a phase stopped half-way: some puts may be issued, or a
    /// state consumed) without telling other ranks anything. Returns `e`.
    pub(super) fn poison(&mut self, e: EpError) -> EpError {
        self.poisoned = Some(e.to_string());
        e
    }

    /// Marks this HostEp unusable and, for an error this process found itself, tells every
    /// other rank which rank failed. Returns `e`.
    pub(super) fn fail(&mut self, e: EpError) -> EpError {
        self.poisoned = Some(e.to_string());
        let (failed, reporter, seen_dead) = match &e {
            EpError::Transport { peer, rank, .. } if *peer != usize::MAX => (Some(*peer), *rank, true),
            EpError::PeerLost { peer, rank, .. } => (Some(*peer), *rank, true),
            EpError::Timeout { writers, rank, .. } => (writers.iter().copied().find(|w| !self.local.contains(w)), *rank, false),
            _ => (None, 0, false),
        };
        let Some(failed) = failed else { return e };
        let word = encode(failed, reporter, seen_dead);
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

/// Of the abort words `words` ((local rank, failed, reporter, seen_dead)), the first that
/// explains a failure this process saw itself (`saw`: the rank it names, if any): one naming a
/// rank its reporter saw fail, or one reported by `saw` itself; never one naming a rank of this
/// process (`local`) as failed.
fn earlier(
    words: &[(usize, usize, usize, bool)],
    local: &std::ops::Range<usize>,
    saw: Option<usize>,
) -> Option<(usize, usize, usize, bool)> {
    words.iter().copied().find(|&(_, failed, reporter, seen_dead)| !local.contains(&failed) && (seen_dead || Some(reporter) == saw))
}

/// The abort word: `suspect + 1 | reporter << 32 | timed_out << 63` (never 0).
fn encode(suspect: usize, reporter: usize, seen_dead: bool) -> u64 {
    (suspect as u64 + 1) & 0xffff_ffff | ((reporter as u64) & 0x7fff_ffff) << 32 | u64::from(!seen_dead) << 63
}

/// (suspect, reporter, seen_dead) of a non-zero abort word.
fn decode(v: u64) -> (usize, usize, bool) {
    (((v & 0xffff_ffff).saturating_sub(1)) as usize, ((v >> 32) & 0x7fff_ffff) as usize, v >> 63 == 0)
}

#[cfg(test)]
mod tests {
    use super::{decode, earlier, encode};
    use crate::error::EpError;

    #[test]
    fn an_earlier_cause_is_a_rank_seen_dead_or_the_named_rank_own_report() {
        // This process holds ranks 4..8; it saw rank 2's writes fail.
        let local = 4..8;
        // Rank 1 timed out waiting for rank 0: explains nothing here (rank 2 is what was seen).
        let timed_out_elsewhere = (4, 0, 1, false);
        assert_eq!(earlier(&[timed_out_elsewhere], &local, Some(2)), None);
        // Rank 2 itself reported, before exiting, that rank 0 was missing: that is the cause.
        let from_the_named_rank = (5, 0, 2, false);
        assert_eq!(earlier(&[timed_out_elsewhere, from_the_named_rank], &local, Some(2)), Some(from_the_named_rank));
        // Some rank saw rank 3 fail: taken whoever reported it, ahead of later words.
        let seen_dead = (6, 3, 1, true);
        assert_eq!(earlier(&[seen_dead, from_the_named_rank], &local, Some(2)), Some(seen_dead));
        // A word naming one of this process's own ranks as failed (its own exit, as another
        // process saw it) is never the cause; nor is anything when nothing was named.
        let names_local = (7, 5, 0, true);
        assert_eq!(earlier(&[names_local], &local, Some(2)), None);
        assert_eq!(earlier(&[from_the_named_rank], &local, None), None);
        assert_eq!(earlier(&[], &local, Some(2)), None);
    }

    #[test]
    fn the_abort_word_says_failed_only_for_a_rank_seen_dead() {
        for (s, r, d) in [(0, 5, true), (6, 2, false), (1023, 0, true)] {
            assert_eq!(decode(encode(s, r, d)), (s, r, d));
            assert_ne!(encode(s, r, d), 0);
        }
        let (failed, reporter, seen_dead) = decode(encode(6, 2, false));
        let e = EpError::PeerFailed { rank: 0, phase: "dispatch", failed, reporter, seen_dead }.to_string();
        assert_eq!(
            e,
            "rank 0: dispatch aborted: rank 2 timed out missing writes from rank 6 (not seen to fail: stopped, slow, or waiting itself)"
        );
        assert!(!e.contains("6 failed"), "{e}");
        let (failed, reporter, seen_dead) = decode(encode(6, 2, true));
        let e = EpError::PeerFailed { rank: 0, phase: "combine", failed, reporter, seen_dead }.to_string();
        assert_eq!(e, "rank 0: combine aborted: rank 6 failed (rank 2 saw its connection lost or a write to it fail)");
    }
}
