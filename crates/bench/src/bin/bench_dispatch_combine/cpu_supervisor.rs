//! The `--local` parent's supervisor of its child processes (`--device cpu`): ends the job
//! when a child fails before the bootstrap, gives the rest a grace period once the job ends,
//! kills them on SIGINT / SIGTERM, and removes the job's shared-memory windows.

use crate::args::Args;
use std::process::Child;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// "process 2 (EP ranks 4, 5)".
fn proc_name(p: usize, rpp: usize) -> String {
    mori_ep::host::process_names(&format!("rank {p}"), &|p| Some(p * rpp..(p + 1) * rpp))
}

/// Set by SIGINT / SIGTERM in the --local parent; its supervisor ends the job.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_interrupt(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

/// The --local parent's watch over its children (processes 1..P), from a thread of its own:
/// - a child that exits unsuccessfully before the bootstrap completed ends the job at once
///   (every other process would wait for it until the rendezvous deadline);
/// - after one fails (or this process's run failed or ended), the children still running get
///   `--timeout-ms` + 2 s to exit, then are killed, each named;
/// - SIGINT / SIGTERM kill every child at once;
/// - whenever the job ends, the job's shared-memory windows left in /dev/shm are removed.
///
/// When this process's own run cannot end (the job ended while it waits), the supervisor exits
/// the process (status 1, 130 when interrupted).
pub struct Supervisor {
    shared: Arc<Shared>,
    thread: Option<std::thread::JoinHandle<bool>>,
}

#[derive(Default)]
struct Shared {
    joined: AtomicBool,
    /// 0 running, 1 this process's run succeeded, 2 it failed.
    main: AtomicU8,
}

impl Supervisor {
    pub fn start(children: Vec<(usize, Child)>, a: &Args, job: Option<u64>) -> Supervisor {
        let shared = Arc::new(Shared::default());
        let grace = Duration::from_millis(a.timeout_ms).saturating_add(Duration::from_secs(2));
        let rpp = a.rpp();
        // SAFETY: the handler only stores to an atomic.
        unsafe {
            libc::signal(libc::SIGINT, on_interrupt as *const () as libc::sighandler_t);
            libc::signal(libc::SIGTERM, on_interrupt as *const () as libc::sighandler_t);
        }
        let sh = shared.clone();
        let thread = std::thread::spawn(move || watch(children, &sh, grace, rpp, job));
        Supervisor { shared, thread: Some(thread) }
    }

    /// This process joined the bootstrap (so did every child).
    pub fn joined(&self) {
        self.shared.joined.store(true, Ordering::SeqCst);
    }

    /// This process's run ended (`failed` or not): waits for the children (at most the grace,
    /// then kills them); true when every child exited successfully.
    pub fn finish(mut self, failed: bool) -> bool {
        self.shared.main.store(if failed { 2 } else { 1 }, Ordering::SeqCst);
        self.thread.take().is_some_and(|t| t.join().unwrap_or(false))
    }

    /// Ends the job before the bootstrap: kills the children, removes the windows and exits
    /// the process (status 1) after printing `why`.
    pub fn abort(mut self, why: &str) {
        crate::say(&format!("bench_dispatch_combine: error: {why}"));
        self.shared.main.store(2, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The supervisor thread; returns whether every child exited successfully.
fn watch(mut children: Vec<(usize, Child)>, sh: &Shared, grace: Duration, rpp: usize, job: Option<u64>) -> bool {
    let mut ok = true;
    // When the job started ending, and why.
    let mut ending: Option<(Instant, String)> = None;
    let end = |children: &mut Vec<(usize, Child)>, why: &str, code: Option<i32>| {
        for (i, c) in children.iter_mut() {
            let _ = c.kill();
            let _ = c.wait();
            crate::say(&format!("bench_dispatch_combine: killed {} (pid {}): {why}", proc_name(*i, rpp), c.id()));
        }
        children.clear();
        if let Some(job) = job {
            let gone = mori_ep::host::remove_job_windows(job);
            if !gone.is_empty() {
                crate::say(&format!(
                    "bench_dispatch_combine: removed {} window(s) the job left in /dev/shm: {}",
                    gone.len(),
                    gone.join(", ")
                ));
            }
        }
        if let Some(code) = code {
            std::process::exit(code);
        }
    };
    loop {
        if INTERRUPTED.load(Ordering::SeqCst) {
            end(&mut children, "interrupted (SIGINT or SIGTERM)", Some(130));
        }
        let mut still = Vec::with_capacity(children.len());
        for (i, mut c) in children.drain(..) {
            match c.try_wait() {
                Ok(None) => still.push((i, c)),
                Ok(Some(st)) if st.success() => {}
                Ok(Some(st)) => {
                    ok = false;
                    let before = if sh.joined.load(Ordering::SeqCst) { "" } else { " before the bootstrap completed" };
                    crate::say(&format!("bench_dispatch_combine: {} (pid {}) exited with {st}{before}", proc_name(i, rpp), c.id()));
                    ending.get_or_insert_with(|| (Instant::now(), format!("{} exited with {st}", proc_name(i, rpp))));
                }
                Err(e) => {
                    ok = false;
                    crate::say(&format!("bench_dispatch_combine: waiting for {} (pid {}): {e}", proc_name(i, rpp), c.id()));
                    still.push((i, c));
                    ending.get_or_insert_with(|| (Instant::now(), format!("waiting for {} failed", proc_name(i, rpp))));
                }
            }
        }
        children = still;
        let main = sh.main.load(Ordering::SeqCst);
        if main != 0 && ending.is_none() {
            let why = if main == 2 { "process 0's run failed" } else { "process 0's run ended" };
            ending = Some((Instant::now(), why.to_string()));
        }
        if children.is_empty() && main != 0 {
            end(&mut children, "", None);
            return ok;
        }
        if let Some((since, why)) = &ending {
            if !sh.joined.load(Ordering::SeqCst) {
                // Nobody can complete the bootstrap without the dead child.
                end(&mut children, &format!("{why} before the bootstrap completed"), Some(1));
            }
            if since.elapsed() >= grace {
                ok &= children.is_empty();
                let why = format!("still running {:.1} s after {why}", grace.as_secs_f64());
                end(&mut children, &why, if main == 0 { Some(1) } else { None });
                if main != 0 {
                    return ok;
                }
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}
