//! Ordered batches: a destination's data entries, then its tail writes, as one batch that the
//! backend lands in order (one call, no wait for the data's completion), where the backend
//! keeps a batch's order; a backend that does not refuses it and the destination is then
//! posted as [`State::post`] does (the tail writes after the data's completion). A burst whose
//! batches are all ordered ones goes to the engine in one call,
//! [`mori_io::IoEngine::post_ordered_multi`]: over xgmi the batches then share kernel launches
//! (up to 8 segments in one), where one post per destination cost one launch each, and each
//! launch waits for the other proxies' driver calls (docs/PERFORMANCE.md). Where every
//! destination's backend posts ordered batches over a session (xgmi), the call goes through
//! the sessions ([`mori_io::Session::post_ordered_many`]), made once per destination, so a post
//! makes none of the engine's one-shot look-ups. Where the session stores tail words and the
//! burst's size suits [`super::TailWords`], a batch whose commands carry their pairs' values
//! ([`CmdOp::Tail`]'s `total`) sends each pair as two tail words instead of a 16-byte copy from
//! the window (over xgmi: the segment's copy-engine copy, then the words in one stream batch).

use super::{Cmd, State};
use crate::ring::{CmdOp, TAIL_WRITE_BYTES};
use mori_io::{ErrorCode, MemoryDesc, RegionBatch, Session, SessionBatch, TailWord, TransferStatus, MAX_TAIL_WORDS};
use std::sync::atomic::Ordering;
use std::time::Instant;

/// A tail write of a command: `(src, counter, total)` ([`CmdOp::Tail`]).
type Tail = (u64, u64, Option<u64>);

/// The data commands' entries of an ordered batch: (local offsets, remote offsets, lengths).
pub(super) fn data_entries(data: &[&Cmd]) -> (Vec<u64>, Vec<u64>, Vec<u64>) {
    (data.iter().map(|c| c.local_off).collect(), data.iter().map(|c| c.remote_off).collect(), data.iter().map(|c| c.len).collect())
}

/// Appends each tail write of `tails` to the entries `(lo, ro, sz)`: its 16 bytes from `src` to
/// the counter's offset.
fn push_pair_copies((lo, ro, sz): (&mut Vec<u64>, &mut Vec<u64>, &mut Vec<u64>), tails: &[Tail]) {
    for &(src, counter, _) in tails {
        lo.push(src);
        ro.push(counter);
        sz.push(TAIL_WRITE_BYTES);
    }
}

/// The tail writes of `tails` (`(src, counter, total)`) as tail words, `(total - 1, total)` at
/// each counter, if every one carries its total and they fit one batch's
/// [`MAX_TAIL_WORDS`] (else `None`: they are copied from the window; a backlog in the ring can
/// put more than 32 pairs for one rank in one burst).
fn pair_words(tails: &[Tail]) -> Option<Vec<TailWord>> {
    if 2 * tails.len() > MAX_TAIL_WORDS {
        return None;
    }
    let mut out = Vec::with_capacity(2 * tails.len());
    for &(_, counter, total) in tails {
        let total = total.filter(|&t| t > 0)?;
        out.push(TailWord { offset: counter, value: total - 1 });
        out.push(TailWord { offset: counter + 8, value: total });
    }
    Some(out)
}

/// One destination's ordered batch, built.
struct Part<'a> {
    dst: usize,
    /// The destination's window (borrowed from the proxy's peers: nothing is cloned per post).
    remote: &'a MemoryDesc,
    len: u64,
    lo: Vec<u64>,
    ro: Vec<u64>,
    sz: Vec<u64>,
    /// The pairs as tail words (empty: they are entries of the batch).
    words: Vec<TailWord>,
    /// The commands' tail writes, for when `words` cannot go (`Part::copy_pairs`).
    tails: Vec<Tail>,
}

impl Part<'_> {
    /// Sends the pairs as copies from the window (the last entries) instead of tail words.
    fn copy_pairs(&mut self) {
        if !self.words.is_empty() {
            self.words.clear();
            push_pair_copies((&mut self.lo, &mut self.ro, &mut self.sz), &self.tails);
        }
    }
}

impl State {
    /// Whether `part` (commands to one destination) goes as an ordered batch: only tail
    /// writes (no MORI-IO signal), to a known peer whose backend did not refuse one.
    pub(super) fn takes_ordered(&self, part: &[Cmd]) -> bool {
        let Some(dst) = part.first().map(|c| c.dst as usize) else { return false };
        matches!(self.peers.get(dst), Some(Some(_)))
            && !self.unordered.get(dst).copied().unwrap_or(true)
            && part.iter().all(|c| matches!(c.op, CmdOp::Tail { .. }))
    }

    /// Makes the sessions of every destination with a window (`session_for`) before the first
    /// command, so that their control-plane look-ups are not on a write's path.
    pub(super) fn open_sessions(&mut self) {
        if !self.sessions {
            return;
        }
        for dst in 0..self.peers.len() {
            if matches!(self.peers.get(dst), Some(Some(_))) {
                self.session_for(dst);
            }
        }
    }

    /// Whether destination `dst` has a live session that posts ordered batches, making it
    /// when there is none yet or its peer was replaced since (a control-plane look-up of the
    /// peer's window); a destination whose session cannot be made, or whose backend posts no
    /// ordered batch over one (tcp, rdma), keeps the engine's one-shot calls.
    fn session_for(&mut self, dst: usize) -> bool {
        match self.session.get(dst) {
            Some(Some(Some(s))) if s.alive() => return true,
            // Its peer was replaced or deregistered since: made again (or refused) below.
            Some(Some(Some(_))) => {}
            Some(Some(None)) => return false,
            _ => {}
        }
        let Some(Some(peer)) = self.peers.get(dst) else { return false };
        let made = match self.engine.create_session(&self.local, &peer.data) {
            Ok(s) if s.posts_ordered() => Some(s),
            Ok(s) => {
                tracing::debug!(dst, backend = %s.backend(), "proxy: ordered batches to this rank go through the engine's one-shot calls");
                None
            }
            Err(e) => {
                tracing::warn!(dst, error = %e, "proxy: no session to this rank's window; ordered batches go through the engine's one-shot calls");
                None
            }
        };
        let ok = made.is_some();
        if let Some(slot) = self.session.get_mut(dst) {
            *slot = Some(made);
        }
        ok
    }

    /// Posts `parts` (each passed [`State::takes_ordered`]) as ordered batches in one call:
    /// over the destinations' sessions when every one has a session that posts them
    /// (`session_for`), else through the engine; a batch the backend refuses
    /// (`NotSupported`) marks its destination and is posted again as [`State::post`] does it.
    pub(super) fn post_ordered_parts(&mut self, parts: &[&[Cmd]]) {
        self.first.get_or_insert_with(Instant::now);
        // Sessions first (making one may need `&mut self`); the batches then borrow the peers.
        let via_sessions = self.sessions && parts.iter().all(|p| self.session_for(p[0].dst as usize));
        let words_burst = via_sessions && self.tail_words.takes(parts.len());
        let mut built: Vec<(&[Cmd], Part<'_>)> = Vec::with_capacity(parts.len());
        let mut unknown: Vec<&[Cmd]> = Vec::new();
        for &p in parts {
            let dst = p[0].dst as usize;
            let Some(Some(peer)) = self.peers.get(dst) else {
                unknown.push(p);
                continue;
            };
            let data: Vec<&Cmd> = p.iter().filter(|c| c.len > 0).collect();
            let tails: Vec<Tail> =
                p.iter().filter_map(|c| if let CmdOp::Tail { src, total } = c.op { Some((src, c.counter, total)) } else { None }).collect();
            // Tail words need data to follow (a batch has at least one entry) and a session
            // that stores them.
            let stores_words = || self.session.get(dst).and_then(|s| s.as_ref()?.as_ref()).is_some_and(|s| s.posts_tail_words());
            let words = if words_burst && !data.is_empty() && stores_words() { pair_words(&tails) } else { None };
            let (mut lo, mut ro, mut sz) = data_entries(&data);
            if words.is_none() {
                push_pair_copies((&mut lo, &mut ro, &mut sz), &tails);
            }
            let len = data.iter().map(|c| c.len).sum();
            built.push((p, Part { dst, remote: &peer.data, len, lo, ro, sz, words: words.unwrap_or_default(), tails }));
        }
        let call = Instant::now();
        // Every batch over its destination's session, or all through the engine.
        let over_sessions: Option<Vec<SessionBatch<'_>>> = if via_sessions {
            built
                .iter()
                .map(|(_, b)| {
                    let session = self.session.get(b.dst)?.as_ref()?.as_ref()?;
                    Some(SessionBatch {
                        session,
                        local_offs: &b.lo,
                        remote_offs: &b.ro,
                        sizes: &b.sz,
                        words: &b.words,
                        id: self.engine.allocate_transfer_uid(),
                    })
                })
                .collect()
        } else {
            None
        };
        let via_sessions = over_sessions.is_some();
        let statuses = if let Some(batches) = over_sessions {
            Session::post_ordered_many(mori_io::Op::Write, &batches)
        } else {
            // The engine's calls take no tail words: every pair goes as a copy.
            built.iter_mut().for_each(|(_, b)| b.copy_pairs());
            let batches: Vec<RegionBatch<'_>> = built
                .iter()
                .map(|(_, b)| RegionBatch {
                    local: &self.local,
                    local_offs: &b.lo,
                    remote: b.remote,
                    remote_offs: &b.ro,
                    sizes: &b.sz,
                    id: self.engine.allocate_transfer_uid(),
                })
                .collect();
            self.engine.post_ordered_multi(mori_io::Op::Write, &batches)
        };
        let refused = |st: &mori_io::TransferStatus| matches!(st.poll(), Some(Err(ref e)) if e.code == ErrorCode::NotSupported);
        // A call whose every batch the backend refused posted nothing.
        if !statuses.iter().all(refused) {
            self.timing.count_call(call);
        }
        // What to do next, taken out of `built` (which borrows the peers) before posting again.
        let outcomes: Vec<(&[Cmd], usize, u64, bool, TransferStatus)> =
            built.into_iter().zip(statuses).map(|((p, b), st)| (p, b.dst, b.len, !b.words.is_empty(), st)).collect();
        for (part, dst, len, worded, st) in outcomes {
            if refused(&st) {
                self.unordered[dst] = true;
                self.post(part);
                continue;
            }
            self.timing.ordered_batches.fetch_add(1, Ordering::Relaxed);
            if via_sessions {
                self.timing.session_batches.fetch_add(1, Ordering::Relaxed);
            }
            if worded {
                self.timing.word_batches.fetch_add(1, Ordering::Relaxed);
            }
            self.track(dst, len, st);
        }
        // A destination with no window: `post` fails it, naming the rank.
        for part in unknown {
            self.post(part);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_go_as_two_words_only_when_every_command_carries_its_total() {
        let w = pair_words(&[(64, 4096, Some(8)), (80, 8192, Some(1))]).unwrap();
        let want = [(4096, 7), (4104, 8), (8192, 0), (8200, 1)].map(|(offset, value)| TailWord { offset, value });
        assert_eq!(w, want);
        assert_eq!(pair_words(&[(64, 4096, Some(8)), (80, 8192, None)]), None, "one pair not carried: all copied");
        assert_eq!(pair_words(&[(64, 4096, Some(0))]), None, "a total of 0 is no pair");
        assert_eq!(pair_words(&[]), Some(vec![]));
        // A backlog of more pairs for one rank than a batch's words: copied instead.
        let pairs = |n: u64| (0..n).map(|i| (64 * i, 4096 + 16 * i, Some(i + 1))).collect::<Vec<_>>();
        assert_eq!(pair_words(&pairs(32)).map(|w| w.len()), Some(MAX_TAIL_WORDS));
        assert_eq!(pair_words(&pairs(33)), None);
    }
}
