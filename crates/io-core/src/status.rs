//! [`TransferStatus`]: the completion handle of one posted transfer.

use crate::error::{ErrorCode, IoError};
use parking_lot::{Condvar, Mutex};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU8, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

const IN_PROGRESS: u8 = 0;
const SUCCESS: u8 = 1;
const FAILED: u8 = 2;

/// Transfer identifier, unique per initiating engine (see `IoEngine::allocate_transfer_uid`).
pub type TransferId = u64;

struct Inner {
    state: AtomicU8,
    pending: AtomicU32,
    /// The first error (what [`TransferStatus::poll`] returns) and every failed piece's entries.
    error: Mutex<Failures>,
    waiters: AtomicU32,
    lock: Mutex<()>,
    cv: Condvar,
    /// The backend's completion step, run by a waiting thread itself (see [`Progress`]).
    driver: OnceLock<Weak<dyn Progress>>,
    /// Run once by the thread that ends the status ([`TransferStatus::on_done`]).
    hook: Mutex<Option<DoneHook>>,
    /// Set once a hook was stored: the ending thread takes the hook's lock only then (every
    /// transfer ends through `end_pieces`; almost none has a hook).
    has_hook: AtomicBool,
}

/// What [`TransferStatus::on_done`] runs.
type DoneHook = Box<dyn FnOnce() + Send>;

/// A backend's non-blocking completion step, which a thread waiting on a transfer may run
/// itself instead of waiting for the backend's completion thread to run it and hand the
/// result over.
///
/// This is the progress model of NIXL's `getXferStatus` and UCX's `ucp_worker_progress`: the
/// thread that polls does the completion work, so a stop-and-wait caller pays no cross-thread
/// hand-off (measured on the H200 xgmi path: docs/PERFORMANCE.md). Backends attach it with
/// [`TransferStatus::set_progress`]; [`TransferStatus::spin_for`] calls it between polls
/// ([`TransferStatus::wait_for`], which sleeps, does not). Turned off process-wide with
/// `MORI_IO_CALLER_PROGRESS=0` (then only the backend's threads complete transfers).
pub trait Progress: Send + Sync {
    /// Completes whatever already finished, without blocking (a step already running in
    /// another thread is skipped, not waited for). Returns true when it completed anything.
    fn progress(&self) -> bool;
}

/// The values [`parse_switch`] takes (any case).
pub const SWITCH_VALUES: &str = "1, 0, true, false, on, off, yes, no";

/// Name of the switch of waiter-driven completion.
pub const CALLER_PROGRESS_ENV: &str = "MORI_IO_CALLER_PROGRESS";

/// Whether waiters drive completions (`MORI_IO_CALLER_PROGRESS`: unset or `1`/`true`/`on`/
/// `yes` on, `0`/`false`/`off`/`no` off). Read once per process; any other value is
/// reported (WARN) and leaves it on.
pub fn caller_progress_enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| match std::env::var(CALLER_PROGRESS_ENV) {
        Err(_) => true,
        Ok(v) => parse_switch(&v).unwrap_or_else(|| {
            tracing::warn!("{CALLER_PROGRESS_ENV}={v:?} is not one of {SWITCH_VALUES}: left on");
            true
        }),
    })
}

/// `1`/`true`/`on`/`yes` → on, `0`/`false`/`off`/`no` → off (any case, trimmed), else `None`.
pub fn parse_switch(v: &str) -> Option<bool> {
    match v.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "on" | "yes" => Some(true),
        "0" | "false" | "off" | "no" => Some(false),
        _ => None,
    }
}

#[derive(Default)]
struct Failures {
    first: Option<IoError>,
    all: Vec<EntryFailure>,
}

/// Batch entries of a transfer that did not land, and why (see [`TransferStatus::failed_entries`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntryFailure {
    /// Ranges of indices into the caller's batch arrays (`local_offs`/`remote_offs`/`sizes`)
    /// of the entries that did not (completely) land, ascending; `None`: the whole batch (the
    /// failure came before any piece was queued, or the backend does not attribute it). An
    /// entry sharing a refused request with the bad one is named too: its bytes did not move.
    pub entries: Option<Vec<std::ops::Range<u32>>>,
    /// Why.
    pub error: IoError,
}

/// Shared completion state of a transfer that was split into `pieces` (one per connection,
/// QP or stream). Cloning shares the state.
///
/// - It is terminal only once every piece ended (completed, failed or was cancelled), so no
///   byte of the transfer can still move when a caller sees `Success` or `Failed`.
/// - It becomes `Success` when every piece completed without error, else `Failed` with the
///   first error recorded; [`TransferStatus::failed_entries`] lists every failed piece's
///   batch entries, [`TransferStatus::entry_landed`] answers per entry.
/// - [`TransferStatus::poll`] never blocks; [`TransferStatus::spin_for`] spin-polls (running
///   the backend's completion step, see [`Progress`]) and [`TransferStatus::wait_for`] blocks,
///   both with a deadline.
#[derive(Clone)]
pub struct TransferStatus {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for TransferStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TransferStatus").field("code", &self.code()).finish()
    }
}

/// The backend side of a [`TransferStatus`]: making one and recording its pieces. For
/// backend implementors (`use mori_io_core::status::Completion`); a caller of the engine only
/// reads statuses.
pub trait Completion {
    /// A status waiting for `pieces` completions. `pieces == 0` is already `Success`.
    fn new(pieces: u32) -> Self;
    /// Lets waiters of this status run `p` (the backend's completion step) while they spin.
    /// Held weakly: a status outliving its backend just stops driving. Only the first call
    /// takes effect; a no-op when `MORI_IO_CALLER_PROGRESS=0`.
    fn set_progress(&self, p: Weak<dyn Progress>);
    /// A status that already failed with `err`.
    fn failed(err: IoError) -> Self;
    /// Adds `n` more expected pieces to a status still in progress (used when a backend splits
    /// further after creation). No effect once the status is terminal.
    fn add_pieces(&self, n: u32);
    /// Records the end of one piece that carried the whole batch (or whose entries the backend
    /// does not track). The status turns terminal when the last piece ended: `Failed` with the
    /// first error when any piece failed.
    fn complete_piece(&self, r: Result<(), IoError>) {
        self.complete_entries(None, r)
    }
    /// Records the end of one piece carrying batch entries `entries` (see [`EntryFailure`]).
    fn complete_entries(&self, entries: Option<std::ops::Range<u32>>, r: Result<(), IoError>);
    /// Ends `n` pieces that will never run (their requests were never sent) with `err`, as
    /// `n` failed [`Completion::complete_piece`] calls.
    fn cancel_pieces(&self, n: u32, entries: Option<std::ops::Range<u32>>, err: IoError) {
        self.cancel_pieces_in(n, entries.into_iter().collect(), err)
    }
    /// Ends `n` failed pieces that carried the batch entries `ranges` (one [`EntryFailure`]
    /// each; none given: the whole batch).
    fn cancel_pieces_in(&self, n: u32, ranges: Vec<std::ops::Range<u32>>, err: IoError);
}

impl Completion for TransferStatus {
    fn new(pieces: u32) -> Self {
        TransferStatus {
            inner: Arc::new(Inner {
                state: AtomicU8::new(if pieces == 0 { SUCCESS } else { IN_PROGRESS }),
                pending: AtomicU32::new(pieces),
                error: Mutex::new(Failures::default()),
                waiters: AtomicU32::new(0),
                lock: Mutex::new(()),
                cv: Condvar::new(),
                driver: OnceLock::new(),
                hook: Mutex::new(None),
                has_hook: AtomicBool::new(false),
            }),
        }
    }

    fn set_progress(&self, p: Weak<dyn Progress>) {
        if caller_progress_enabled() {
            let _ = self.inner.driver.set(p);
        }
    }

    fn failed(err: IoError) -> Self {
        let s = Self::new(1);
        s.complete_piece(Err(err));
        s
    }

    fn add_pieces(&self, n: u32) {
        if self.inner.state.load(Ordering::Acquire) == IN_PROGRESS {
            self.inner.pending.fetch_add(n, Ordering::AcqRel);
        }
    }

    fn complete_entries(&self, entries: Option<std::ops::Range<u32>>, r: Result<(), IoError>) {
        match r {
            Ok(()) => self.end_pieces(1),
            Err(e) => self.cancel_pieces(1, entries, e),
        }
    }

    fn cancel_pieces_in(&self, n: u32, ranges: Vec<std::ops::Range<u32>>, err: IoError) {
        if n == 0 {
            return;
        }
        {
            let mut f = self.inner.error.lock();
            if self.inner.state.load(Ordering::Acquire) != IN_PROGRESS {
                return;
            }
            if f.first.is_none() {
                f.first = Some(err.clone());
            }
            // One record (one copy of the error) for all the pieces' ranges.
            f.all.push(EntryFailure { entries: (!ranges.is_empty()).then_some(ranges), error: err });
        }
        self.end_pieces(n);
    }
}

/// A [`TransferStatus`] held without keeping its state alive (see
/// [`TransferStatus::downgrade`]).
#[derive(Clone)]
pub struct WeakTransferStatus {
    inner: Weak<Inner>,
}

impl WeakTransferStatus {
    /// The status, while the caller or the backend still holds it.
    pub fn upgrade(&self) -> Option<TransferStatus> {
        self.inner.upgrade().map(|inner| TransferStatus { inner })
    }
}

impl TransferStatus {
    /// A handle that does not keep the status alive: once the caller and the backend dropped
    /// theirs, its state (error texts, entry lists) is freed and `upgrade` returns `None`.
    pub fn downgrade(&self) -> WeakTransferStatus {
        WeakTransferStatus { inner: Arc::downgrade(&self.inner) }
    }

    /// Ends `n` pieces; the last one makes the status terminal (`Failed` when an error was
    /// recorded, else `Success`).
    fn end_pieces(&self, n: u32) {
        let inner = &self.inner;
        let prev = inner.pending.fetch_sub(n, Ordering::AcqRel);
        if prev > n {
            return;
        }
        // The last piece: the error list is complete (every recording happens before its own
        // decrement), so the verdict reads it under the lock.
        let failed = inner.error.lock().first.is_some();
        let to = if failed { FAILED } else { SUCCESS };
        if inner.state.compare_exchange(IN_PROGRESS, to, Ordering::SeqCst, Ordering::SeqCst).is_ok() {
            self.wake();
            // SeqCst pairs with `on_done`: it stores the hook, sets the flag, then looks at the
            // state again; so either this thread sees the flag or `on_done` sees the end.
            if inner.has_hook.load(Ordering::SeqCst) {
                let hook = inner.hook.lock().take();
                if let Some(f) = hook {
                    f();
                }
            }
        }
    }

    /// Runs `f` once the status is terminal: on the thread that ends it (a backend's
    /// completion thread, or a waiter driving progress), or now on this thread when it already
    /// ended. `f` must be quick and must not block (hand work to another thread). At most one
    /// hook per status: a second call replaces a first that has not run yet.
    pub fn on_done(&self, f: impl FnOnce() + Send + 'static) {
        if self.is_done() {
            f();
            return;
        }
        *self.inner.hook.lock() = Some(Box::new(f));
        self.inner.has_hook.store(true, Ordering::SeqCst);
        // Ended meanwhile: the ending thread may have missed the flag. Whoever takes the hook
        // first runs it; the other finds `None`.
        if self.inner.state.load(Ordering::SeqCst) != IN_PROGRESS {
            let hook = self.inner.hook.lock().take();
            if let Some(f) = hook {
                f();
            }
        }
    }

    /// Runs the backend's completion step once when one is attached (see [`Progress`]), then
    /// reports whether the status is terminal. For callers that poll in their own loop (a
    /// Python `while st.InProgress()`): without it such a loop waits for the backend's thread.
    pub fn drive(&self) -> bool {
        if !self.is_done() {
            if let Some(p) = self.inner.driver.get().and_then(Weak::upgrade) {
                p.progress();
            }
        }
        self.is_done()
    }

    /// Lets waiters of this status drive `other`'s backend (for a status that ends after
    /// `other` does, e.g. a transfer's status that also waits for its notification).
    pub fn drive_like(&self, other: &TransferStatus) {
        if let Some(p) = other.inner.driver.get() {
            let _ = self.inner.driver.set(p.clone());
        }
    }

    fn wake(&self) {
        // SeqCst pairs with the SeqCst increment in `wait_for`: either the waiter sees the new
        // state before sleeping, or we see the waiter and notify under the lock.
        if self.inner.waiters.load(Ordering::SeqCst) > 0 {
            let _g = self.inner.lock.lock();
            self.inner.cv.notify_all();
        }
    }

    /// Current code: `InProgress`, `Success`, or the sticky error's code. Never blocks.
    pub fn code(&self) -> ErrorCode {
        match self.inner.state.load(Ordering::Acquire) {
            IN_PROGRESS => ErrorCode::InProgress,
            SUCCESS => ErrorCode::Success,
            _ => self.inner.error.lock().first.as_ref().map(|e| e.code).unwrap_or(ErrorCode::Transport),
        }
    }

    /// `None` while in progress, else the final result. Never blocks.
    pub fn poll(&self) -> Option<Result<(), IoError>> {
        match self.inner.state.load(Ordering::SeqCst) {
            IN_PROGRESS => None,
            SUCCESS => Some(Ok(())),
            _ => Some(Err(self.inner.error.lock().first.clone().unwrap_or_else(|| IoError::transport("failed without a recorded error")))),
        }
    }

    /// Once terminal: every failed piece's entries and error, in the order they were recorded
    /// (empty after `Success`); `None` while in progress. Entries named by no failure landed
    /// completely.
    pub fn failed_entries(&self) -> Option<Vec<EntryFailure>> {
        if !self.is_done() {
            return None;
        }
        Some(self.inner.error.lock().all.clone())
    }

    /// Once terminal: whether batch entry `i` (an index into the caller's arrays) landed
    /// completely; `None` while in progress. After `Failed`, an entry of a failure that names
    /// no entries (the whole batch) did not land.
    pub fn entry_landed(&self, i: usize) -> Option<bool> {
        if !self.is_done() {
            return None;
        }
        let f = self.inner.error.lock();
        let Ok(i) = u32::try_from(i) else { return Some(f.all.is_empty()) };
        Some(!f.all.iter().any(|x| x.entries.as_ref().is_none_or(|rs| rs.iter().any(|r| r.contains(&i)))))
    }

    /// True once `Success` or `Failed`.
    pub fn is_done(&self) -> bool {
        self.inner.state.load(Ordering::Acquire) != IN_PROGRESS
    }

    /// True once `Success`.
    pub fn succeeded(&self) -> bool {
        self.inner.state.load(Ordering::Acquire) == SUCCESS
    }

    /// Spin-polls (no sleeping, as nixlbench's `getXferStatus` loop does) until done or until
    /// `timeout` passes, running the backend's completion step itself between polls when the
    /// backend attached one ([`Progress`]). On expiry returns `Timeout`; the transfer itself
    /// stays in progress.
    pub fn spin_for(&self, timeout: Duration) -> Result<(), IoError> {
        let deadline = Instant::now() + timeout;
        // Held for the spin (a status outliving its backend just does not drive); taken once,
        // not per round.
        let mut driver = self.inner.driver.get().and_then(Weak::upgrade);
        let mut n: u32 = 0;
        loop {
            if let Some(r) = self.poll() {
                return r;
            }
            let drove = driver.as_ref().is_some_and(|p| p.progress());
            n = n.wrapping_add(1);
            // Every 64 rounds, whatever the completion step returned (a waiter that keeps
            // completing other transfers must still see its own deadline pass).
            if n.is_multiple_of(64) {
                if Instant::now() >= deadline {
                    return Err(self.timeout_error(timeout));
                }
                // A transfer posted by another thread (the engine's connector) may attach its
                // backend's step after this wait began.
                if driver.is_none() {
                    driver = self.inner.driver.get().and_then(Weak::upgrade);
                }
                // Give the transport's threads a chance on small machines; still a poll loop.
                std::thread::yield_now();
            } else if !drove {
                std::hint::spin_loop();
            }
        }
    }

    /// Blocks until done or until `timeout` passes (then `Timeout`; the transfer stays in
    /// progress and can be waited on again). Spins briefly first, then sleeps until the
    /// backend's thread completes it; never runs the backend's completion step itself (the
    /// blocking counterpart of [`TransferStatus::spin_for`], for `--poll_cq_mode event`).
    pub fn wait_for(&self, timeout: Duration) -> Result<(), IoError> {
        let deadline = Instant::now() + timeout;
        for _ in 0..256 {
            if let Some(r) = self.poll() {
                return r;
            }
            std::hint::spin_loop();
        }
        self.inner.waiters.fetch_add(1, Ordering::SeqCst);
        let mut g = self.inner.lock.lock();
        let r = loop {
            if let Some(r) = self.poll() {
                break r;
            }
            if self.inner.cv.wait_until(&mut g, deadline).timed_out() {
                break self.poll().unwrap_or_else(|| Err(self.timeout_error(timeout)));
            }
        };
        drop(g);
        self.inner.waiters.fetch_sub(1, Ordering::AcqRel);
        r
    }

    fn timeout_error(&self, timeout: Duration) -> IoError {
        IoError::timeout(format!(
            "transfer not complete after {:.3} s ({} piece(s) outstanding)",
            timeout.as_secs_f64(),
            self.inner.pending.load(Ordering::Acquire)
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn done_hook_runs_once_after_the_end_or_at_once_when_already_ended() {
        use std::sync::atomic::AtomicUsize;
        let n = Arc::new(AtomicUsize::new(0));
        let s = TransferStatus::new(2);
        let (n2, s2) = (n.clone(), s.clone());
        s.on_done(move || {
            assert!(s2.is_done(), "the hook sees the final state");
            n2.fetch_add(1, Ordering::SeqCst);
        });
        s.complete_piece(Ok(()));
        assert_eq!(n.load(Ordering::SeqCst), 0);
        s.complete_piece(Err(IoError::transport("x")));
        assert_eq!(n.load(Ordering::SeqCst), 1);
        s.complete_piece(Ok(()));
        assert_eq!(n.load(Ordering::SeqCst), 1, "once");
        let n3 = n.clone();
        TransferStatus::failed(IoError::transport("y")).on_done(move || {
            n3.fetch_add(10, Ordering::SeqCst);
        });
        assert_eq!(n.load(Ordering::SeqCst), 11, "an ended status runs the hook at once");
    }

    #[test]
    fn done_hook_runs_exactly_once_when_the_end_races_with_setting_it() {
        use std::sync::atomic::AtomicUsize;
        for _ in 0..2000 {
            let n = Arc::new(AtomicUsize::new(0));
            let s = TransferStatus::new(1);
            let s2 = s.clone();
            let ender = std::thread::spawn(move || s2.complete_piece(Ok(())));
            let n2 = n.clone();
            s.on_done(move || {
                n2.fetch_add(1, Ordering::SeqCst);
            });
            ender.join().unwrap();
            assert_eq!(n.load(Ordering::SeqCst), 1);
        }
    }

    #[test]
    fn pieces_then_success() {
        let s = TransferStatus::new(3);
        assert_eq!(s.code(), ErrorCode::InProgress);
        s.complete_piece(Ok(()));
        s.complete_piece(Ok(()));
        assert!(s.poll().is_none());
        s.complete_piece(Ok(()));
        assert_eq!(s.poll(), Some(Ok(())));
        assert!(TransferStatus::new(0).succeeded());
    }

    #[test]
    #[allow(clippy::single_range_in_vec_init)] // a list of one entry range each
    fn first_error_sticks_and_the_status_ends_with_the_last_piece() {
        let s = TransferStatus::new(3);
        s.complete_piece(Ok(()));
        s.complete_entries(Some(4..6), Err(IoError::not_found("first")));
        assert!(s.poll().is_none(), "a piece is still running: not terminal yet");
        assert_eq!(s.code(), ErrorCode::InProgress);
        assert_eq!(s.failed_entries(), None);
        assert_eq!(s.entry_landed(0), None);
        s.complete_entries(Some(9..10), Err(IoError::transport("second")));
        let e = s.poll().unwrap().unwrap_err();
        assert_eq!(e.code, ErrorCode::NotFound);
        assert_eq!(e.msg, "first");
        assert_eq!(s.code(), ErrorCode::NotFound);
        let f = s.failed_entries().unwrap();
        assert_eq!(f.iter().map(|x| x.entries.clone()).collect::<Vec<_>>(), vec![Some(vec![4..6]), Some(vec![9..10])]);
        assert_eq!(f[1].error.msg, "second");
        let landed: Vec<bool> = (0..11).map(|i| s.entry_landed(i).unwrap()).collect();
        assert_eq!(landed, [true, true, true, true, false, false, true, true, true, false, true]);
        // A completion past the end changes nothing.
        s.complete_piece(Ok(()));
        assert_eq!(s.code(), ErrorCode::NotFound);
    }

    #[test]
    fn cancelled_pieces_end_the_status_and_a_whole_batch_failure_names_every_entry() {
        let s = TransferStatus::new(1);
        s.add_pieces(3);
        s.complete_piece(Ok(()));
        s.cancel_pieces(2, None, IoError::bad_state("lane gone"));
        assert!(s.poll().is_none());
        s.complete_piece(Ok(()));
        assert_eq!(s.poll().unwrap().unwrap_err().msg, "lane gone");
        assert_eq!(s.entry_landed(0), Some(false));
        assert_eq!(s.entry_landed(usize::MAX), Some(false));
        let ok = TransferStatus::new(2);
        ok.complete_piece(Ok(()));
        ok.complete_piece(Ok(()));
        assert_eq!(ok.failed_entries(), Some(vec![]));
        assert_eq!(ok.entry_landed(7), Some(true));
        assert_eq!(TransferStatus::failed(IoError::invalid("x")).entry_landed(0), Some(false));
    }

    #[test]
    fn wait_for_times_out_then_completes() {
        let s = TransferStatus::new(1);
        let t = Instant::now();
        let e = s.wait_for(Duration::from_millis(50)).unwrap_err();
        assert_eq!(e.code, ErrorCode::Timeout);
        assert!(t.elapsed() >= Duration::from_millis(50));
        assert_eq!(s.spin_for(Duration::from_millis(5)).unwrap_err().code, ErrorCode::Timeout);
        let s2 = s.clone();
        let h = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            s2.complete_piece(Ok(()));
        });
        assert_eq!(s.wait_for(Duration::from_secs(5)), Ok(()));
        h.join().unwrap();
    }

    /// Completes `st` on its `after`-th call; counts calls.
    struct CountDown {
        st: TransferStatus,
        after: u32,
        calls: AtomicU32,
    }

    impl Progress for CountDown {
        fn progress(&self) -> bool {
            let n = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
            if n == self.after {
                self.st.complete_piece(Ok(()));
                return true;
            }
            false
        }
    }

    #[test]
    fn spinning_waiter_drives_completion_itself_and_a_sleeping_one_does_not() {
        // No other thread exists: only the waiter's own calls can complete the transfer.
        let s = TransferStatus::new(1);
        let p = Arc::new(CountDown { st: s.clone(), after: 100, calls: AtomicU32::new(0) });
        let weak: Weak<dyn Progress> = Arc::downgrade(&p) as Weak<dyn Progress>;
        s.set_progress(weak);
        assert_eq!(s.wait_for(Duration::from_millis(30)).unwrap_err().code, ErrorCode::Timeout);
        assert_eq!(p.calls.load(Ordering::SeqCst), 0, "wait_for leaves completion to the backend's thread");
        assert_eq!(s.spin_for(Duration::from_secs(5)), Ok(()));
        assert_eq!(p.calls.load(Ordering::SeqCst), 100, "the waiter stops driving once done");
    }

    #[test]
    fn dropped_driver_is_not_called_and_the_wait_times_out() {
        let s = TransferStatus::new(1);
        let p = Arc::new(CountDown { st: s.clone(), after: 1, calls: AtomicU32::new(0) });
        let weak: Weak<dyn Progress> = Arc::downgrade(&p) as Weak<dyn Progress>;
        drop(p);
        s.set_progress(weak);
        assert_eq!(s.spin_for(Duration::from_millis(20)).unwrap_err().code, ErrorCode::Timeout);
        assert!(s.poll().is_none());
    }

    /// Always reports progress, never completes anything.
    struct Busy;

    impl Progress for Busy {
        fn progress(&self) -> bool {
            true
        }
    }

    #[test]
    fn spin_for_expires_while_the_step_keeps_completing_others() {
        let s = TransferStatus::new(1);
        let p: Arc<dyn Progress> = Arc::new(Busy);
        s.set_progress(Arc::downgrade(&p));
        let t = Instant::now();
        assert_eq!(s.spin_for(Duration::from_millis(20)).unwrap_err().code, ErrorCode::Timeout);
        assert!(t.elapsed() < Duration::from_secs(2), "took {:?}", t.elapsed());
    }

    #[test]
    fn caller_progress_switch() {
        for (v, on) in [
            ("1", Some(true)),
            (" OFF ", Some(false)),
            ("0", Some(false)),
            ("no", Some(false)),
            ("False", Some(false)),
            ("yes", Some(true)),
            ("2", None),
            ("", None),
        ] {
            assert_eq!(parse_switch(v), on, "{v:?}");
        }
    }
}
