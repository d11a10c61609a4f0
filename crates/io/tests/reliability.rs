//! Multi-process fault tests of the tcp backend: the target engine runs in a child process
//! (this test binary, re-executed), which the tests stop (`SIGSTOP`) and kill (`SIGKILL`)
//! while transfers are in flight.
//!
//! How the child works: the parent runs `current_exe() helper_child_target_engine --exact
//! --nocapture --test-threads=1` with `MORI_TEST_CHILD=target`. That "test" then creates an
//! engine on 127.0.0.1 (port 0) with a tcp backend, registers a host buffer filled with
//! [`pattern`], prints one line `MORI_CHILD_READY <hex EngineDesc> <hex MemoryDesc>` and
//! serves until its stdin closes, its parent dies (`PR_SET_PDEATHSIG`) or [`CHILD_LIFETIME`]
//! passes. Every test holds its child in a [`ChildEngine`] guard that continues, kills and
//! reaps it on drop, so no process outlives a test, even a failing one.

use mori_io::{BackendConfig, EngineConfig, EngineDesc, ErrorCode, IoEngine, IoError, MemLoc, MemoryDesc, TcpConfig};
use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Environment variable selecting the child role; unset in a normal test run.
const ROLE_VAR: &str = "MORI_TEST_CHILD";
/// Length of the child's registered buffer, bytes.
const LEN_VAR: &str = "MORI_TEST_CHILD_LEN";
/// Pid of the parent, so the child can tell it was orphaned before it armed the death signal.
const PARENT_VAR: &str = "MORI_TEST_PARENT_PID";
/// Name of the child-entry test (must match the function name below).
const CHILD_ENTRY: &str = "helper_child_target_engine";
/// Prefix of the child's one line of output.
const READY: &str = "MORI_CHILD_READY";
/// Longest a child lives, whatever happens to its parent.
const CHILD_LIFETIME: Duration = Duration::from_secs(60);
/// How long the parent waits for the child's ready line.
const READY_TIMEOUT: Duration = Duration::from_secs(20);

const MIB: usize = 1 << 20;

/// Content of the child's buffer at byte `i` (not periodic over small strides, so a transfer
/// landing at the wrong offset shows).
fn pattern(i: usize) -> u8 {
    (i.wrapping_mul(31) ^ (i >> 9) ^ (i >> 17)) as u8
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok()).collect()
}

/// The child's ready line for an engine and region.
fn ready_line(desc: &EngineDesc, mem: &MemoryDesc) -> String {
    format!("{READY} {} {}", hex(&desc.pack()), hex(&mem.pack()))
}

/// Inverse of [`ready_line`]; `None` for any other line. The ready line may follow text on
/// the same line: the harness prints `test <name> ... ` before the test's own output.
fn parse_ready_line(line: &str) -> Option<(EngineDesc, MemoryDesc)> {
    let mut it = line[line.find(READY)?..].trim_end().split(' ');
    if it.next()? != READY {
        return None;
    }
    let d = EngineDesc::unpack(&unhex(it.next()?)?).ok()?;
    let m = MemoryDesc::unpack(&unhex(it.next()?)?).ok()?;
    if it.next().is_some() {
        return None;
    }
    Some((d, m))
}

/// Child-process entry point, not a test of its own. With `MORI_TEST_CHILD=target` it becomes
/// the target engine (see the module docs) and never returns normally. Without a role (every
/// ordinary run) it checks the line protocol the parent relies on: a real engine's
/// descriptors survive [`ready_line`] / [`parse_ready_line`] unchanged, also behind the
/// harness's own `test ... ` prefix, and malformed lines are not taken for a ready line.
#[test]
fn helper_child_target_engine() {
    match std::env::var(ROLE_VAR).ok().as_deref() {
        Some("target") => serve_as_target(),
        Some(other) => panic!("{ROLE_VAR}={other:?} is not a known child role"),
        None => {
            let eng = IoEngine::new("line-check", EngineConfig::new("127.0.0.1", 0).unwrap()).unwrap();
            let mut buf = vec![0u8; 4096];
            // SAFETY: `buf` outlives its registration: it is deregistered below, before it drops,
            // and no transfer ever uses it.
            let mem = unsafe { eng.register_memory(buf.as_mut_ptr(), buf.len(), MemLoc::Host { numa: None }) }.unwrap();
            let line = ready_line(eng.desc(), &mem);
            assert_eq!(parse_ready_line(&line), Some((eng.desc().clone(), mem.clone())));
            assert_eq!(parse_ready_line(&format!("{line}\n")), Some((eng.desc().clone(), mem.clone())));
            let after_harness = format!("test {CHILD_ENTRY} ... {line}");
            assert_eq!(parse_ready_line(&after_harness), Some((eng.desc().clone(), mem.clone())));
            assert_eq!(parse_ready_line("running 1 test"), None);
            assert_eq!(parse_ready_line(&format!("{READY} zz {}", hex(&mem.pack()))), None);
            assert_eq!(parse_ready_line(&format!("{line} extra")), None);
            eng.deregister_memory(&mem).unwrap();
        }
    }
}

/// Body of the child process: a real engine that serves until told to go.
fn serve_as_target() -> ! {
    // Die with the parent even while stopped (SIGKILL acts on stopped processes).
    // SAFETY: prctl(PR_SET_PDEATHSIG) takes a signal number and touches no memory of ours.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) };
    let parent: Option<i32> = std::env::var(PARENT_VAR).ok().and_then(|v| v.parse().ok());
    // SAFETY: getppid has no preconditions.
    if parent.is_some_and(|p| p != unsafe { libc::getppid() }) {
        std::process::exit(3); // the parent died before the death signal was armed
    }
    let len: usize = std::env::var(LEN_VAR).ok().and_then(|v| v.parse().ok()).unwrap_or(16 * MIB);
    let key = format!("reliability-target-{}", std::process::id());
    let eng = IoEngine::new(&key, EngineConfig::new("127.0.0.1", 0).unwrap()).unwrap();
    eng.create_backend(BackendConfig::Tcp(TcpConfig::from_env().unwrap())).unwrap();
    let mut buf: Vec<u8> = (0..len).map(pattern).collect();
    // SAFETY: `buf` is never moved, resized or dropped: this function ends the process with
    // `exit`, so the memory stays valid for as long as the engine's threads run.
    let mem = unsafe { eng.register_memory(buf.as_mut_ptr(), len, MemLoc::Host { numa: None }) }.unwrap();
    {
        let mut out = std::io::stdout().lock();
        writeln!(out, "{}", ready_line(eng.desc(), &mem)).unwrap();
        out.flush().unwrap();
    }
    // The parent holds our stdin open; end of file means it is done with us (or gone).
    std::thread::spawn(|| {
        let mut sink = [0u8; 64];
        let mut stdin = std::io::stdin();
        loop {
            match stdin.read(&mut sink) {
                Ok(0) | Err(_) => std::process::exit(0),
                Ok(_) => {}
            }
        }
    });
    let until = Instant::now() + CHILD_LIFETIME;
    while Instant::now() < until {
        std::thread::sleep(Duration::from_millis(100));
    }
    std::process::exit(0)
}

/// A child process running a target engine. Dropping it continues, kills and reaps the child.
struct ChildEngine {
    child: Child,
    stdin: Option<ChildStdin>,
    reaped: bool,
    desc: EngineDesc,
    mem: MemoryDesc,
}

impl ChildEngine {
    /// Starts a child engine with a `len`-byte buffer and waits for its descriptors.
    /// `env` is passed on (e.g. `MORI_IO_TCP_TIMEOUT_MS`).
    fn spawn(len: usize, env: &[(&str, &str)]) -> ChildEngine {
        let exe = std::env::current_exe().expect("path of the test binary");
        let mut cmd = Command::new(exe);
        cmd.args([CHILD_ENTRY, "--exact", "--nocapture", "--test-threads=1"])
            .env(ROLE_VAR, "target")
            .env(LEN_VAR, len.to_string())
            .env(PARENT_VAR, std::process::id().to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("spawn the child engine");
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().expect("child stdout is piped");
        // From here on, a panic kills and reaps the child through the guard's Drop.
        let placeholder = EngineDesc {
            key: String::new(),
            node_id: String::new(),
            hostname: String::new(),
            host: String::new(),
            port: 0,
            pid: 0,
            epoch: 0,
            secret: mori_io::Secret::NONE,
        };
        let placeholder_mem = MemoryDesc {
            engine_key: String::new(),
            engine_epoch: 0,
            id: 0,
            addr: 0,
            len: 0,
            loc: MemLoc::Host { numa: None },
            bus_id: None,
            handles: vec![],
        };
        let mut g = ChildEngine { child, stdin, reaped: false, desc: placeholder, mem: placeholder_mem };
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            // Reads every line (so the child never blocks on a full pipe) until end of file.
            let mut sent = false;
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if !sent {
                    if let Some(d) = parse_ready_line(&line) {
                        sent = tx.send(d).is_ok();
                    }
                }
            }
        });
        let t0 = Instant::now();
        match rx.recv_timeout(READY_TIMEOUT) {
            Ok((d, m)) => {
                g.desc = d;
                g.mem = m;
            }
            Err(e) => panic!(
                "child engine (pid {}) sent no ready line within {:?} ({e:?}; exit status so far: {:?})",
                g.pid(),
                t0.elapsed(),
                g.child.try_wait()
            ),
        }
        assert_eq!(g.desc.pid, g.child.id(), "the target engine runs in the child process");
        assert_eq!(g.mem.len, len as u64);
        g
    }

    fn pid(&self) -> libc::pid_t {
        self.child.id() as libc::pid_t
    }

    fn signal(&self, sig: libc::c_int) {
        assert!(!self.reaped, "signal to a reaped child");
        // SAFETY: kill takes plain integers. The pid is our own child, not yet reaped, so it
        // cannot have been reused by another process.
        let r = unsafe { libc::kill(self.pid(), sig) };
        assert_eq!(r, 0, "kill({}, {sig}): {}", self.pid(), std::io::Error::last_os_error());
    }

    /// Process state letter from `/proc/<pid>/stat` (`T` = stopped).
    fn state(&self) -> Option<char> {
        let s = std::fs::read_to_string(format!("/proc/{}/stat", self.pid())).ok()?;
        s.rsplit_once(") ")?.1.chars().next()
    }

    /// SIGSTOP, then waits until the kernel reports the child stopped.
    fn stop(&self) {
        self.signal(libc::SIGSTOP);
        let deadline = Instant::now() + Duration::from_secs(5);
        while self.state() != Some('T') {
            assert!(Instant::now() < deadline, "child {} not stopped after 5 s (state {:?})", self.pid(), self.state());
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// SIGKILL and reap. Its sockets are closed by the kernel once this returns.
    fn kill(&mut self) {
        if self.reaped {
            return;
        }
        // SAFETY: as in `signal`: our own, unreaped child.
        unsafe { libc::kill(self.pid(), libc::SIGKILL) };
        let _ = self.child.wait();
        self.reaped = true;
    }
}

impl Drop for ChildEngine {
    fn drop(&mut self) {
        if !self.reaped {
            // SAFETY: as in `signal`: our own, unreaped child. SIGCONT first is not needed for
            // SIGKILL, but leaves no stopped process behind should the kill be refused.
            unsafe { libc::kill(self.pid(), libc::SIGCONT) };
            self.kill();
        }
        self.stdin.take();
    }
}

/// The initiator engine in this process, with one registered buffer. Dropping it deregisters
/// the buffer first (which waits for lane threads still using it) and leaks the buffer
/// rather than free memory a lane thread might still touch.
struct Local {
    eng: IoEngine,
    mem: MemoryDesc,
    buf: Vec<u8>,
}

impl Local {
    fn new(key: &str, len: usize, tcp: TcpConfig, fill: impl Fn(usize) -> u8) -> Local {
        let eng = IoEngine::new(key, EngineConfig::new("127.0.0.1", 0).unwrap()).unwrap();
        eng.create_backend(BackendConfig::Tcp(tcp)).unwrap();
        let mut buf: Vec<u8> = (0..len).map(fill).collect();
        // SAFETY: `buf` is never resized and is freed only after a successful
        // `deregister_memory` (see `Drop`), which waits for every operation using it.
        let mem = unsafe { eng.register_memory(buf.as_mut_ptr(), len, MemLoc::Host { numa: None }) }.unwrap();
        Local { eng, mem, buf }
    }
}

impl Drop for Local {
    fn drop(&mut self) {
        if let Err(e) = self.eng.deregister_memory(&self.mem) {
            eprintln!("local buffer still in use at the end of the test ({e}); leaking it");
            std::mem::forget(std::mem::take(&mut self.buf));
        }
    }
}

fn tcp(lanes: usize, data_timeout: Duration) -> TcpConfig {
    TcpConfig { lanes, min_lane_bytes: 256 << 10, connect_timeout: Duration::from_secs(5), data_timeout }
}

/// True for the errors a transfer to a dead engine may end with: `RemoteDisconnect`, or
/// `Transport` for a refused connect (its listener is gone) or a reset.
fn is_dead_peer_error(e: &IoError) -> bool {
    e.code == ErrorCode::RemoteDisconnect || (e.code == ErrorCode::Transport && (e.msg.contains("refused") || e.msg.contains("reset")))
}

#[test]
fn sigstop_then_wait_for_times_out_then_kill_gives_remote_disconnect() {
    let data_timeout = Duration::from_secs(10);
    let local = Local::new("reliability-init-1", 8 * MIB, tcp(4, data_timeout), |i| (i * 7 + 1) as u8);
    let mut child = ChildEngine::spawn(16 * MIB, &[]);
    local.eng.register_remote_engine(child.desc.clone()).unwrap();
    let sess = local.eng.create_session(&local.mem, &child.mem).unwrap();
    let long = Duration::from_secs(15);

    // The child's memory holds its pattern: read 1 MiB at 3 MiB into local [4, 5) MiB.
    sess.read(4 * MIB as u64, 3 * MIB as u64, MIB as u64, local.eng.allocate_transfer_uid()).wait_for(long).unwrap();
    assert!((0..MIB).all(|i| local.buf[4 * MIB + i] == pattern(3 * MIB + i)), "child pattern read back");
    // 1 MiB write, verified by reading it back into local [2, 3) MiB.
    sess.write(0, 0, MIB as u64, local.eng.allocate_transfer_uid()).wait_for(long).unwrap();
    sess.read(2 * MIB as u64, 0, MIB as u64, local.eng.allocate_transfer_uid()).wait_for(long).unwrap();
    assert_eq!(&local.buf[2 * MIB..3 * MIB], &local.buf[..MIB], "written MiB read back");

    // Stopped target: the 4 MiB write cannot complete; wait_for gives up, the transfer goes on.
    child.stop();
    let st = sess.write(0, 4 * MIB as u64, 4 * MIB as u64, local.eng.allocate_transfer_uid());
    let t0 = Instant::now();
    let e = st.wait_for(Duration::from_millis(500)).unwrap_err();
    let waited = t0.elapsed();
    assert_eq!(e.code, ErrorCode::Timeout, "{e}");
    assert!(e.msg.contains("not complete after 0.500 s"), "{e}");
    assert!(waited >= Duration::from_millis(500) && waited < Duration::from_secs(3), "wait_for(500 ms) took {waited:?}");
    assert_eq!(st.code(), ErrorCode::InProgress, "a wait_for timeout leaves the transfer in progress");

    // Kill it: the same status ends with RemoteDisconnect, long before the data timeout.
    let t_kill = Instant::now();
    child.kill();
    let e = st.wait_for(data_timeout + Duration::from_secs(5)).unwrap_err();
    let took = t_kill.elapsed();
    assert!(st.is_done(), "status still in progress {took:?} after the kill: {e}");
    assert!(
        e.code == ErrorCode::RemoteDisconnect || (e.code == ErrorCode::Transport && e.msg.contains("reset")),
        "killed target: expected RemoteDisconnect, got {e}"
    );
    assert!(took < Duration::from_secs(3), "failure arrived {took:?} after the kill (data timeout {data_timeout:?})");
    assert_eq!(st.code(), e.code, "the first error sticks");

    // A new transfer to the dead engine fails at once, with no hang.
    let t1 = Instant::now();
    let e = sess.write(0, 0, MIB as u64, local.eng.allocate_transfer_uid()).wait_for(long).unwrap_err();
    assert!(is_dead_peer_error(&e), "transfer to a dead engine: {e}");
    assert!(t1.elapsed() < Duration::from_secs(5), "transfer to a dead engine took {:?}", t1.elapsed());
    // So does a one-shot read through the engine, and a new session (control-plane lookup).
    let t2 = Instant::now();
    let e = local.eng.read(&local.mem, 0, &child.mem, 0, 4096, local.eng.allocate_transfer_uid()).wait_for(long).unwrap_err();
    assert!(is_dead_peer_error(&e), "one-shot read from a dead engine: {e}");
    let e2 = local.eng.create_session(&local.mem, &child.mem).err().expect("session to a dead engine");
    assert!(is_dead_peer_error(&e2), "session to a dead engine: {e2}");
    eprintln!("dead engine: one-shot read: {e}; new session: {e2}");
    assert!(t2.elapsed() < Duration::from_secs(5), "calls to a dead engine took {:?}", t2.elapsed());
}

#[test]
fn target_killed_mid_stream_ends_with_remote_disconnect() {
    let data_timeout = Duration::from_secs(5);
    let local = Local::new("reliability-init-2", 8 * MIB, tcp(4, data_timeout), |i| (i * 11 + 3) as u8);
    let mut child = ChildEngine::spawn(8 * MIB, &[]);
    local.eng.register_remote_engine(child.desc.clone()).unwrap();
    let sess = local.eng.create_session(&local.mem, &child.mem).unwrap();

    let pid = child.pid();
    // A scoped thread: it is joined before the scope ends, even after a panic, so the guard
    // (dropped later) reaps the child only after the killer is done with its pid.
    let (ok, err, posted_at, failed_at, killed_at) = std::thread::scope(|s| {
        let killer = s.spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            let at = Instant::now();
            // SAFETY: kill takes plain integers; the child is not reaped before this scoped
            // thread is joined, so the pid is still our child's.
            let r = unsafe { libc::kill(pid, libc::SIGKILL) };
            (r, at)
        });
        let start = Instant::now();
        let mut ok = 0u32;
        let (err, posted_at) = loop {
            assert!(start.elapsed() < Duration::from_secs(15), "{ok} writes succeeded and none failed 15 s after the start");
            let posted_at = Instant::now();
            let st = sess.write(0, 0, 8 * MIB as u64, local.eng.allocate_transfer_uid());
            match st.wait_for(Duration::from_secs(15)) {
                Ok(()) => ok += 1,
                Err(e) => {
                    assert!(st.is_done(), "write still in progress after 15 s: {e}");
                    break (e, posted_at);
                }
            }
        };
        let failed_at = Instant::now();
        let (r, killed_at) = killer.join().unwrap();
        assert_eq!(r, 0, "kill(SIGKILL) of the child failed");
        (ok, err, posted_at, failed_at, killed_at)
    });
    child.kill(); // reap

    assert!(ok >= 1, "no 8 MiB write completed in the 300 ms before the kill");
    assert_eq!(err.code, ErrorCode::RemoteDisconnect, "write to a target killed mid-stream: {err}");
    let since_kill = failed_at.saturating_duration_since(killed_at);
    let since_post = failed_at - posted_at;
    assert!(
        since_kill < Duration::from_secs(2) && since_post < Duration::from_secs(3),
        "failure {since_kill:?} after the kill, {since_post:?} after the post (data timeout {data_timeout:?})"
    );
    eprintln!("{ok} writes of 8 MiB before the kill; failure {since_kill:?} after it: {err}");

    // The next transfer fails quickly too.
    let t = Instant::now();
    let e = sess.write(0, 0, 8 * MIB as u64, local.eng.allocate_transfer_uid()).wait_for(Duration::from_secs(15)).unwrap_err();
    assert!(is_dead_peer_error(&e), "transfer after the kill: {e}");
    assert!(t.elapsed() < Duration::from_secs(3), "transfer after the kill took {:?}", t.elapsed());
}

#[test]
fn stopped_target_hits_the_data_deadline() {
    let data_timeout = Duration::from_secs(1);
    let len = 64 * MIB;
    let local = Local::new("reliability-init-3", len, tcp(4, data_timeout), |i| i as u8);
    let child = ChildEngine::spawn(len, &[]);
    local.eng.register_remote_engine(child.desc.clone()).unwrap();
    let sess = local.eng.create_session(&local.mem, &child.mem).unwrap();
    // Connections work before the stop.
    sess.write(0, 0, MIB as u64, local.eng.allocate_transfer_uid()).wait_for(Duration::from_secs(15)).unwrap();

    child.stop();
    let t0 = Instant::now();
    let st = sess.write(0, 0, len as u64, local.eng.allocate_transfer_uid());
    // Far longer than the data timeout: the status must fail by itself, not by this wait.
    let r = st.wait_for(Duration::from_secs(15));
    let took = t0.elapsed();
    let e = r.unwrap_err();
    assert!(st.is_done(), "64 MiB write to a stopped target still in progress after {took:?}: {e}");
    assert_eq!(e.code, ErrorCode::Timeout, "{e}");
    // The deadline is per socket call (SO_SNDTIMEO): Linux returns a partial send only when
    // it expires, so each call that still moved a few bytes (buffers filling, the stopped
    // receiver's queue being compacted) costs one full deadline; then one call makes no
    // progress at all and fails. Seen: 2 or 3 deadlines. A hang would exceed the bound.
    assert!(
        took >= data_timeout.mul_f32(0.9) && took <= data_timeout * 4 + Duration::from_millis(500),
        "failed after {took:?}, data timeout {data_timeout:?}"
    );
    // The message says what timed out: the tcp data path, toward which engine, after what deadline.
    assert!(e.msg.contains("tcp"), "{e}");
    assert!(e.msg.contains(&child.desc.key), "message names the peer engine: {e}");
    assert!(e.msg.contains("data timeout"), "message names the deadline: {e}");
    eprintln!("stopped target: failed after {took:?}: {e}");
}
