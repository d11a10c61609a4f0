//! [`TransferStatus`]: the completion handle of one posted transfer.

use crate::error::{ErrorCode, IoError};
use parking_lot::{Condvar, Mutex};
use std::sync::atomic::{AtomicU32, AtomicU8, Ordering};
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
    error: Mutex<Option<IoError>>,
    waiters: AtomicU32,
    lock: Mutex<()>,
    cv: Condvar,
    /// The backend's completion step, run by a waiting thread itself (see [`Progress`]).
    driver: OnceLock<Weak<dyn Progress>>,
}

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

/// Shared completion state of a transfer that was split into `pieces` (one per connection,
/// QP or stream). Cloning shares the state.
///
/// - It becomes `Success` when every piece completed without error.
/// - The first error sticks: the status turns `Failed` at once with that error, and later
///   pieces (successful or not) change nothing.
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
    /// Records the completion of one piece. The first `Err` makes the status `Failed` (sticky).
    fn complete_piece(&self, r: Result<(), IoError>);
}

impl Completion for TransferStatus {
    fn new(pieces: u32) -> Self {
        TransferStatus {
            inner: Arc::new(Inner {
                state: AtomicU8::new(if pieces == 0 { SUCCESS } else { IN_PROGRESS }),
                pending: AtomicU32::new(pieces),
                error: Mutex::new(None),
                waiters: AtomicU32::new(0),
                lock: Mutex::new(()),
                cv: Condvar::new(),
                driver: OnceLock::new(),
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

    fn complete_piece(&self, r: Result<(), IoError>) {
        let inner = &self.inner;
        match r {
            Err(e) => {
                let mut slot = inner.error.lock();
                if inner.state.load(Ordering::Acquire) == IN_PROGRESS {
                    *slot = Some(e);
                    inner.state.store(FAILED, Ordering::SeqCst);
                    drop(slot);
                    self.wake();
                }
            }
            Ok(()) => {
                let prev = inner.pending.fetch_sub(1, Ordering::AcqRel);
                if prev == 1 && inner.state.compare_exchange(IN_PROGRESS, SUCCESS, Ordering::SeqCst, Ordering::SeqCst).is_ok() {
                    self.wake();
                }
            }
        }
    }
}

impl TransferStatus {
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
            _ => self.inner.error.lock().as_ref().map(|e| e.code).unwrap_or(ErrorCode::Transport),
        }
    }

    /// `None` while in progress, else the final result. Never blocks.
    pub fn poll(&self) -> Option<Result<(), IoError>> {
        match self.inner.state.load(Ordering::SeqCst) {
            IN_PROGRESS => None,
            SUCCESS => Some(Ok(())),
            _ => Some(Err(self.inner.error.lock().clone().unwrap_or_else(|| IoError::transport("failed without a recorded error")))),
        }
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
        let driver = self.inner.driver.get().and_then(Weak::upgrade);
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
    fn first_error_sticks() {
        let s = TransferStatus::new(3);
        s.complete_piece(Ok(()));
        s.complete_piece(Err(IoError::not_found("first")));
        s.complete_piece(Err(IoError::transport("second")));
        s.complete_piece(Ok(()));
        let e = s.poll().unwrap().unwrap_err();
        assert_eq!(e.code, ErrorCode::NotFound);
        assert_eq!(e.msg, "first");
        assert_eq!(s.code(), ErrorCode::NotFound);
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
