//! Sans-IO batch checking and striping of a batch over several connections ("lanes").
//!
//! Used by stream transports (TCP): a batch of `(local offset, remote offset, length)` entries
//! is checked against both regions, adjacent entries that are contiguous on both sides are
//! merged, and the byte stream is cut into near-equal shares, one per lane, each share cut
//! again into pieces of at most `max_segs` segments.

use crate::error::{IoError, IoResult};
use crate::registry::check_range;

/// One contiguous copy: `len` bytes from local offset to remote offset (or back, for reads).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seg {
    /// Offset in the local region, bytes.
    pub local_off: u64,
    /// Offset in the remote region, bytes.
    pub remote_off: u64,
    /// Length, bytes.
    pub len: u64,
}

/// Part of a transfer that travels as one request on one lane.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Piece {
    /// Lane (connection) index, `0..lanes`.
    pub lane: usize,
    /// Offset of the piece's first byte in the transfer's byte stream (its segments' bytes in
    /// order), for [`EntryMap::of_bytes`].
    pub stream_off: u64,
    /// Segments, in stream order.
    pub segs: Vec<Seg>,
}

/// Where each of the caller's batch entries lies in the transfer's byte stream (the bytes of
/// its segments in order): entry `i` is bytes `end[i-1]..end[i]`. Lets a backend that knows
/// which stream bytes a failed request carried name the entries exactly. A paged batch
/// ([`crate::paged`]) of equal blocks keeps no per-entry table ([`EntryMap::uniform`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntryMap {
    repr: Ends,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Ends {
    /// The stream offset one past each entry's last byte.
    Table(Vec<u64>),
    /// `n` entries of `size` bytes each.
    Uniform { n: u32, size: u64 },
}

impl Default for EntryMap {
    fn default() -> Self {
        EntryMap { repr: Ends::Table(Vec::new()) }
    }
}

impl EntryMap {
    /// `n` entries of `size` bytes each, back to back in the stream (a paged batch's blocks).
    pub fn uniform(n: u32, size: u64) -> Self {
        EntryMap { repr: Ends::Uniform { n, size } }
    }

    /// Number of entries of the batch.
    pub fn entries(&self) -> u32 {
        match &self.repr {
            Ends::Table(e) => e.len() as u32,
            Ends::Uniform { n, .. } => *n,
        }
    }

    /// Stream offset one past entry `i`'s last byte (`i < entries()`).
    fn end(&self, i: usize) -> u64 {
        match &self.repr {
            Ends::Table(e) => e[i],
            Ends::Uniform { size, .. } => (i as u64 + 1).saturating_mul(*size),
        }
    }

    /// How many entries end at or before `x` (`strict`: strictly before).
    fn ending_by(&self, x: u64, strict: bool) -> usize {
        match &self.repr {
            Ends::Table(e) => e.partition_point(|&v| if strict { v < x } else { v <= x }),
            Ends::Uniform { n, size } => {
                if *size == 0 {
                    return if strict && x == 0 { 0 } else { *n as usize };
                }
                // Entry i ends at (i + 1) * size.
                let k = if strict { x.div_ceil(*size).saturating_sub(1) } else { x / size };
                k.min(u64::from(*n)) as usize
            }
        }
    }

    /// The entries having at least one byte in stream bytes `r` (a contiguous index range;
    /// empty entries inside it included). Empty for an empty `r`.
    pub fn of_bytes(&self, r: std::ops::Range<u64>) -> std::ops::Range<u32> {
        if r.start >= r.end {
            let at = self.ending_by(r.start, false) as u32;
            return at..at;
        }
        let n = self.entries() as usize;
        // First entry ending after r.start; one past the last entry starting before r.end.
        let lo = self.ending_by(r.start, false);
        let k = self.ending_by(r.end, true);
        let mut hi = if k < n { k + 1 } else { k };
        // Past the stream's end: trailing empty entries own no byte of `r`.
        let start_of = |i: usize| if i == 0 { 0 } else { self.end(i - 1) };
        while hi > lo && self.end(hi - 1) == start_of(hi - 1) {
            hi -= 1;
        }
        lo as u32..hi.max(lo) as u32
    }

    /// The entries with at least one byte in remote range `r` of the transfer whose segments
    /// are `segs` (a contiguous index range spanning every such entry; `None` when none).
    /// Linear in `segs`: for error paths.
    pub fn of_remote(&self, segs: &[Seg], r: std::ops::Range<u64>) -> Option<std::ops::Range<u32>> {
        let mut at = 0u64;
        let mut out: Option<std::ops::Range<u32>> = None;
        for s in segs {
            let (lo, hi) = (s.remote_off.max(r.start), (s.remote_off + s.len).min(r.end));
            if lo < hi {
                let e = self.of_bytes(at + (lo - s.remote_off)..at + (hi - s.remote_off));
                out = Some(match out {
                    None => e,
                    Some(o) => o.start.min(e.start)..o.end.max(e.end),
                });
            }
            at += s.len;
        }
        out
    }

    /// Words for entries `r` as an error names them: `batch entry 3`, `batch entries 3..=7`.
    pub fn describe(r: &std::ops::Range<u32>) -> String {
        match r.end.saturating_sub(r.start) {
            0 | 1 => format!("batch entry {}", r.start),
            _ => format!("batch entries {}..={}", r.start, r.end - 1),
        }
    }
}

/// Checks a batch given as three parallel arrays and returns its non-empty segments, merged.
///
/// Rules: the arrays must have equal, non-zero lengths (`InvalidArgs` naming the three
/// lengths, or "empty batch"); every entry must lie inside both regions (`InvalidArgs` naming
/// the entry index, the side, the range and the region size); zero-length entries are allowed
/// and skipped. Adjacent entries contiguous on both sides merge into one segment.
pub fn check_batch(local: (u64, u64), remote: (u64, u64), local_offs: &[u64], remote_offs: &[u64], sizes: &[u64]) -> IoResult<Vec<Seg>> {
    check_batch_mapped(local, remote, local_offs, remote_offs, sizes).map(|(s, _)| s)
}

/// [`check_batch`], also returning which entries each segment carries. Errors also:
/// `InvalidArgs` for more than `u32::MAX` entries.
pub fn check_batch_mapped(
    local: (u64, u64),
    remote: (u64, u64),
    local_offs: &[u64],
    remote_offs: &[u64],
    sizes: &[u64],
) -> IoResult<(Vec<Seg>, EntryMap)> {
    let (lid, llen) = local;
    let (rid, rlen) = remote;
    check_arrays(local_offs, remote_offs, sizes)?;
    let mut out: Vec<Seg> = Vec::with_capacity(sizes.len().min(1 << 16));
    let mut ends: Vec<u64> = Vec::with_capacity(sizes.len());
    let mut stream = 0u64;
    for (i, ((&lo, &ro), &n)) in local_offs.iter().zip(remote_offs).zip(sizes).enumerate() {
        check_entry(i, (lid, llen), (rid, rlen), lo, ro, n)?;
        // Saturating: a batch may name the same bytes many times over.
        stream = stream.saturating_add(n);
        ends.push(stream);
        if n == 0 {
            continue;
        }
        match out.last_mut() {
            Some(last) if last.local_off + last.len == lo && last.remote_off + last.len == ro => last.len += n,
            _ => out.push(Seg { local_off: lo, remote_off: ro, len: n }),
        }
    }
    Ok((out, EntryMap { repr: Ends::Table(ends) }))
}

/// A batch's arrays: the same length, at least one entry, at most `u32::MAX`.
fn check_arrays(local_offs: &[u64], remote_offs: &[u64], sizes: &[u64]) -> IoResult<()> {
    if local_offs.len() != remote_offs.len() || local_offs.len() != sizes.len() {
        return Err(IoError::invalid(format!(
            "batch arrays differ in length: {} local offsets, {} remote offsets, {} sizes",
            local_offs.len(),
            remote_offs.len(),
            sizes.len()
        )));
    }
    if sizes.is_empty() {
        return Err(IoError::invalid("empty batch: no entries"));
    }
    if u32::try_from(sizes.len()).is_err() {
        return Err(IoError::invalid(format!("batch of {} entries exceeds {} entries", sizes.len(), u32::MAX)));
    }
    Ok(())
}

/// Most tail words of one ordered batch.
pub const MAX_TAIL_WORDS: usize = 64;

/// Checks an ordered batch's tail words against the remote region `(id, len)`: at most
/// [`MAX_TAIL_WORDS`], each at an 8-aligned offset with its 8 bytes inside the region.
/// Errors: `InvalidArgs` naming the count and the limit, or the word, its offset and the
/// region's length.
pub fn check_tail_words(remote: (u64, u64), words: &[crate::TailWord]) -> IoResult<()> {
    if words.len() > MAX_TAIL_WORDS {
        return Err(IoError::invalid(format!("{} tail words in one ordered batch: at most {MAX_TAIL_WORDS}", words.len())));
    }
    for (i, w) in words.iter().enumerate() {
        if !w.offset.is_multiple_of(8) || w.offset.checked_add(8).is_none_or(|end| end > remote.1) {
            return Err(IoError::invalid(format!(
                "tail word {i}: offset {} of remote memory {} ({} bytes): must be 8-aligned with its 8 bytes inside",
                w.offset, remote.0, remote.1
            )));
        }
    }
    Ok(())
}

/// [`check_batch`]'s checks and errors in one pass, returning the non-empty entries as one
/// segment each in batch order (no merging), as an ordered batch needs them (each entry must
/// land before the next is written).
pub fn check_ordered_batch(
    local: (u64, u64),
    remote: (u64, u64),
    local_offs: &[u64],
    remote_offs: &[u64],
    sizes: &[u64],
) -> IoResult<Vec<Seg>> {
    check_arrays(local_offs, remote_offs, sizes)?;
    let mut out = Vec::with_capacity(sizes.len().min(1 << 16));
    for (i, ((&local_off, &remote_off), &len)) in local_offs.iter().zip(remote_offs).zip(sizes).enumerate() {
        check_entry(i, local, remote, local_off, remote_off, len)?;
        if len > 0 {
            out.push(Seg { local_off, remote_off, len });
        }
    }
    Ok(out)
}

/// The non-empty entries of a checked batch as one segment each, in batch order (no merging:
/// for an ordered batch, where each entry must land before the next is written).
pub fn unmerged_segments(local_offs: &[u64], remote_offs: &[u64], sizes: &[u64]) -> Vec<Seg> {
    local_offs
        .iter()
        .zip(remote_offs)
        .zip(sizes)
        .filter(|(_, &n)| n > 0)
        .map(|((&local_off, &remote_off), &len)| Seg { local_off, remote_off, len })
        .collect()
}

/// The checks of one entry `i` of [`check_batch`] (both ranges inside their regions), with its
/// error text.
pub fn check_entry(i: usize, local: (u64, u64), remote: (u64, u64), lo: u64, ro: u64, n: u64) -> IoResult<()> {
    check_both(|| format!("entry {i}"), local, remote, &Seg { local_off: lo, remote_off: ro, len: n })
}

/// Both ranges of `s` inside their regions ((id, length) each); errors name `what()` (built
/// only on error) and the side.
fn check_both(what: impl Fn() -> String, local: (u64, u64), remote: (u64, u64), s: &Seg) -> IoResult<()> {
    check_range(local.0, local.1, s.local_off, s.len).map_err(|e| IoError::invalid(format!("{}: local {}", what(), e.msg)))?;
    check_range(remote.0, remote.1, s.remote_off, s.len).map_err(|e| IoError::invalid(format!("{}: remote {}", what(), e.msg)))
}

/// Checks a request's segments against the regions' registered lengths (`local`, `remote`:
/// (id, length)), as a backend must before queuing anything (a descriptor's own length could be
/// forged). Errors: `InvalidArgs` naming the segment, side and range.
pub fn check_segs(local: (u64, u64), remote: (u64, u64), segs: &[Seg]) -> IoResult<()> {
    segs.iter().enumerate().try_for_each(|(i, s)| check_both(|| format!("segment {i}"), local, remote, s))
}

/// [`check_segs`] for a request's whole segment list, naming the caller's batch entries
/// (through `map`) instead of segment indices.
pub fn check_segs_mapped(local: (u64, u64), remote: (u64, u64), segs: &[Seg], map: &EntryMap) -> IoResult<()> {
    let mut at = 0u64;
    for s in segs {
        check_both(|| EntryMap::describe(&map.of_bytes(at..at + s.len)), local, remote, s)?;
        at += s.len;
    }
    Ok(())
}

/// Cuts `segs` into pieces over at most `lanes` lanes.
///
/// The number of lanes used is `min(lanes, ceil(total / min_lane_bytes))` (at least 1);
/// shares are near-equal in bytes (they differ by at most one byte), taken in stream order, so
/// a segment may be split at a share boundary. Lane numbering starts at `first_lane % lanes`
/// and goes round. Each share is cut into pieces of at most `max_segs` segments.
/// Returns no pieces when `segs` holds no bytes.
pub fn stripe(segs: &[Seg], lanes: usize, first_lane: usize, min_lane_bytes: u64, max_segs: usize) -> Vec<Piece> {
    let lanes = lanes.max(1);
    let max_segs = max_segs.max(1);
    let total: u64 = segs.iter().map(|s| s.len).sum();
    if total == 0 {
        return Vec::new();
    }
    let used = (total.div_ceil(min_lane_bytes.max(1)) as usize).clamp(1, lanes);
    let mut pieces = Vec::new();
    let mut it = segs.iter().copied();
    let mut cur: Option<Seg> = None;
    // Stream offset of the next byte taken.
    let mut at = 0u64;
    for k in 0..used {
        let share = total / used as u64 + u64::from((k as u64) < total % used as u64);
        let lane = (first_lane + k) % lanes;
        let mut left = share;
        let mut piece = Piece { lane, stream_off: at, segs: Vec::new() };
        while left > 0 {
            let s = match cur.take().or_else(|| it.next()) {
                Some(s) => s,
                None => break,
            };
            let take = s.len.min(left);
            piece.segs.push(Seg { len: take, ..s });
            if take < s.len {
                cur = Some(Seg { local_off: s.local_off + take, remote_off: s.remote_off + take, len: s.len - take });
            }
            left -= take;
            at += take;
            if piece.segs.len() == max_segs && left > 0 {
                pieces.push(std::mem::replace(&mut piece, Piece { lane, stream_off: at, segs: Vec::new() }));
            }
        }
        if !piece.segs.is_empty() {
            pieces.push(piece);
        }
    }
    pieces
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Oracle: the byte-level map local byte -> remote byte of a list of segments.
    fn bytes(segs: &[Seg]) -> Vec<(u64, u64)> {
        segs.iter().flat_map(|s| (0..s.len).map(move |i| (s.local_off + i, s.remote_off + i))).collect()
    }

    #[test]
    fn errors_name_the_input() {
        let e = check_batch((1, 100), (2, 50), &[0, 0], &[0], &[1]).unwrap_err();
        assert!(e.msg.contains("2 local offsets, 1 remote offsets, 1 sizes"), "{e}");
        let e = check_batch((1, 100), (2, 50), &[], &[], &[]).unwrap_err();
        assert!(e.msg.contains("empty batch"));
        let e = check_batch((1, 100), (2, 50), &[0, 10], &[0, 45], &[5, 10]).unwrap_err();
        assert!(e.msg.contains("entry 1: remote range offset 45 + length 10 exceeds region 2 of 50 bytes"), "{e}");
        let e = check_batch((1, 100), (2, 50), &[u64::MAX], &[0], &[2]).unwrap_err();
        assert!(e.msg.contains("entry 0: local"), "{e}");
    }

    #[test]
    fn unmerged_keeps_contiguous_entries_apart() {
        let segs = unmerged_segments(&[0, 10, 20, 40], &[100, 110, 120, 0], &[10, 10, 0, 5]);
        assert_eq!(
            segs,
            [
                Seg { local_off: 0, remote_off: 100, len: 10 },
                Seg { local_off: 10, remote_off: 110, len: 10 },
                Seg { local_off: 40, remote_off: 0, len: 5 }
            ]
        );
        // The same entries merge in check_batch.
        assert_eq!(check_batch((1, 64), (2, 256), &[0, 10, 20, 40], &[100, 110, 120, 0], &[10, 10, 0, 5]).unwrap().len(), 2);
        // One pass: the same segments, and check_batch's errors.
        assert_eq!(check_ordered_batch((1, 64), (2, 256), &[0, 10, 20, 40], &[100, 110, 120, 0], &[10, 10, 0, 5]).unwrap(), segs);
        let e = |r: IoResult<Vec<Seg>>| r.unwrap_err().msg;
        assert!(e(check_ordered_batch((1, 64), (2, 256), &[0], &[0, 1], &[1]))
            .contains("batch arrays differ in length: 1 local offsets, 2 remote offsets, 1 sizes"));
        assert_eq!(e(check_ordered_batch((1, 64), (2, 256), &[], &[], &[])), "empty batch: no entries");
        assert!(
            e(check_ordered_batch((1, 64), (2, 256), &[0, 60], &[0, 0], &[4, 8])).starts_with("entry 1: local range offset 60 + length 8")
        );
        assert!(e(check_ordered_batch((1, 64), (2, 256), &[0], &[250], &[8])).starts_with("entry 0: remote range offset 250 + length 8"));
    }

    #[test]
    fn tail_words_are_aligned_and_inside_the_remote_region() {
        use crate::TailWord;
        let w = |offset| TailWord { offset, value: 1 };
        assert!(check_tail_words((2, 256), &[]).is_ok());
        assert!(check_tail_words((2, 256), &[w(0), w(248)]).is_ok());
        let e = |ws: &[TailWord]| check_tail_words((2, 256), ws).unwrap_err().msg;
        assert_eq!(e(&[w(0), w(252)]), "tail word 1: offset 252 of remote memory 2 (256 bytes): must be 8-aligned with its 8 bytes inside");
        assert!(e(&[w(256)]).starts_with("tail word 0: offset 256"));
        assert!(e(&[w(12)]).starts_with("tail word 0: offset 12"));
        assert!(e(&[w(u64::MAX - 7)]).starts_with("tail word 0:"), "no overflow");
        assert!(check_tail_words((2, 1024), &vec![w(0); MAX_TAIL_WORDS]).is_ok());
        assert_eq!(e(&vec![w(0); MAX_TAIL_WORDS + 1]), "65 tail words in one ordered batch: at most 64");
    }

    #[test]
    fn merges_contiguous_and_skips_empty() {
        let s = check_batch((1, 100), (2, 100), &[0, 10, 20, 50], &[0, 10, 30, 60], &[10, 10, 0, 5]).unwrap();
        assert_eq!(s, vec![Seg { local_off: 0, remote_off: 0, len: 20 }, Seg { local_off: 50, remote_off: 60, len: 5 }]);
    }

    #[test]
    fn entry_map_names_the_entries_of_stream_bytes() {
        // Entries: 0 (10 B) and 1 (10 B) merge; 2 is empty; 3 (5 B); 4 is empty.
        let (segs, map) = check_batch_mapped((1, 100), (2, 100), &[0, 10, 20, 50, 60], &[0, 10, 30, 60, 70], &[10, 10, 0, 5, 0]).unwrap();
        assert_eq!(segs.len(), 2);
        assert_eq!(map.entries(), 5);
        assert_eq!(map.of_bytes(0..10), 0..1);
        assert_eq!(map.of_bytes(9..11), 0..2);
        assert_eq!(map.of_bytes(10..20), 1..2);
        assert_eq!(map.of_bytes(15..21), 1..4);
        assert_eq!(map.of_bytes(20..25), 3..4);
        assert_eq!(map.of_bytes(0..25), 0..4);
        assert_eq!(map.of_bytes(30..40).len(), 0);
        assert_eq!(EntryMap::describe(&(3..4)), "batch entry 3");
        assert_eq!(EntryMap::describe(&(0..3)), "batch entries 0..=2");
        // Remote ranges: segment 0 is remote [0, 20) (entries 0 and 1), segment 1 is [60, 65).
        assert_eq!(map.of_remote(&segs, 0..5), Some(0..1));
        assert_eq!(map.of_remote(&segs, 15..62), Some(1..4));
        assert_eq!(map.of_remote(&segs, 20..60), None);
        let e = check_segs_mapped((1, 100), (2, 62), &segs, &map).unwrap_err();
        assert!(e.msg.starts_with("batch entry 3: remote range"), "{e}");
        check_segs_mapped((1, 100), (2, 100), &segs, &map).unwrap();
    }

    proptest! {
        #[test]
        fn entry_map_matches_a_byte_oracle(sizes in proptest::collection::vec(0u64..6, 1..30), a in 0u64..120, n in 0u64..40) {
            let offs: Vec<u64> = sizes.iter().scan(0u64, |acc, &s| { let o = *acc; *acc += s + 1; Some(o) }).collect();
            let (_, map) = check_batch_mapped((1, 1 << 20), (2, 1 << 20), &offs, &offs, &sizes).unwrap();
            // Oracle: the entries owning at least one byte of [a, a + n) of the stream.
            let mut start = 0u64;
            let mut hit = Vec::new();
            for (i, &s) in sizes.iter().enumerate() {
                if s > 0 && n > 0 && start < a + n && a < start + s {
                    hit.push(i as u32);
                }
                start += s;
            }
            let r = map.of_bytes(a..a + n);
            match (hit.first(), hit.last()) {
                (Some(&lo), Some(&hi)) => {
                    prop_assert_eq!(r.start, lo);
                    prop_assert_eq!(r.end, hi + 1);
                }
                _ => prop_assert!(r.is_empty()),
            }
        }

        #[test]
        fn uniform_entry_map_equals_its_table(n in 1u32..40, size in 1u64..9, a in 0u64..400, len in 0u64..60) {
            let sizes = vec![size; n as usize];
            let offs: Vec<u64> = (0..u64::from(n)).map(|i| i * (size + 1)).collect();
            let (_, table) = check_batch_mapped((1, 1 << 20), (2, 1 << 20), &offs, &offs, &sizes).unwrap();
            let uni = EntryMap::uniform(n, size);
            prop_assert_eq!(uni.entries(), table.entries());
            prop_assert_eq!(uni.of_bytes(a..a + len), table.of_bytes(a..a + len));
        }

        #[test]
        fn stripe_covers_every_byte_once_in_order(
            raw in proptest::collection::vec((0u64..64, 1u64..300), 0..40),
            lanes in 1usize..9, first in 0usize..20, min_lane in 1u64..2000, max_segs in 1usize..6,
        ) {
            // Build non-overlapping segments at increasing offsets with gaps.
            let mut segs = Vec::new();
            let (mut lo, mut ro) = (0u64, 7u64);
            for (gap, len) in raw {
                lo += gap; ro += gap * 2 + 1;
                segs.push(Seg { local_off: lo, remote_off: ro, len });
                lo += len; ro += len;
            }
            let pieces = stripe(&segs, lanes, first, min_lane, max_segs);
            // Each piece starts where the bytes before it end.
            let mut at = 0u64;
            for p in &pieces {
                prop_assert_eq!(p.stream_off, at);
                at += p.segs.iter().map(|g| g.len).sum::<u64>();
            }
            let flat: Vec<Seg> = pieces.iter().flat_map(|p| p.segs.clone()).collect();
            prop_assert_eq!(bytes(&flat), bytes(&segs));
            let total: u64 = segs.iter().map(|s| s.len).sum();
            let used = if total == 0 { 0 } else { (total.div_ceil(min_lane) as usize).clamp(1, lanes) };
            let mut per_lane = vec![0u64; lanes];
            for p in &pieces {
                prop_assert!(p.lane < lanes);
                prop_assert!(!p.segs.is_empty() && p.segs.len() <= max_segs);
                per_lane[p.lane] += p.segs.iter().map(|s| s.len).sum::<u64>();
            }
            let busy: Vec<u64> = per_lane.iter().copied().filter(|&b| b > 0).collect();
            prop_assert_eq!(busy.len(), used);
            if let (Some(mx), Some(mn)) = (busy.iter().max(), busy.iter().min()) {
                prop_assert!(mx - mn <= 1);
            }
            if total > 0 {
                prop_assert_eq!(pieces[0].lane, first % lanes);
            }
        }
    }
}
