//! Copies closed by stream writes ([`CopyPool::copy_then_write`]): each ordered batch's
//! segments as copy-engine copies, then small words (a counter pair that tells a peer the
//! segment landed) and the slot's completion flag in one stream memory-operation batch behind
//! them. A batch of a segment and its pair then costs two driver calls and the copy engine's
//! latency, where the ordered-copy kernel costs one call but waits for a launch. Measured under
//! the inter-node EP on an H100, the second call cost more than the shorter wait saved
//! (docs/PERFORMANCE.md, "Counter pairs as tail words"), so the EP proxy uses it only when
//! told to.

use super::{copy_engine, CopyPool, CopySeg, Lane};
use crate::error::{GpuError, Result};
use crate::types::{Device, StreamWrite, STREAM_WRITES_MAX};

/// Checks `groups`' words: at least one segment or word in all, at most
/// [`STREAM_WRITES_MAX`] - 1 words (one is the completion flag's), each aligned to its size.
/// Returns the number of words.
pub(super) fn check_words(groups: &[(&[CopySeg], &[StreamWrite])]) -> Result<usize> {
    let words: usize = groups.iter().map(|(_, w)| w.len()).sum();
    if words > STREAM_WRITES_MAX - 1 {
        return Err(GpuError::invalid(format!(
            "copy pool: {words} stream writes in one submission: at most {} (one more is the completion flag)",
            STREAM_WRITES_MAX - 1
        )));
    }
    if let Some(w) = groups.iter().flat_map(|(_, w)| w.iter()).find(|w| !w.addr().is_multiple_of(w.bytes())) {
        return Err(GpuError::invalid(format!("copy pool: a {}-byte stream write at {:#x}: not aligned to its size", w.bytes(), w.addr())));
    }
    if words == 0 && groups.iter().all(|(s, _)| s.iter().all(|s| s.len == 0)) {
        return Err(GpuError::invalid("copy pool: a submission of copies and stream writes with neither"));
    }
    Ok(words)
}

impl CopyPool {
    /// Queues `groups` on `dev` as one submission: each group's segments (empty ones skipped)
    /// as one async copy each, in order on the submission's stream, then every group's words
    /// and the completion flag in one stream memory-operation batch (CUDA:
    /// `cuStreamBatchMemOp`; each write is fenced behind the copies before it). So on CUDA
    /// each group's words land only after its segments, as with
    /// [`CopyPool::copy_in_order_with`], and the groups share the one batch (on HIP the
    /// writes are not documented to fence the copies: [`StreamWrite`]). `make_done` as in
    /// [`CopyPool::copy_with`]; the submission completes once the last word was written.
    ///
    /// Errors (nothing queued): `InvalidArgument` for more than [`STREAM_WRITES_MAX`] - 1
    /// words, a word not aligned to its size, or no segment and no word; else as
    /// [`CopyPool::submit`].
    ///
    /// # Safety
    /// As [`CopyPool::copy`], for every segment; every word's bytes must be memory (device, or
    /// mapped host memory by its device address) that `dev` may write, mapped until `done`
    /// has been called.
    pub unsafe fn copy_then_write<M, D>(&self, dev: Device, groups: &[(&[CopySeg], &[StreamWrite])], make_done: M) -> Result<()>
    where
        M: FnOnce() -> D,
        D: FnOnce(Result<()>) + Send + 'static,
    {
        let words = check_words(groups)?;
        let dp = self.shared.dev_pool(dev)?;
        let rt = &self.shared.rt;
        let enqueue = |lane: &mut Lane<'_>| -> Result<()> {
            let segs = groups.iter().flat_map(|(s, _)| s.iter().copied()).filter(|s| s.len > 0);
            // SAFETY: forwarded contract.
            unsafe { copy_engine(rt, dev, segs, lane.stream()) }?;
            let mut all: Vec<StreamWrite> = Vec::with_capacity(words + 1);
            all.extend(groups.iter().flat_map(|(_, w)| w.iter().copied()));
            if let Some((addr, value)) = lane.flag {
                all.push(StreamWrite::U32 { addr, value });
            }
            if all.is_empty() {
                return Ok(());
            }
            // SAFETY: the stream is live; every word is writable by `dev` (forwarded contract)
            // and the flag is the slot's own mapped word.
            unsafe { rt.raw().stream_write_values(dev, lane.stream().raw(), &all) }?;
            lane.flag_taken = lane.flag.is_some();
            Ok(())
        };
        // SAFETY: forwarded contract.
        unsafe { self.submit_on(dp, enqueue, make_done) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_are_checked_before_anything_is_queued() {
        let seg = [CopySeg { src: 0x1000, dst: 0x2000, len: 64 }];
        let pair = [StreamWrite::U64 { addr: 0x3000, value: 4 }, StreamWrite::U64 { addr: 0x3008, value: 5 }];
        assert_eq!(check_words(&[(&seg, &pair)]).unwrap(), 2);
        assert_eq!(check_words(&[(&seg, &[])]).unwrap(), 0, "copies alone");
        assert_eq!(check_words(&[(&[], &pair[..1])]).unwrap(), 1, "a word alone");
        let e = check_words(&[(&[CopySeg { len: 0, ..seg[0] }], &[])]).unwrap_err().to_string();
        assert!(e.contains("with neither"), "{e}");
        let e = check_words(&[(&seg, &[StreamWrite::U64 { addr: 0x3004, value: 1 }])]).unwrap_err().to_string();
        assert!(e.contains("8-byte stream write at 0x3004"), "{e}");
        let e = check_words(&[(&seg, &[StreamWrite::U32 { addr: 0x3002, value: 1 }])]).unwrap_err().to_string();
        assert!(e.contains("4-byte stream write at 0x3002"), "{e}");
        let many = vec![StreamWrite::U64 { addr: 0x3000, value: 1 }; STREAM_WRITES_MAX - 1];
        assert_eq!(check_words(&[(&seg, &many[..100]), (&[], &many[100..])]).unwrap(), STREAM_WRITES_MAX - 1);
        let over = vec![StreamWrite::U64 { addr: 0x3000, value: 1 }; STREAM_WRITES_MAX];
        let e = check_words(&[(&seg, &over)]).unwrap_err().to_string();
        assert!(e.contains("255 stream writes in one submission: at most 254"), "{e}");
    }
}
