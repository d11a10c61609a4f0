//! An ordered batch's table on the device: one launch of the ordered-copy kernel, the fire of
//! an armed launch, or a post to the resident copier (the last two with no driver call), and
//! the pending completion of the flagged ones.

use super::*;

impl CopyPool {
    /// One launch of `f`, `dp`'s ordered-copy kernel, for `table` (see
    /// [`CopyPool::copy_in_order_with`]), `groups` groups whose longest first segment is
    /// `first` bytes long.
    ///
    /// # Safety
    /// As [`CopyPool::copy`].
    pub(super) unsafe fn copy_ordered<M, D>(
        &self,
        dp: &DevPool,
        f: &Function,
        table: ordered::OrderedCopy,
        groups: u32,
        first: u64,
        make_done: M,
    ) -> Result<()>
    where
        M: FnOnce() -> D,
        D: FnOnce(Result<()>) + Send + 'static,
    {
        let make_done = match dp.resident.as_ref().filter(|r| r.takes(&table)) {
            // SAFETY: forwarded contract.
            Some(r) => match unsafe { self.post_resident(dp, r, table, make_done) } {
                Ok(r) => return r,
                // Every table slot busy, or the copier failed (said once): launched.
                Err(m) => m,
            },
            None => make_done,
        };
        let make_done = match dp.armed.as_ref().filter(|a| a.can_fire(groups)) {
            // SAFETY: forwarded contract.
            Some(a) => match unsafe { self.fire_armed(dp, a, table, make_done) } {
                Ok(r) => return r,
                // Another thread fired the last armed launch meanwhile.
                Err(m) => m,
            },
            None => make_done,
        };
        let rt = &self.shared.rt;
        let grid = ordered::grid(first, groups, dp.sms);
        if !table.takes(grid) {
            return Err(GpuError::invalid(format!(
                "copy pool: an ordered-copy table the kernel would refuse ({groups} groups on a grid of {grid}): nothing was queued"
            )));
        }
        let enqueue = |lane: &mut Lane<'_>| -> Result<()> {
            let arrivals = lane.arrivals.ok_or_else(|| GpuError::invalid("copy pool: the slot has no arrival word"))?;
            let t = table.finish(arrivals, lane.flag);
            let mut args = KernelArgs::new();
            args.push(t);
            let cfg = LaunchConfig { grid: (grid, 1, 1), block: (ordered::ORDERED_BLOCK, 1, 1), shared_mem_bytes: 0 };
            // SAFETY: the kernel's ABI is (OrderedCopy by value) (kernels/README.md); every
            // segment's ranges are mapped device memory (forwarded contract), the arrival word
            // is this slot's (no other submission uses it until this one completed) and the
            // flag word is this slot's mapped flag.
            unsafe { rt.launch(f, lane.stream(), &cfg, &args.params()) }?;
            lane.flag_taken = lane.flag.is_some();
            stats::count_ordered();
            Ok(())
        };
        // SAFETY: forwarded contract.
        let r = unsafe { self.submit_on(dp, enqueue, make_done) };
        dp.top_up(true);
        r
    }

    /// Fires `dp`'s oldest armed launch for `table` (see [`CopyPoolConfig::armed_depth`]):
    /// the table and the launch's slot's flag written into host memory, then the doorbell; no
    /// driver call before the device starts. Then arms a launch in its place. Returns
    /// `Err(make_done)` when nothing was armed (another thread fired it).
    ///
    /// # Safety
    /// As [`CopyPool::copy`], for the table's segments.
    unsafe fn fire_armed<M, D>(
        &self,
        dp: &DevPool,
        a: &armed::Armed,
        table: ordered::OrderedCopy,
        make_done: M,
    ) -> std::result::Result<Result<()>, M>
    where
        M: FnOnce() -> D,
        D: FnOnce(Result<()>) + Send + 'static,
    {
        let t0 = Instant::now();
        let mut flag_seq = 0;
        let fired = a.fire(table, |slot| {
            let (w, seq) = dp.next_flag(slot)?;
            flag_seq = seq;
            Some((w.ptr(), seq))
        });
        let Some(slot) = fired else { return Err(make_done) };
        let t1 = Instant::now();
        stats::count_submit([t0, t0, t1, t1]);
        stats::count_armed();
        self.pend_flagged(dp, slot, (ARMED_LANE, 0), flag_seq, t1, make_done);
        dp.top_up(true);
        Ok(Ok(()))
    }

    /// Posts `table` to `dp`'s resident copier (see [`CopyPoolConfig::resident_blocks`]): a
    /// free slot taken for its completion flag, the table written into host memory, no driver
    /// call unless no grid runs. Returns `Err(make_done)` when the copier does not take it
    /// now (every table slot busy, no flag, a failed launch: the caller launches).
    ///
    /// # Safety
    /// As [`CopyPool::copy`], for the table's segments.
    unsafe fn post_resident<M, D>(
        &self,
        dp: &DevPool,
        r: &resident::Resident,
        table: ordered::OrderedCopy,
        make_done: M,
    ) -> std::result::Result<Result<()>, M>
    where
        M: FnOnce() -> D,
        D: FnOnce(Result<()>) + Send + 'static,
    {
        let t0 = Instant::now();
        let Ok(slot) = self.shared.take_slot(dp) else { return Err(make_done) };
        let t1 = Instant::now();
        let Some((w, flag_seq)) = dp.next_flag(slot).map(|(w, seq)| (w.ptr(), seq)) else {
            dp.free.lock().push(slot);
            return Err(make_done);
        };
        let table_slot = match r.post(table, (w, flag_seq)) {
            Ok(Some(t)) => t,
            Ok(None) | Err(_) => {
                dp.free.lock().push(slot);
                return Err(make_done);
            }
        };
        let t2 = Instant::now();
        stats::count_submit([t0, t1, t2, t2]);
        stats::count_resident();
        self.pend_flagged(dp, slot, (RESIDENT_LANE, table_slot), flag_seq, t2, make_done);
        Ok(Ok(()))
    }

    /// Adds a submission that ran with no driver call (an armed fire, a resident post) to the
    /// pending ones: slot `slot`, its (lane, table slot), the flag value that completes it and
    /// when it was posted. The completion is made and boxed only now: the device may already
    /// run the copy.
    fn pend_flagged<M, D>(&self, dp: &DevPool, slot: usize, (stream, table): (usize, usize), flag_seq: u32, at: Instant, make_done: M)
    where
        M: FnOnce() -> D,
        D: FnOnce(Result<()>) + Send + 'static,
    {
        let done: CopyDone = Box::new(make_done());
        let p = Pending { dev: dp.device.0, slot, stream, table, done, failed: None, flag_seq, asked: at };
        self.shared.pending.lock().push(p);
    }
}
