//! Process-wide counters of every [`super::CopyPool`]: where a submission's CPU time goes
//! (waiting for a free slot, queueing its work, closing it with its flag write and event
//! record) and how often completion steps ask the driver whether an event fired. They tell a
//! slow post that waits for a slot from one that waits inside the driver (for instance behind
//! other threads' driver calls). Submissions add to their counters once each; a completion
//! step adds its queries once per step, on a cache line of their own, so that counting does
//! not make the polling threads contend.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// Totals since the process started, over every pool and device. Times are host clock, ns.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SubmitStats {
    /// Submissions queued (copies, kernels, paged copies).
    pub submissions: u64,
    /// Sum over submissions of the wait for a free event slot (completion steps run meanwhile,
    /// with their callbacks), ns.
    pub slot_wait_ns: u64,
    /// Sum over submissions of queueing the work: the driver calls (copies, table uploads,
    /// kernel launches) and the host work around them (descriptor tables, a slot buffer's
    /// first allocation), ns.
    pub enqueue_ns: u64,
    /// Sum over submissions of what closes it (its completion flag's write, when the pool
    /// uses flags, and its event record), ns.
    pub record_ns: u64,
    /// Longest single submission (slot wait + enqueue + close) since the process started, ns
    /// ([`SubmitStats::since`] keeps the later snapshot's).
    pub max_submit_ns: u64,
    /// Event queries made by completion steps (the completion threads and waiters).
    pub event_queries: u64,
    /// Sum of those queries' durations, ns.
    pub event_query_ns: u64,
    /// Submissions of pools using completion flags whose event was seen fired before their
    /// flag (each waited for the once-a-millisecond event check): flags that do not arrive.
    pub flag_misses: u64,
    /// Submissions queued as one launch of the ordered-copy kernel
    /// ([`super::CopyPoolConfig::ordered_kernel`]): an ordered batch, or up to 8 segments of
    /// several posted together.
    pub ordered_launches: u64,
    /// Ordered batches that fired an armed launch ([`super::CopyPoolConfig::armed_depth`]):
    /// no driver call when posted (counted in `submissions` too, with no slot wait).
    pub armed_fires: u64,
    /// Ordered batches posted to the resident copier ([`super::CopyPoolConfig::resident_blocks`]):
    /// no driver call unless its grid had to be launched (counted in `submissions` too).
    pub resident_posts: u64,
    /// Grids of the resident copier launched (the first post, then one after each idle exit).
    pub resident_launches: u64,
    /// Resident tables completed with all three GPU-clock stamps in order (kernels/README.md,
    /// `mori_ordered_copy_resident`): the count behind the next three sums.
    pub resident_timed: u64,
    /// Sum over them of the GPU clock from block 0 seeing the table posted to publishing it to
    /// the other blocks, ns.
    pub resident_relay_ns: u64,
    /// Sum over them of the GPU clock from publishing the table to its flag's write (every
    /// block's copy, the arrivals, the last segments), ns.
    pub resident_run_ns: u64,
    /// Sum over them of the host clock from the post's return to a completion step seeing the
    /// flag, ns.
    pub resident_done_ns: u64,
}

impl SubmitStats {
    /// `self - earlier`, field by field (saturating), with `max_submit_ns` kept as `self`'s:
    /// what happened between two snapshots.
    pub fn since(&self, earlier: &SubmitStats) -> SubmitStats {
        SubmitStats {
            submissions: self.submissions.saturating_sub(earlier.submissions),
            slot_wait_ns: self.slot_wait_ns.saturating_sub(earlier.slot_wait_ns),
            enqueue_ns: self.enqueue_ns.saturating_sub(earlier.enqueue_ns),
            record_ns: self.record_ns.saturating_sub(earlier.record_ns),
            max_submit_ns: self.max_submit_ns,
            event_queries: self.event_queries.saturating_sub(earlier.event_queries),
            event_query_ns: self.event_query_ns.saturating_sub(earlier.event_query_ns),
            flag_misses: self.flag_misses.saturating_sub(earlier.flag_misses),
            ordered_launches: self.ordered_launches.saturating_sub(earlier.ordered_launches),
            armed_fires: self.armed_fires.saturating_sub(earlier.armed_fires),
            resident_posts: self.resident_posts.saturating_sub(earlier.resident_posts),
            resident_launches: self.resident_launches.saturating_sub(earlier.resident_launches),
            resident_timed: self.resident_timed.saturating_sub(earlier.resident_timed),
            resident_relay_ns: self.resident_relay_ns.saturating_sub(earlier.resident_relay_ns),
            resident_run_ns: self.resident_run_ns.saturating_sub(earlier.resident_run_ns),
            resident_done_ns: self.resident_done_ns.saturating_sub(earlier.resident_done_ns),
        }
    }

    /// Mean µs per timed resident table of (relay, run, post to done): see the fields; zeros
    /// when none.
    pub fn resident_mean_us(&self) -> (f64, f64, f64) {
        let n = self.resident_timed.max(1) as f64 * 1e3;
        (self.resident_relay_ns as f64 / n, self.resident_run_ns as f64 / n, self.resident_done_ns as f64 / n)
    }

    /// Mean µs of an event query; 0 when none.
    pub fn mean_query_us(&self) -> f64 {
        self.event_query_ns as f64 / self.event_queries.max(1) as f64 / 1e3
    }

    /// Mean µs per submission of (slot wait, enqueue, close); zeros when none.
    pub fn mean_us(&self) -> (f64, f64, f64) {
        let n = self.submissions.max(1) as f64 * 1e3;
        (self.slot_wait_ns as f64 / n, self.enqueue_ns as f64 / n, self.record_ns as f64 / n)
    }
}

/// The submitters' counters.
#[repr(align(64))]
struct Submits {
    n: AtomicU64,
    slot_wait_ns: AtomicU64,
    enqueue_ns: AtomicU64,
    record_ns: AtomicU64,
    max_ns: AtomicU64,
    ordered: AtomicU64,
    armed: AtomicU64,
    resident: AtomicU64,
    resident_launches: AtomicU64,
}

/// The completion steps' counters, on a cache line apart from the submitters'.
#[repr(align(64))]
struct Queries {
    n: AtomicU64,
    ns: AtomicU64,
    flag_misses: AtomicU64,
    resident_timed: AtomicU64,
    resident_relay_ns: AtomicU64,
    resident_run_ns: AtomicU64,
    resident_done_ns: AtomicU64,
}

static SUBMITS: Submits = Submits {
    n: AtomicU64::new(0),
    slot_wait_ns: AtomicU64::new(0),
    enqueue_ns: AtomicU64::new(0),
    record_ns: AtomicU64::new(0),
    max_ns: AtomicU64::new(0),
    ordered: AtomicU64::new(0),
    armed: AtomicU64::new(0),
    resident: AtomicU64::new(0),
    resident_launches: AtomicU64::new(0),
};
static QUERIES: Queries = Queries {
    n: AtomicU64::new(0),
    ns: AtomicU64::new(0),
    flag_misses: AtomicU64::new(0),
    resident_timed: AtomicU64::new(0),
    resident_relay_ns: AtomicU64::new(0),
    resident_run_ns: AtomicU64::new(0),
    resident_done_ns: AtomicU64::new(0),
};

/// The process's totals so far.
pub fn submit_stats() -> SubmitStats {
    SubmitStats {
        submissions: SUBMITS.n.load(Ordering::Relaxed),
        slot_wait_ns: SUBMITS.slot_wait_ns.load(Ordering::Relaxed),
        enqueue_ns: SUBMITS.enqueue_ns.load(Ordering::Relaxed),
        record_ns: SUBMITS.record_ns.load(Ordering::Relaxed),
        max_submit_ns: SUBMITS.max_ns.load(Ordering::Relaxed),
        event_queries: QUERIES.n.load(Ordering::Relaxed),
        event_query_ns: QUERIES.ns.load(Ordering::Relaxed),
        flag_misses: QUERIES.flag_misses.load(Ordering::Relaxed),
        ordered_launches: SUBMITS.ordered.load(Ordering::Relaxed),
        armed_fires: SUBMITS.armed.load(Ordering::Relaxed),
        resident_posts: SUBMITS.resident.load(Ordering::Relaxed),
        resident_launches: SUBMITS.resident_launches.load(Ordering::Relaxed),
        resident_timed: QUERIES.resident_timed.load(Ordering::Relaxed),
        resident_relay_ns: QUERIES.resident_relay_ns.load(Ordering::Relaxed),
        resident_run_ns: QUERIES.resident_run_ns.load(Ordering::Relaxed),
        resident_done_ns: QUERIES.resident_done_ns.load(Ordering::Relaxed),
    }
}

fn ns(a: Instant, b: Instant) -> u64 {
    b.saturating_duration_since(a).as_nanos().min(u64::MAX as u128) as u64
}

/// Counts one submission from its four instants: start, slot taken, work queued, closed.
pub(super) fn count_submit(t: [Instant; 4]) {
    SUBMITS.n.fetch_add(1, Ordering::Relaxed);
    SUBMITS.slot_wait_ns.fetch_add(ns(t[0], t[1]), Ordering::Relaxed);
    SUBMITS.enqueue_ns.fetch_add(ns(t[1], t[2]), Ordering::Relaxed);
    SUBMITS.record_ns.fetch_add(ns(t[2], t[3]), Ordering::Relaxed);
    SUBMITS.max_ns.fetch_max(ns(t[0], t[3]), Ordering::Relaxed);
}

/// Counts one launch of the ordered-copy kernel (one or several ordered batches).
pub(super) fn count_ordered() {
    SUBMITS.ordered.fetch_add(1, Ordering::Relaxed);
}

/// Counts one fired armed launch.
pub(super) fn count_armed() {
    SUBMITS.armed.fetch_add(1, Ordering::Relaxed);
}

/// Counts one table posted to a resident copier.
pub(super) fn count_resident() {
    SUBMITS.resident.fetch_add(1, Ordering::Relaxed);
}

/// Counts one launch of a resident copier's grid.
pub(super) fn count_resident_launch() {
    SUBMITS.resident_launches.fetch_add(1, Ordering::Relaxed);
}

/// Counts one completed resident table's spans (relay, run: GPU clock, ns) and the host time
/// from its post to its completion being seen.
pub(super) fn count_resident_spans((relay, run): (u64, u64), done: Instant, posted: Instant) {
    QUERIES.resident_timed.fetch_add(1, Ordering::Relaxed);
    QUERIES.resident_relay_ns.fetch_add(relay, Ordering::Relaxed);
    QUERIES.resident_run_ns.fetch_add(run, Ordering::Relaxed);
    QUERIES.resident_done_ns.fetch_add(ns(posted, done), Ordering::Relaxed);
}

/// One completion step's tally, added to the totals once when dropped.
#[derive(Default)]
pub(super) struct StepTally {
    queries: u64,
    query_ns: u64,
    flag_misses: u64,
}

impl StepTally {
    /// Counts one event query that started at `since` and has just returned.
    pub(super) fn query(&mut self, since: Instant) {
        self.queries += 1;
        self.query_ns += ns(since, Instant::now());
    }

    /// Counts one submission whose event was seen fired before its flag.
    pub(super) fn flag_miss(&mut self) {
        self.flag_misses += 1;
    }
}

impl Drop for StepTally {
    fn drop(&mut self) {
        if self.queries > 0 {
            QUERIES.n.fetch_add(self.queries, Ordering::Relaxed);
            QUERIES.ns.fetch_add(self.query_ns, Ordering::Relaxed);
        }
        if self.flag_misses > 0 {
            QUERIES.flag_misses.fetch_add(self.flag_misses, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn since_subtracts_and_means_divide() {
        let a = SubmitStats {
            submissions: 2,
            slot_wait_ns: 1000,
            enqueue_ns: 4000,
            record_ns: 200,
            max_submit_ns: 3000,
            event_queries: 5,
            event_query_ns: 50,
            flag_misses: 1,
            ordered_launches: 1,
            armed_fires: 2,
            resident_posts: 1,
            resident_launches: 1,
            resident_timed: 1,
            resident_relay_ns: 1_000,
            resident_run_ns: 3_000,
            resident_done_ns: 9_000,
        };
        let b = SubmitStats {
            submissions: 6,
            slot_wait_ns: 1400,
            enqueue_ns: 12000,
            record_ns: 1000,
            max_submit_ns: 9000,
            event_queries: 9,
            event_query_ns: 90,
            flag_misses: 3,
            ordered_launches: 4,
            armed_fires: 7,
            resident_posts: 4,
            resident_launches: 3,
            resident_timed: 3,
            resident_relay_ns: 3_000,
            resident_run_ns: 11_000,
            resident_done_ns: 29_000,
        };
        let d = b.since(&a);
        assert_eq!(
            d,
            SubmitStats {
                submissions: 4,
                slot_wait_ns: 400,
                enqueue_ns: 8000,
                record_ns: 800,
                max_submit_ns: 9000,
                event_queries: 4,
                event_query_ns: 40,
                flag_misses: 2,
                ordered_launches: 3,
                armed_fires: 5,
                resident_posts: 3,
                resident_launches: 2,
                resident_timed: 2,
                resident_relay_ns: 2_000,
                resident_run_ns: 8_000,
                resident_done_ns: 20_000,
            }
        );
        assert_eq!(d.resident_mean_us(), (1.0, 4.0, 10.0));
        assert_eq!(SubmitStats::default().resident_mean_us(), (0.0, 0.0, 0.0));
        assert_eq!(d.mean_us(), (0.1, 2.0, 0.2));
        assert_eq!(d.mean_query_us(), 0.01);
        assert_eq!(SubmitStats::default().mean_us(), (0.0, 0.0, 0.0));
    }

    #[test]
    fn counting_moves_the_totals() {
        let before = submit_stats();
        let t0 = Instant::now();
        let t = [t0, t0 + Duration::from_micros(3), t0 + Duration::from_micros(10), t0 + Duration::from_micros(11)];
        count_submit(t);
        {
            let mut step = StepTally::default();
            step.query(Instant::now() - Duration::from_micros(2));
            step.query(Instant::now());
            step.flag_miss();
        }
        let d = submit_stats().since(&before);
        // Other tests of this process may submit meanwhile: at least these are counted.
        assert!(d.submissions >= 1 && d.slot_wait_ns >= 3000 && d.enqueue_ns >= 7000 && d.record_ns >= 1000, "{d:?}");
        assert!(d.max_submit_ns >= 11_000, "{d:?}");
        assert!(d.event_queries >= 2 && d.event_query_ns >= 2000 && d.flag_misses >= 1, "{d:?}");
    }
}
