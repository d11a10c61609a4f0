//! Process-wide counters of every [`super::CopyPool`]: where a submission's CPU time goes
//! (waiting for a free slot, the driver calls that queue its work, the flag write and event record that close it) and how
//! often completion steps ask the driver whether an event fired. They tell a slow post that
//! waits for a slot from one that waits inside the driver (for instance behind other threads'
//! driver calls). Relaxed atomics, a few nanoseconds per submission.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// Totals since the process started, over every pool and device. Times are host clock, ns.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SubmitStats {
    /// Submissions queued (copies, kernels, paged copies).
    pub submissions: u64,
    /// Sum over submissions of the wait for a free event slot, ns.
    pub slot_wait_ns: u64,
    /// Sum over submissions of the driver calls that queue the work (copies, table uploads,
    /// kernel launches), ns.
    pub enqueue_ns: u64,
    /// Sum over submissions of what closes it (its completion flag's write, when the pool
    /// uses flags, and its event record), ns.
    pub record_ns: u64,
    /// Longest single submission (slot wait + enqueue + record), ns.
    pub max_submit_ns: u64,
    /// Event queries made by completion steps (the completion threads and waiters).
    pub event_queries: u64,
    /// Sum of those queries' durations, ns.
    pub event_query_ns: u64,
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
        }
    }

    /// Mean µs per submission of (slot wait, enqueue, record); zeros when none.
    pub fn mean_us(&self) -> (f64, f64, f64) {
        let n = self.submissions.max(1) as f64 * 1e3;
        (self.slot_wait_ns as f64 / n, self.enqueue_ns as f64 / n, self.record_ns as f64 / n)
    }
}

static SUBMISSIONS: AtomicU64 = AtomicU64::new(0);
static SLOT_WAIT_NS: AtomicU64 = AtomicU64::new(0);
static ENQUEUE_NS: AtomicU64 = AtomicU64::new(0);
static RECORD_NS: AtomicU64 = AtomicU64::new(0);
static MAX_SUBMIT_NS: AtomicU64 = AtomicU64::new(0);
static EVENT_QUERIES: AtomicU64 = AtomicU64::new(0);
static EVENT_QUERY_NS: AtomicU64 = AtomicU64::new(0);

/// The process's totals so far.
pub fn submit_stats() -> SubmitStats {
    SubmitStats {
        submissions: SUBMISSIONS.load(Ordering::Relaxed),
        slot_wait_ns: SLOT_WAIT_NS.load(Ordering::Relaxed),
        enqueue_ns: ENQUEUE_NS.load(Ordering::Relaxed),
        record_ns: RECORD_NS.load(Ordering::Relaxed),
        max_submit_ns: MAX_SUBMIT_NS.load(Ordering::Relaxed),
        event_queries: EVENT_QUERIES.load(Ordering::Relaxed),
        event_query_ns: EVENT_QUERY_NS.load(Ordering::Relaxed),
    }
}

fn ns(a: Instant, b: Instant) -> u64 {
    b.saturating_duration_since(a).as_nanos().min(u64::MAX as u128) as u64
}

/// Counts one submission from its four instants: start, slot taken, work queued, recorded.
pub(super) fn count_submit(t: [Instant; 4]) {
    SUBMISSIONS.fetch_add(1, Ordering::Relaxed);
    SLOT_WAIT_NS.fetch_add(ns(t[0], t[1]), Ordering::Relaxed);
    ENQUEUE_NS.fetch_add(ns(t[1], t[2]), Ordering::Relaxed);
    RECORD_NS.fetch_add(ns(t[2], t[3]), Ordering::Relaxed);
    MAX_SUBMIT_NS.fetch_max(ns(t[0], t[3]), Ordering::Relaxed);
}

/// Counts one event query that started at `since`.
pub(super) fn count_query(since: Instant) {
    EVENT_QUERIES.fetch_add(1, Ordering::Relaxed);
    EVENT_QUERY_NS.fetch_add(ns(since, Instant::now()), Ordering::Relaxed);
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
        };
        let b = SubmitStats {
            submissions: 6,
            slot_wait_ns: 1400,
            enqueue_ns: 12000,
            record_ns: 1000,
            max_submit_ns: 9000,
            event_queries: 9,
            event_query_ns: 90,
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
                event_query_ns: 40
            }
        );
        assert_eq!(d.mean_us(), (0.1, 2.0, 0.2));
        assert_eq!(SubmitStats::default().mean_us(), (0.0, 0.0, 0.0));
    }

    #[test]
    fn counting_moves_the_totals() {
        let before = submit_stats();
        let t0 = Instant::now();
        let t = [t0, t0 + Duration::from_micros(3), t0 + Duration::from_micros(10), t0 + Duration::from_micros(11)];
        count_submit(t);
        let d = submit_stats().since(&before);
        // Other tests of this process may submit meanwhile: at least this one is counted.
        assert!(d.submissions >= 1 && d.slot_wait_ns >= 3000 && d.enqueue_ns >= 7000 && d.record_ns >= 1000, "{d:?}");
        assert!(d.max_submit_ns >= 11_000, "{d:?}");
    }
}
