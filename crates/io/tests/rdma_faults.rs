//! Fault tests of the rdma backend with the target engine in another process: the peer is
//! killed mid-transfer, the send queue stays full toward a dead peer, the peer deregisters the
//! region being written. They need an RDMA device with an active port: `cargo xtask test` runs
//! them (`--ignored --test-threads=1`) inside the SoftRoCE guest, where both engines use
//! separate RC QPs on the one rxe device.
//!
//! The target is this test binary run again: the parent starts `current_exe()
//! helper_child_rdma_target --exact --ignored --nocapture --test-threads=1` with
//! `MORI_RDMA_FAULTS_ROLE=target`. The child opens an engine with an rdma backend
//! (`RdmaConfig::from_env()`), registers a patterned host buffer, prints
//! `MORI_RDMA_CHILD_READY <hex EngineDesc> <hex MemoryDesc>`, then obeys one command per stdin
//! line (`dereg`: deregister the buffer and print `MORI_RDMA_CHILD_DEREGISTERED`). It exits
//! when its stdin closes, when its parent dies (`PR_SET_PDEATHSIG`), or after
//! [`CHILD_LIFETIME`]. Each test keeps its child in a [`TargetChild`], whose drop kills and
//! reaps it, so no process outlives a test, failing or not.
//!
//! Timing: the QPs use `timeout` 14 (4.096 us x 2^14 = 67 ms per try) and a `retry_cnt` of at
//! most 7, so a dead responder is detected after at most 8 unanswered tries, nominally 0.54 s;
//! the IB specification lets a port stretch each try up to 4x (2.1 s in all). [`DETECT_BOUND`]
//! is that worst case plus a wide margin for the emulated guest (TCG) and the completion
//! thread. Beware: rxe (the kernel's `rxe_comp.c`) never decrements a `retry_cnt` of 7, i.e.
//! retries forever, so on SoftRoCE a QP set up with 7 never reports a dead peer.

use mori_io::{
    BackendConfig, EngineConfig, EngineDesc, ErrorCode, IoEngine, IoError, MemLoc, MemoryDesc, RdmaConfig, Session, TransferStatus,
};
use std::io::{BufRead, BufReader, Write};
use std::process::{ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const ROLE_VAR: &str = "MORI_RDMA_FAULTS_ROLE";
const LEN_VAR: &str = "MORI_RDMA_FAULTS_LEN";
const PARENT_VAR: &str = "MORI_RDMA_FAULTS_PARENT";
/// The child's entry point (the name of the test function below).
const CHILD_ENTRY: &str = "helper_child_rdma_target";
const READY: &str = "MORI_RDMA_CHILD_READY";
const DEREGISTERED: &str = "MORI_RDMA_CHILD_DEREGISTERED";
const FAILED: &str = "MORI_RDMA_CHILD_FAILED";
/// Longest a child lives, whatever happens to its parent.
const CHILD_LIFETIME: Duration = Duration::from_secs(90);
/// How long the parent waits for a line from the child (device open and MR registration are
/// slow under TCG, but not this slow).
const LINE_TIMEOUT: Duration = Duration::from_secs(30);
/// Bound on detecting a dead RC peer: 8 tries x 67 ms x 4 (spec slack) = 2.1 s, times 7 for
/// the emulated guest (seen on rxe under TCG: 0.54 s). A hang (no error completion at all)
/// shows as exceeding it.
const DETECT_BOUND: Duration = Duration::from_secs(15);
/// What a missing error completion means.
const HANG: &str = "no error completion for WRs to a dead peer: the QP keeps retrying (rxe retries forever when the QP's retry_cnt is 7)";
/// Bound on a call that fails on the control plane (a dead engine's listener refuses at once).
const CONTROL_BOUND: Duration = Duration::from_secs(5);

const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;

fn pattern(i: usize) -> u8 {
    (i.wrapping_mul(131) ^ (i >> 11)) as u8
}

fn to_hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn from_hex(s: &str) -> Option<Vec<u8>> {
    let raw = s.as_bytes();
    if !raw.len().is_multiple_of(2) {
        return None;
    }
    raw.chunks(2).map(|p| u8::from_str_radix(std::str::from_utf8(p).ok()?, 16).ok()).collect()
}

/// `READY <engine> <memory>`; may follow the harness's `test name ... ` on the same line.
fn parse_ready(line: &str) -> Option<(EngineDesc, MemoryDesc)> {
    let words: Vec<&str> = line[line.find(READY)?..].split_whitespace().collect();
    match words.as_slice() {
        [READY, e, m] => Some((EngineDesc::unpack(&from_hex(e)?).ok()?, MemoryDesc::unpack(&from_hex(m)?).ok()?)),
        _ => None,
    }
}

/// The child's entry point; not a test of its own. Without a role (the ordinary `--ignored`
/// run) it checks the ready-line encoding on an engine without a backend.
#[test]
#[ignore = "needs an RDMA device: run by cargo xtask test inside the SoftRoCE guest"]
fn helper_child_rdma_target() {
    match std::env::var(ROLE_VAR).ok().as_deref() {
        Some("target") => child_main(),
        Some(r) => panic!("{ROLE_VAR}={r:?}: unknown role"),
        None => {
            let eng = IoEngine::new("rdma-faults-line", EngineConfig::new("127.0.0.1", 0).unwrap()).unwrap();
            let mut buf = vec![0u8; 64];
            // SAFETY: `buf` outlives the registration (deregistered below) and is never used
            // by a transfer.
            let mem = unsafe { eng.register_memory(buf.as_mut_ptr(), buf.len(), MemLoc::Host { numa: None }) }.unwrap();
            let line = format!("test {CHILD_ENTRY} ... {READY} {} {}", to_hex(&eng.desc().pack()), to_hex(&mem.pack()));
            assert_eq!(parse_ready(&line), Some((eng.desc().clone(), mem.clone())));
            assert_eq!(parse_ready(&format!("{line} trailing")), None);
            assert_eq!(parse_ready(&format!("{READY} 0g {}", to_hex(&mem.pack()))), None);
            eng.deregister_memory(&mem).unwrap();
        }
    }
}

fn child_say(line: &str) {
    let mut out = std::io::stdout().lock();
    // The parent reads until end of file; if it is gone there is nobody to tell.
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// The target engine process. Never returns.
fn child_main() -> ! {
    // SAFETY: prctl(PR_SET_PDEATHSIG) takes a signal number and touches no memory of ours.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) };
    let parent: Option<i32> = std::env::var(PARENT_VAR).ok().and_then(|v| v.parse().ok());
    // SAFETY: getppid has no preconditions.
    if parent.is_some_and(|p| p != unsafe { libc::getppid() }) {
        std::process::exit(3); // orphaned before the death signal was armed
    }
    std::thread::spawn(|| {
        std::thread::sleep(CHILD_LIFETIME);
        std::process::exit(0)
    });
    let fail = |what: &str, e: IoError| -> ! {
        child_say(&format!("{FAILED} {what}: {e}"));
        std::process::exit(4)
    };
    let len: usize = std::env::var(LEN_VAR).ok().and_then(|v| v.parse().ok()).unwrap_or(4 * MIB);
    let key = format!("rdma-faults-target-{}", std::process::id());
    let eng = match EngineConfig::new("127.0.0.1", 0).and_then(|c| IoEngine::new(&key, c)) {
        Ok(e) => e,
        Err(e) => fail("engine", e),
    };
    if let Err(e) = RdmaConfig::from_env().and_then(|c| eng.create_backend(BackendConfig::Rdma(c))) {
        fail("rdma backend", e);
    }
    let mut buf: Vec<u8> = (0..len).map(pattern).collect();
    // SAFETY: `buf` is never moved, resized or freed: the process ends with `exit`.
    let mem = match unsafe { eng.register_memory(buf.as_mut_ptr(), len, MemLoc::Host { numa: None }) } {
        Ok(m) => m,
        Err(e) => fail("register", e),
    };
    child_say(&format!("{READY} {} {}", to_hex(&eng.desc().pack()), to_hex(&mem.pack())));
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        match line.trim() {
            "dereg" => match eng.deregister_memory(&mem) {
                Ok(()) => child_say(DEREGISTERED),
                Err(e) => fail("dereg", e),
            },
            other => child_say(&format!("{FAILED} unknown command {other:?}")),
        }
    }
    std::mem::forget(buf);
    std::process::exit(0)
}

/// A child process running a target engine; dropping it kills and reaps it.
struct TargetChild {
    proc: std::process::Child,
    reaped: bool,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
    desc: EngineDesc,
    mem: MemoryDesc,
}

/// Kills and reaps a child that has no [`TargetChild`] yet (panics while it starts up).
struct StartGuard(Option<std::process::Child>);

impl Drop for StartGuard {
    fn drop(&mut self) {
        if let Some(c) = self.0.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl TargetChild {
    fn spawn(len: usize) -> TargetChild {
        let exe = std::env::current_exe().expect("path of this test binary");
        let mut proc = Command::new(exe)
            .args([CHILD_ENTRY, "--exact", "--ignored", "--nocapture", "--test-threads=1"])
            .env(ROLE_VAR, "target")
            .env(LEN_VAR, len.to_string())
            .env(PARENT_VAR, std::process::id().to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the child engine");
        let stdin = proc.stdin.take();
        let stdout = proc.stdout.take().expect("piped stdout");
        let mut guard = StartGuard(Some(proc));
        let (tx, lines) = mpsc::channel();
        // Drains the child's stdout to the end, so the child never blocks on a full pipe.
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let _ = tx.send(line);
            }
        });
        let line = wait_line(&lines, READY, "the ready line");
        let (desc, mem) = parse_ready(&line).unwrap_or_else(|| panic!("malformed ready line {line:?}"));
        let proc = guard.0.take().expect("guard holds the child");
        assert_eq!(desc.pid, proc.id(), "the target engine runs in the child");
        assert_eq!(mem.len, len as u64);
        TargetChild { proc, reaped: false, stdin, lines, desc, mem }
    }

    /// Sends one command line to the child and waits for the line containing `answer`.
    fn command(&mut self, cmd: &str, answer: &str) {
        let stdin = self.stdin.as_mut().expect("child stdin");
        writeln!(stdin, "{cmd}").and_then(|_| stdin.flush()).expect("write to the child");
        wait_line(&self.lines, answer, cmd);
    }

    /// SIGKILL and reap: once this returns the kernel has destroyed the child's QPs and
    /// closed its sockets.
    fn kill(&mut self) {
        if !self.reaped {
            let _ = self.proc.kill(); // SIGKILL
            let _ = self.proc.wait();
            self.reaped = true;
        }
    }
}

impl Drop for TargetChild {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The next line from the child containing `want`; panics on a failure line, end of output
/// or [`LINE_TIMEOUT`].
fn wait_line(lines: &mpsc::Receiver<String>, want: &str, what: &str) -> String {
    let deadline = Instant::now() + LINE_TIMEOUT;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match lines.recv_timeout(left) {
            Ok(l) if l.contains(want) => return l,
            Ok(l) if l.contains(FAILED) => panic!("child engine failed waiting for {what}: {l}"),
            Ok(_) => {}
            Err(e) => panic!("no {what} from the child engine within {LINE_TIMEOUT:?} ({e:?})"),
        }
    }
}

/// The initiator engine with one registered buffer. Drop deregisters the buffer, or leaks it
/// when operations still hold it.
struct Local {
    eng: IoEngine,
    mem: MemoryDesc,
    buf: Vec<u8>,
}

impl Local {
    fn new(key: &str, len: usize, cfg: RdmaConfig) -> Local {
        let eng = IoEngine::new(key, EngineConfig::new("127.0.0.1", 0).unwrap()).unwrap();
        eng.create_backend(BackendConfig::Rdma(cfg)).unwrap();
        let mut buf: Vec<u8> = (0..len).map(|i| (i * 7 + 3) as u8).collect();
        // SAFETY: `buf` is never resized and freed only after a successful deregistration
        // (see Drop), which waits for the operations using it.
        let mem = unsafe { eng.register_memory(buf.as_mut_ptr(), len, MemLoc::Host { numa: None }) }.unwrap();
        Local { eng, mem, buf }
    }

    fn session_to(&self, child: &TargetChild) -> Session {
        self.eng.register_remote_engine(child.desc.clone()).unwrap();
        self.eng.create_session(&self.mem, &child.mem).unwrap()
    }

    fn id(&self) -> u64 {
        self.eng.allocate_transfer_uid()
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

/// `n` entries of `each` bytes: contiguous locally, a gap of `each` between them remotely (no
/// two entries merge into one WR).
fn scattered(n: usize, each: usize) -> (Vec<u64>, Vec<u64>, Vec<u64>) {
    let lo = (0..n).map(|i| (i * each) as u64).collect();
    let ro = (0..n).map(|i| (2 * i * each) as u64).collect();
    (lo, ro, vec![each as u64; n])
}

/// Waits up to `bound` for `st`; returns the error and when it arrived. Panics when the
/// transfer succeeds or is still in progress (a hang).
fn expect_failure(st: &TransferStatus, bound: Duration, what: &str) -> (IoError, Instant) {
    match st.wait_for(bound) {
        Ok(()) => panic!("{what}: succeeded"),
        Err(e) => {
            assert!(st.is_done(), "{what}: still in progress after {bound:?}: {HANG}: {e}");
            (e, Instant::now())
        }
    }
}

/// An error of a transfer whose QP lost its peer: retry exceeded (`RemoteDisconnect`) or a
/// flushed work request (`Transport`), naming the engine and giving the hint. When the
/// connection was already marked broken (e.g. the previous transfer's completion notification
/// met the dead peer), the transfer fails earlier, reconnecting over the control plane: that
/// is accepted too, as a dead-engine control error.
fn assert_dead_peer_completion(e: &IoError, peer: &str) {
    if e.msg.contains("control") {
        return assert_dead_engine_control(e, peer);
    }
    assert!(e.msg.contains(peer), "the error names engine {peer:?}: {e}");
    match e.code {
        ErrorCode::RemoteDisconnect => {
            assert!(e.msg.contains("retry counter exceeded") && e.msg.contains("peer is unreachable or gone"), "hint: {e}");
            assert!(e.msg.contains("MORI_IB_GID_INDEX"), "hint names the GID index knob: {e}");
        }
        ErrorCode::Transport => assert!(e.msg.contains("flushed"), "hint: {e}"),
        c => panic!("peer gone: expected RemoteDisconnect or Transport, got {c:?}: {e}"),
    }
}

/// An error of a call that reached for a dead engine over the control plane (reconnect).
fn assert_dead_engine_control(e: &IoError, peer: &str) {
    assert!(matches!(e.code, ErrorCode::RemoteDisconnect | ErrorCode::Transport), "dead engine: {e}");
    assert!(e.msg.contains(peer), "the error names engine {peer:?}: {e}");
}

#[test]
#[ignore = "needs an RDMA device: run by cargo xtask test inside the SoftRoCE guest"]
fn peer_killed_mid_transfer_fails_within_the_retry_bound() {
    let local = Local::new("rdma-faults-init-1", 4 * MIB, RdmaConfig::from_env().unwrap());
    let mut child = TargetChild::spawn(4 * MIB);
    let peer = child.desc.key.clone();
    let sess = local.session_to(&child);
    let (lo, ro, sz) = scattered(16, 64 * KIB); // 1 MiB per batch
    let mut ok = 0u32;
    let mut killed_at: Option<Instant> = None;
    let (err, failed_at, posted_at) = loop {
        if let Some(k) = killed_at {
            assert!(k.elapsed() < DETECT_BOUND, "{ok} batches succeeded and none failed {DETECT_BOUND:?} after the kill");
        }
        let posted_at = Instant::now();
        let st = sess.batch_write(&lo, &ro, &sz, local.id());
        if ok == 3 && killed_at.is_none() {
            // The fourth batch races the kill (1 MiB takes tens of ms on rxe under TCG): it, or
            // the first batch posted after it, meets the dead peer.
            killed_at = Some(Instant::now());
            child.kill();
        }
        match st.wait_for(DETECT_BOUND) {
            Ok(()) => ok += 1,
            Err(e) => {
                assert!(st.is_done(), "batch still in progress {:?} after its post: {HANG}: {e}", posted_at.elapsed());
                break (e, Instant::now(), posted_at);
            }
        }
    };
    let killed_at = killed_at.expect("no batch failed before the kill");
    assert_dead_peer_completion(&err, &peer);
    let since_kill = failed_at - killed_at;
    let since_post = failed_at - posted_at;
    eprintln!(
        "peer killed: {ok} batches of 1 MiB ok ({} after the kill); failure {since_kill:?} after the kill, {since_post:?} after its post: {err}",
        ok - 3
    );
    assert!(since_kill < DETECT_BOUND, "dead peer detected {since_kill:?} after the kill (bound {DETECT_BOUND:?})");

    // The next transfer must reconnect (the QPs failed) and the dead engine's control
    // listener is gone: it fails at once on the control plane.
    let t = Instant::now();
    let (e, _) = expect_failure(&sess.batch_write(&lo, &ro, &sz, local.id()), DETECT_BOUND, "write after the failure");
    eprintln!("next transfer: failed after {:?}: {e}", t.elapsed());
    assert_dead_engine_control(&e, &peer);
    assert!(t.elapsed() < CONTROL_BOUND, "transfer to a dead engine took {:?}", t.elapsed());
    // So does a new session (control-plane lookup of the region).
    let t = Instant::now();
    let e = local.eng.create_session(&local.mem, &child.mem).err().expect("a session to a dead engine");
    assert_dead_engine_control(&e, &peer);
    assert!(t.elapsed() < CONTROL_BOUND, "session to a dead engine took {:?}", t.elapsed());
}

#[test]
#[ignore = "needs an RDMA device: run by cargo xtask test inside the SoftRoCE guest"]
fn full_send_queue_toward_a_dead_peer_times_out_with_the_documented_error() {
    let sq_timeout = Duration::from_millis(200);
    let cfg = RdmaConfig { max_send_wr: 2, sq_timeout, chunking: false, qps_per_transfer: 1, ..RdmaConfig::from_env().unwrap() };
    let local = Local::new("rdma-faults-init-2", MIB, cfg);
    let mut child = TargetChild::spawn(2 * MIB);
    let peer = child.desc.key.clone();
    let sess = local.session_to(&child);
    // Two scattered entries are two WRs: exactly the send queue. Works while the peer lives.
    let (lo2, ro2, sz2) = scattered(2, 4 * KIB);
    sess.batch_write(&lo2, &ro2, &sz2, local.id()).wait_for(DETECT_BOUND).unwrap();
    // Let the completion notification (a SEND on the same QP) leave the queue too.
    std::thread::sleep(Duration::from_millis(300));

    child.kill();
    // Fill the queue: these WRs stay outstanding while the QP retries (about 0.5 s).
    let t_fill = Instant::now();
    let fill = sess.batch_write(&lo2, &ro2, &sz2, local.id());
    assert!(!fill.is_done(), "filling batch finished at once: {:?}", fill.poll());
    // Large scattered batches: no room for their first WRs; each fails by itself, either with
    // the send-queue Timeout (the QP still retrying) or, once the QP failed, with the
    // connection error (reconnecting to a dead engine).
    let (lo, ro, sz) = scattered(64, 4 * KIB);
    let mut timeouts = Vec::new();
    let last = loop {
        assert!(
            t_fill.elapsed() < DETECT_BOUND,
            "{} send-queue timeouts and no connection error after {DETECT_BOUND:?}: {HANG}",
            timeouts.len()
        );
        let t = Instant::now();
        let (e, at) = expect_failure(&sess.batch_write(&lo, &ro, &sz, local.id()), DETECT_BOUND, "large batch");
        let took = at - t;
        if e.code != ErrorCode::Timeout {
            break e;
        }
        assert!(e.msg.contains("send queue") && e.msg.contains("MORI_IO_SQ_BACKOFF_TIMEOUT_US"), "{e}");
        assert!(e.msg.contains(&peer), "the error names engine {peer:?}: {e}");
        assert!(took >= sq_timeout.mul_f32(0.95) && took < sq_timeout + Duration::from_secs(3), "SQ timeout after {took:?}");
        if timeouts.len() < 3 {
            eprintln!("send queue full: batch failed after {took:?} ({:?} after the fill): {e}", t_fill.elapsed());
        }
        timeouts.push(took);
    };
    eprintln!("after {} send-queue timeouts, {:?} after the fill: {last}", timeouts.len(), t_fill.elapsed());
    // Either the QP's failure seen by admission, or the reconnect to the dead engine.
    let failed_earlier = last.code == ErrorCode::Transport && last.msg.contains("failed earlier") && last.msg.contains(&peer);
    assert!(failed_earlier || matches!(last.code, ErrorCode::Transport | ErrorCode::RemoteDisconnect), "{last}");
    if !failed_earlier {
        assert_dead_engine_control(&last, &peer);
    }
    // The filling batch itself ended with the retry-exceeded completion.
    let (e, at) = expect_failure(&fill, DETECT_BOUND, "filling batch");
    assert_dead_peer_completion(&e, &peer);
    eprintln!("filling batch: failed {:?} after its post: {e}", at - t_fill);
    // With the QP retrying for about 0.5 s and a 200 ms admission deadline, the first large
    // batch always meets a full queue.
    assert!(!timeouts.is_empty(), "no large batch saw the send-queue Timeout; first error: {last}");
}

#[test]
#[ignore = "needs an RDMA device: run by cargo xtask test inside the SoftRoCE guest"]
fn write_to_a_region_the_peer_deregistered_is_a_remote_access_error() {
    let local = Local::new("rdma-faults-init-3", MIB, RdmaConfig { qps_per_transfer: 2, ..RdmaConfig::from_env().unwrap() });
    let mut child = TargetChild::spawn(MIB);
    let peer = child.desc.key.clone();
    let sess = local.session_to(&child);
    // Registered: a read brings back the child's pattern.
    sess.read(0, 4096, 64 * KIB as u64, local.id()).wait_for(DETECT_BOUND).unwrap();
    assert!((0..64 * KIB).all(|i| local.buf[i] == pattern(4096 + i)), "child pattern read back");

    child.command("dereg", DEREGISTERED);
    for attempt in ["first", "after reconnecting"] {
        let t = Instant::now();
        let (e, at) = expect_failure(&sess.write(0, 0, 64 * KIB as u64, local.id()), DETECT_BOUND, "write to a deregistered region");
        eprintln!("deregistered region, {attempt} write: failed after {:?}: {e}", at - t);
        assert_eq!(e.code, ErrorCode::InvalidArgs, "{e}");
        assert!(e.msg.contains("remote access error") && e.msg.contains(&peer), "{e}");
    }
    // The control plane knows the region is gone.
    let e = local.eng.create_session(&local.mem, &child.mem).err().expect("a session to a deregistered region");
    assert_eq!(e.code, ErrorCode::NotFound, "{e}");
}

#[test]
#[ignore = "needs an RDMA device: run by cargo xtask test inside the SoftRoCE guest"]
fn a_batch_with_an_entry_outside_the_peers_region_names_it_and_the_rest_is_accounted_for() {
    // Entry 0 lies past the end of the child's region (a descriptor claiming more than was
    // registered: only the target NIC can tell); entries 1..=32 are valid, 4 KiB each, apart
    // (no merging), spread over 4 QPs. The QP that carries entry 0 fails (remote access
    // error) and flushes the rest of its WRs; the other QPs land theirs.
    let local = Local::new("rdma-faults-init-4", MIB, RdmaConfig { qps_per_transfer: 4, ..RdmaConfig::from_env().unwrap() });
    let child = TargetChild::spawn(MIB);
    local.eng.register_remote_engine(child.desc.clone()).unwrap();
    let mut forged = child.mem.clone();
    forged.len += 64 * KIB as u64;
    let mut lo = vec![0u64];
    let mut ro = vec![MIB as u64];
    for i in 1..=32u64 {
        lo.push(i * 8 * KIB as u64);
        ro.push(i * 8 * KIB as u64);
    }
    let sizes = vec![4 * KIB as u64; lo.len()];
    let st = local.eng.batch_write(&local.mem, &lo, &forged, &ro, &sizes, local.id());
    let (e, _) = expect_failure(&st, DETECT_BOUND, "batch with an entry past the region");
    eprintln!("batch with entry 0 past the region: {e}");
    assert_eq!(e.code, ErrorCode::InvalidArgs, "{e}");
    assert!(e.msg.contains("remote access error"), "{e}");
    let failed = st.failed_entries().unwrap();
    eprintln!("failed entry ranges: {:?}", failed.iter().map(|f| f.entries.clone()).collect::<Vec<_>>());
    assert!(failed.iter().all(|f| f.entries.is_some()), "every failed chunk is attributed to entries: {failed:?}");
    assert_eq!(st.entry_landed(0), Some(false));
    assert!(
        failed.iter().any(|f| f.error.msg.contains("batch entr") && f.entries.as_ref().is_some_and(|rs| rs.iter().any(|r| r.contains(&0)))),
        "{failed:?}"
    );
    // Entries reported landed are at the target: read them back on a fresh connection.
    let landed: Vec<usize> = (1..lo.len()).filter(|&i| st.entry_landed(i) == Some(true)).collect();
    eprintln!("entries landed: {} of 32", landed.len());
    assert!(!landed.is_empty(), "the QPs not carrying entry 0 land their entries");
    let sess = local.eng.create_session(&local.mem, &child.mem).unwrap();
    let back = MIB / 2;
    for &i in &landed {
        sess.read(back as u64, ro[i], 4 * KIB as u64, local.id()).wait_for(DETECT_BOUND).unwrap();
        let want: Vec<u8> = (0..4 * KIB).map(|k| (lo[i] as usize + k).wrapping_mul(7).wrapping_add(3) as u8).collect();
        assert!(local.buf[back..back + 4 * KIB] == want[..], "entry {i} is reported landed but its bytes are not at the target");
    }
}
