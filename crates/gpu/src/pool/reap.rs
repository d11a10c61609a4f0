//! The completion step: submissions whose event or flag fired are completed (slot freed,
//! stream released, `done` called), by the pool's completion thread or a waiting thread.

use super::*;

impl Shared {
    /// Completes every submission whose event fired (slot freed, stream released, `done`
    /// called). `mine` is the step's own list (the `reap` lock); the submitters' list is
    /// taken over first, so submitting never waits for a driver call made here. Returns
    /// (completed, still in flight).
    pub(super) fn reap_once(&self, mine: &mut Vec<Pending>) -> (usize, usize) {
        mine.append(&mut self.pending.lock());
        let mut tally = stats::StepTally::default();
        let mut done = 0;
        // Devices whose armed launches completed: armed again once the callbacks ran.
        let mut rearm: Vec<u32> = Vec::new();
        let mut i = 0;
        while i < mine.len() {
            let Some(dp) = self.devs.get(mine[i].dev as usize).and_then(OnceLock::get) else {
                // Unreachable: a pending entry's device pool was created before it was queued.
                i += 1;
                continue;
            };
            let p = &mut mine[i];
            let flag = dp.slots[p.slot].flag.as_ref().filter(|_| p.flag_seq != 0);
            let fired = match (flag, dp.resident.as_ref().filter(|_| p.stream == RESIDENT_LANE)) {
                // A resident table: no event follows it; its flag, the grid's stream (a
                // fault) and the deadline tell.
                (Some(f), Some(_)) if f.fired(p.flag_seq) => Ok(true),
                (_, Some(r)) => match r.fault() {
                    Some(e) => Err(e),
                    None if p.posted_at().elapsed() > resident::RESIDENT_DEADLINE => Err(r.overdue()),
                    None => Ok(false),
                },
                (flag, None) => match flag {
                    Some(f) if f.fired(p.flag_seq) => Ok(true),
                    Some(_) if p.asked.elapsed() < FLAG_FALLBACK => Ok(false),
                    _ => {
                        p.asked = Instant::now();
                        let r = dp.slots[p.slot].event.query();
                        tally.query(p.asked);
                        // The flag is written before the event is recorded: an event that fired
                        // with its flag unseen means flags do not reach this host.
                        if matches!(r, Ok(true)) && flag.is_some_and(|f| !f.fired(p.flag_seq)) {
                            tally.flag_miss();
                            flags::warn_once(&flags::SAID_MISSED, "an event fired before its completion flag was seen: flags do not reach the host here; completions wait for the once-a-millisecond event check");
                        }
                        r
                    }
                },
            };
            let r = match fired {
                Ok(false) => {
                    i += 1;
                    continue;
                }
                Ok(true) => mine[i].failed.take().map_or(Ok(()), Err),
                Err(e) => Err(e),
            };
            let p = mine.swap_remove(i);
            if p.stream == RESIDENT_LANE {
                match (dp.resident.as_ref(), r.as_ref()) {
                    (Some(res), Ok(_)) => {
                        if let Some(spans) = res.spans(p.table) {
                            stats::count_resident_spans(spans, Instant::now(), p.posted_at());
                        }
                        res.completed(p.table)
                    }
                    // Failed by the deadline or a fault, the table may still run: its flag
                    // word is never handed out again.
                    (_, Err(_)) => {
                        dp.slots[p.slot].retired.store(true, Ordering::Release);
                        dp.retired.fetch_add(1, Ordering::AcqRel);
                    }
                    _ => {}
                }
            }
            match (p.stream, dp.armed.as_ref()) {
                (ARMED_LANE, Some(a)) => {
                    a.completed();
                    rearm.push(p.dev);
                }
                (ARMED_LANE | RESIDENT_LANE, _) => {}
                (lane, _) => {
                    dp.busy[lane].fetch_sub(1, Ordering::AcqRel);
                }
            }
            if !dp.slots[p.slot].retired.load(Ordering::Acquire) {
                dp.free.lock().push(p.slot);
            }
            // A panicking callback must not take the completion thread (or a waiter's step)
            // down with it: every later submission would then never complete.
            let done_fn = p.done;
            if std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || done_fn(r))).is_err() {
                tracing::error!(device = p.dev, "copy pool: a completion callback panicked");
            }
            done += 1;
        }
        rearm.sort_unstable();
        rearm.dedup();
        for d in rearm {
            if let Some(dp) = self.devs.get(d as usize).and_then(OnceLock::get) {
                dp.top_up(false);
            }
        }
        (done, mine.len())
    }

    fn run_hook(&self) {
        if let Some(h) = self.hook.get() {
            h();
        }
    }

    /// The completion thread. While waiters drive completions (`driven` moves) it only runs
    /// the idle hook, every [`STAND_BACK`]. Otherwise it runs the completion step: spinning
    /// while submissions are in flight (completion latency is what stop-and-wait transfers
    /// measure), backing off to yields and then short sleeps when idle.
    pub(super) fn reap_loop(&self) {
        let mut idle = 0u32;
        let mut seen = self.driven.load(Ordering::Acquire);
        while !self.shutdown.load(Ordering::Acquire) {
            let d = self.driven.load(Ordering::Acquire);
            if d != seen {
                seen = d;
                self.run_hook();
                std::thread::sleep(STAND_BACK);
                continue;
            }
            let (done, in_flight) = self.reap_once(&mut self.reap.lock());
            self.run_hook();
            if done > 0 {
                idle = 0;
            } else if in_flight > 0 {
                if self.cfg.spin_in_flight {
                    for _ in 0..8 {
                        std::hint::spin_loop();
                    }
                } else {
                    std::thread::yield_now();
                }
            } else {
                idle = idle.saturating_add(1);
                if idle < 256 {
                    std::thread::yield_now();
                } else {
                    std::thread::sleep(Duration::from_micros(20));
                }
            }
        }
        self.run_hook();
    }
}
