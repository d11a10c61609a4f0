//! The target engine in a child process (this executable run again with `--role target`),
//! and the parent's handle on it.
//!
//! The child opens engine [`TARGET_KEY`] on 127.0.0.1 with the tcp backend, registers one
//! buffer, prints `SOAK_TARGET_READY <hex EngineDesc> <hex MemoryDesc>` and then obeys one
//! command per stdin line:
//!
//! - `popseq KEY FIRST LAST GAP_MS`: the popper thread pops the inbound statuses of transfers
//!   FIRST..=LAST from engine KEY in order, waiting up to GAP_MS for each, and prints
//!   `SOAK_POPSEQ <ok> <failed> <missing> <first problem or ->` when done.
//! - `pop KEY ID OFF LEN HASH WAIT_MS`: waits up to WAIT_MS for the inbound status of
//!   transfer ID from KEY, then checks that bytes OFF..OFF+LEN of the buffer hash to HASH
//!   ([`fnv1a`]); prints `SOAK_POP ok`, `SOAK_POP missing`, `SOAK_POP err <error>` or
//!   `SOAK_POP mismatch <hash>`.
//!
//! It exits when its stdin closes, when its parent dies (`PR_SET_PDEATHSIG`), or after its
//! lifetime (`--lifetime-s`), whichever comes first; [`TargetProc`]'s drop kills and reaps it.

use mori_io::{BackendConfig, EngineConfig, EngineDesc, IoEngine, MemLoc, MemoryDesc, TcpConfig};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The child engine's key.
pub const TARGET_KEY: &str = "soak-target";
const READY: &str = "SOAK_TARGET_READY";
const FAILED: &str = "SOAK_TARGET_FAILED";
/// Prefix of the `popseq` answer.
pub const POPSEQ: &str = "SOAK_POPSEQ";
/// Prefix of the `pop` answer.
pub const POP: &str = "SOAK_POP";

/// FNV-1a over `b` (the `pop` command's byte check).
pub fn fnv1a(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &x| (h ^ x as u64).wrapping_mul(0x100_0000_01b3))
}

fn to_hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn from_hex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len()).step_by(2).map(|i| s.get(i..i + 2).and_then(|p| u8::from_str_radix(p, 16).ok())).collect()
}

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    // The parent reads to the end; if it is gone there is nobody to tell.
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// The child's main: never returns. `len` bytes of registered buffer, `parent` the pid that
/// must be our parent, `lifetime` the longest we live.
pub fn child_main(len: usize, lanes: usize, parent: u32, lifetime: Duration) -> ! {
    // SAFETY: prctl(PR_SET_PDEATHSIG) takes a signal number and touches no memory of ours.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) };
    // SAFETY: getppid has no preconditions.
    if unsafe { libc::getppid() } as u32 != parent {
        std::process::exit(3); // orphaned before the death signal was armed
    }
    std::thread::spawn(move || {
        std::thread::sleep(lifetime);
        say(&format!("{FAILED} lifetime of {} s is over", lifetime.as_secs()));
        std::process::exit(5)
    });
    let fail = |what: &str, e: &dyn std::fmt::Display| -> ! {
        say(&format!("{FAILED} {what}: {e}"));
        std::process::exit(4)
    };
    let eng = match EngineConfig::new("127.0.0.1", 0).and_then(|c| IoEngine::new(TARGET_KEY, c)) {
        Ok(e) => e,
        Err(e) => fail("engine", &e),
    };
    if let Err(e) = TcpConfig::from_env().and_then(|c| eng.create_backend(BackendConfig::Tcp(TcpConfig { lanes, ..c }))) {
        fail("tcp backend", &e);
    }
    // Leaked: lives as long as the process, which ends with `exit` (no deregistration race).
    let buf: &'static mut [u8] = Box::leak(vec![0u8; len].into_boxed_slice());
    let (ptr, blen) = (buf.as_mut_ptr(), buf.len());
    // SAFETY: the buffer is leaked, so it stays valid for the life of the process.
    let mem = match unsafe { eng.register_memory(ptr, blen, MemLoc::Host { numa: None }) } {
        Ok(m) => m,
        Err(e) => fail("register", &e),
    };
    let eng: &'static IoEngine = Box::leak(Box::new(eng));
    // The popper runs `popseq` jobs; started before the ready line and kept until the end, so
    // the thread count is the same in every sample the parent takes.
    let (jobs, rx) = mpsc::channel::<(String, u64, u64, Duration)>();
    std::thread::spawn(move || {
        for (key, first, last, gap) in rx {
            popseq(eng, &key, first, last, gap);
        }
    });
    say(&format!("{READY} {} {}", to_hex(&eng.desc().pack()), to_hex(&mem.pack())));
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        let w: Vec<&str> = line.split_whitespace().collect();
        match w.as_slice() {
            ["popseq", key, first, last, gap] => {
                let (Ok(first), Ok(last), Ok(gap)) = (first.parse::<u64>(), last.parse::<u64>(), gap.parse::<u64>()) else {
                    fail("popseq", &format!("bad arguments {line:?}"));
                };
                if jobs.send((key.to_string(), first, last, Duration::from_millis(gap))).is_err() {
                    fail("popseq", &"the popper thread is gone");
                }
            }
            ["pop", key, id, off, n, hash, wait] => {
                let parsed = (id.parse::<u64>(), off.parse::<usize>(), n.parse::<usize>(), hash.parse::<u64>(), wait.parse::<u64>());
                let (Ok(id), Ok(off), Ok(n), Ok(hash), Ok(wait)) = parsed else {
                    fail("pop", &format!("bad arguments {line:?}"));
                };
                let deadline = Instant::now() + Duration::from_millis(wait);
                let r = loop {
                    if let Some(r) = eng.pop_inbound_status(key, id) {
                        break Some(r);
                    }
                    if Instant::now() >= deadline {
                        break None;
                    }
                    std::thread::sleep(Duration::from_micros(200));
                };
                match r {
                    None => say(&format!("{POP} missing")),
                    Some(Err(e)) => say(&format!("{POP} err {e}")),
                    Some(Ok(())) => {
                        // SAFETY: reading the leaked buffer; the transfer that wrote it ended
                        // (its status was popped) and the parent posts nothing else meanwhile.
                        let got = match off.checked_add(n).filter(|&e| e <= blen) {
                            Some(_) => fnv1a(unsafe { std::slice::from_raw_parts(ptr.add(off), n) }),
                            None => fail("pop", &format!("range {off}+{n} beyond the buffer of {blen}")),
                        };
                        if got == hash {
                            say(&format!("{POP} ok"));
                        } else {
                            say(&format!("{POP} mismatch {got}"));
                        }
                    }
                }
            }
            _ => say(&format!("{FAILED} unknown command {line:?}")),
        }
    }
    std::process::exit(0)
}

/// Pops FIRST..=LAST in order; a status not there within `gap` of the previous one counts
/// as missing.
fn popseq(eng: &IoEngine, key: &str, first: u64, last: u64, gap: Duration) {
    let (mut ok, mut failed, mut missing) = (0u64, 0u64, 0u64);
    let mut problem: Option<String> = None;
    for id in first..=last {
        let deadline = Instant::now() + gap;
        let mut idle = 0u32;
        loop {
            match eng.pop_inbound_status(key, id) {
                Some(Ok(())) => ok += 1,
                Some(Err(e)) => {
                    failed += 1;
                    problem.get_or_insert_with(|| format!("transfer {id}: {e}"));
                }
                None if Instant::now() >= deadline => {
                    missing += 1;
                    problem.get_or_insert_with(|| format!("transfer {id}: no inbound status within {} ms", gap.as_millis()));
                }
                None => {
                    // Ahead of the initiator: yield first, then sleep a little (two cores are
                    // shared with the initiator and the engines' threads).
                    idle += 1;
                    if idle < 16 {
                        std::thread::yield_now();
                    } else {
                        std::thread::sleep(Duration::from_micros(50));
                    }
                    continue;
                }
            }
            break;
        }
    }
    let p = problem.unwrap_or_else(|| "-".into());
    say(&format!("{POPSEQ} {ok} {failed} {missing} {p}"));
}

/// The child process and its output, before and after its ready line; dropping it kills
/// and reaps the child.
struct Link {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
}

impl Link {
    fn wait_line(&mut self, prefix: &str, timeout: Duration) -> Result<String, String> {
        let deadline = Instant::now() + timeout;
        loop {
            match self.lines.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(l) if l.starts_with(prefix) => return Ok(l),
                Ok(l) if l.starts_with(FAILED) => return Err(format!("the target process failed: {l}")),
                Ok(l) => eprintln!("soak: target said: {l}"),
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    return Err(format!("no {prefix} line from the target within {:.1} s", timeout.as_secs_f64()))
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    let st = self.child.try_wait().ok().flatten().map(|s| s.to_string()).unwrap_or_else(|| "still running".into());
                    return Err(format!("the target closed its output waiting for {prefix} (process: {st})"));
                }
            }
        }
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        drop(self.stdin.take());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The parent's handle on a running child target; dropping it kills and reaps the child.
pub struct TargetProc {
    link: Link,
    /// The child engine's descriptor.
    pub desc: EngineDesc,
    /// The child's registered buffer.
    pub mem: MemoryDesc,
}

impl TargetProc {
    /// Starts the child with a buffer of `len` bytes and a tcp backend of `lanes`
    /// connections, living at most `lifetime`, and waits up to `startup` for its ready line.
    pub fn spawn(len: usize, lanes: usize, lifetime: Duration, startup: Duration) -> Result<TargetProc, String> {
        let exe = std::env::current_exe().map_err(|e| format!("cannot find own executable to start the target: {e}"))?;
        let mut child = Command::new(exe)
            .args(["--role", "target", "--target-len", &len.to_string(), "--lanes", &lanes.to_string()])
            .args(["--parent-pid", &std::process::id().to_string(), "--lifetime-s", &lifetime.as_secs().max(1).to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("cannot start the target process: {e}"))?;
        let stdin = child.stdin.take();
        let stdout = child.stdout.take();
        let (tx, lines) = mpsc::channel();
        let mut link = Link { child, stdin, lines };
        let stdout = stdout.ok_or("the target's stdout was not piped")?;
        // Drains the child's stdout to its end, so the child never blocks on a full pipe.
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let line = link.wait_line(READY, startup)?;
        let w: Vec<&str> = line.split_whitespace().collect();
        let parsed = match w.as_slice() {
            [READY, e, m] => {
                from_hex(e).and_then(|e| EngineDesc::unpack(&e).ok()).zip(from_hex(m).and_then(|m| MemoryDesc::unpack(&m).ok()))
            }
            _ => None,
        };
        let (desc, mem) = parsed.ok_or_else(|| format!("malformed ready line from the target: {line:?}"))?;
        if desc.pid != link.child.id() {
            return Err(format!("the target's engine runs in pid {}, the child is {}", desc.pid, link.child.id()));
        }
        Ok(TargetProc { link, desc, mem })
    }

    /// The child's pid (for sampling its resources).
    pub fn pid(&self) -> u32 {
        self.link.child.id()
    }

    /// Sends one command line.
    pub fn send(&mut self, cmd: &str) -> Result<(), String> {
        let stdin = self.link.stdin.as_mut().ok_or("the target's stdin is closed")?;
        writeln!(stdin, "{cmd}").and_then(|_| stdin.flush()).map_err(|e| format!("writing {cmd:?} to the target: {e}"))
    }

    /// The next line starting with `prefix`, within `timeout`; a failure line, the end of the
    /// child's output or the timeout is an error.
    pub fn wait_line(&mut self, prefix: &str, timeout: Duration) -> Result<String, String> {
        self.link.wait_line(prefix, timeout)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trip_and_refusals() {
        assert_eq!(from_hex(&to_hex(&[0, 1, 0xab, 0xff])), Some(vec![0, 1, 0xab, 0xff]));
        assert_eq!(from_hex("abc"), None);
        assert_eq!(from_hex("zz"), None);
        assert_eq!(from_hex("é0"), None, "non-ASCII is refused, not sliced mid-character");
    }

    #[test]
    fn fnv_known_value() {
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
    }
}
