//! SocketBootstrap across OS processes on loopback. Children are this test binary
//! re-executed with `--exact child`; `MORI_BS_TEST_ROLE` selects what they do, and they get
//! rank / world / master through the MORI_* variables (so `from_env` is exercised too).

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use common::{check_collectives, free_master};
use mori_bootstrap::{Bootstrap, BootstrapError, SocketBootstrap};

const ROLE: &str = "MORI_BS_TEST_ROLE";

/// Child entry point; a no-op in the parent run.
#[test]
fn child() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    let bs = match SocketBootstrap::from_env() {
        Ok(bs) => bs,
        Err(e) => {
            println!("BS ERR {e}");
            std::process::exit(2);
        }
    };
    println!("BS READY {}", bs.rank());
    let code = match role.as_str() {
        "collectives" => match check_collectives(&bs) {
            Ok(()) => {
                println!("BS OK {}", bs.rank());
                0
            }
            Err(e) => {
                println!("BS FAIL {e}");
                1
            }
        },
        "victim" => {
            thread::sleep(Duration::from_secs(30));
            3
        }
        "survivor" => {
            // Wait for the parent's go (the victim is about to be killed mid-collective).
            let t = Instant::now();
            let res = bs.allgather(b"survivor");
            let took = t.elapsed().as_millis();
            match res {
                Err(BootstrapError::PeerLost { rank, .. }) => println!("BS LOST {rank} {took}"),
                Err(BootstrapError::Timeout { waiting_for, .. }) => {
                    println!("BS TIMEOUT {waiting_for:?} {took}")
                }
                other => println!("BS OTHER {other:?}"),
            }
            // Give the abort time to reach everyone before our sockets close.
            thread::sleep(Duration::from_millis(500));
            0
        }
        _ => 4,
    };
    std::process::exit(code);
}

struct Group {
    kids: Vec<Child>,
    lines: mpsc::Receiver<(usize, String)>,
}

fn spawn_group(roles: &[&str], extra: &[(&str, &str)]) -> Group {
    let exe = std::env::current_exe().expect("current_exe");
    let m = free_master();
    let (tx, lines) = mpsc::channel();
    let kids = roles
        .iter()
        .enumerate()
        .map(|(rank, role)| {
            let mut cmd = Command::new(&exe);
            cmd.args(["--exact", "child", "--nocapture", "--test-threads=1"])
                .env(ROLE, role)
                .env("MORI_RANK", rank.to_string())
                .env("MORI_WORLD_SIZE", roles.len().to_string())
                .env("MORI_MASTER_ADDR", m.ip().to_string())
                .env("MORI_MASTER_PORT", m.port().to_string())
                .env("MORI_BOOTSTRAP_TIMEOUT", "10")
                .env_remove("MORI_SOCKET_IFNAME")
                .stdout(Stdio::piped());
            for (k, v) in extra {
                cmd.env(k, v);
            }
            let mut kid = cmd.spawn().expect("spawn child");
            let out = kid.stdout.take().expect("piped stdout");
            let tx = tx.clone();
            thread::spawn(move || {
                for line in BufReader::new(out).lines().map_while(Result::ok) {
                    // libtest prints "test child ... " without a newline before our output.
                    if let Some(i) = line.find("BS ") {
                        let _ = tx.send((rank, line[i + 3..].to_string()));
                    }
                }
            });
            kid
        })
        .collect();
    Group { kids, lines }
}

impl Group {
    /// Collects `count` tagged lines, failing the test after `limit`.
    fn expect_lines(&self, count: usize, limit: Duration) -> Vec<(usize, String)> {
        let deadline = Instant::now() + limit;
        let mut got = Vec::new();
        while got.len() < count {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) => got.push(l),
                Err(_) => panic!("only {got:?} after {limit:?}"),
            }
        }
        got
    }

    /// Waits for every child to exit (killing them all after `limit`); exit codes by rank.
    fn wait(&mut self, limit: Duration) -> Vec<Option<i32>> {
        let deadline = Instant::now() + limit;
        let mut codes = vec![None; self.kids.len()];
        let mut done = vec![false; self.kids.len()];
        while done.iter().any(|d| !d) && Instant::now() < deadline {
            for (i, k) in self.kids.iter_mut().enumerate() {
                if !done[i] {
                    if let Ok(Some(st)) = k.try_wait() {
                        codes[i] = st.code();
                        done[i] = true;
                    }
                }
            }
            thread::sleep(Duration::from_millis(20));
        }
        for (i, k) in self.kids.iter_mut().enumerate() {
            if !done[i] {
                let _ = k.kill();
                let _ = k.wait();
            }
        }
        assert!(done.iter().all(|d| *d), "children still running after {limit:?}: {done:?}");
        codes
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        for k in &mut self.kids {
            let _ = k.kill();
            let _ = k.wait();
        }
    }
}

#[test]
fn eight_processes_run_every_collective() {
    let mut g = spawn_group(&["collectives"; 8], &[]);
    let codes = g.wait(Duration::from_secs(20));
    let lines: Vec<(usize, String)> = g.lines.try_iter().collect();
    assert_eq!(codes, vec![Some(0); 8], "{lines:?}");
    for r in 0..8 {
        assert!(lines.contains(&(r, format!("OK {r}"))), "rank {r}: {lines:?}");
    }
}

#[test]
fn killed_peer_is_reported_by_everyone() {
    let mut g = spawn_group(&["survivor", "survivor", "victim", "survivor"], &[("MORI_BOOTSTRAP_OP_TIMEOUT", "10")]);
    let ready = g.expect_lines(4, Duration::from_secs(10));
    assert!(ready.iter().all(|(r, l)| l == &format!("READY {r}")), "{ready:?}");
    // Let the survivors enter allgather, then kill rank 2 in the middle of it.
    thread::sleep(Duration::from_millis(500));
    g.kids[2].kill().expect("kill victim");
    let killed_at = Instant::now();
    let outcome = g.expect_lines(3, Duration::from_secs(8));
    let after_kill = killed_at.elapsed();
    assert!(after_kill < Duration::from_secs(3), "survivors took {after_kill:?} after the kill (deadline 10 s)");
    for (r, l) in &outcome {
        assert!(l.starts_with("LOST 2 "), "rank {r}: {l}");
    }
    let codes = g.wait(Duration::from_secs(5));
    assert_eq!((codes[0], codes[1], codes[3]), (Some(0), Some(0), Some(0)));
}
