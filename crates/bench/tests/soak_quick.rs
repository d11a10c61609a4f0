//! The `soak` driver end to end in its quick mode (the counts `cargo xtask soak --quick` uses,
//! here in the test profile): tcp transfers and reconnect cycles on loopback, bad flags, the
//! time limit. The full counts run with `cargo xtask soak` (docs/PERFORMANCE.md, "Soak").

use std::process::Command;

fn soak(args: &[&str]) -> (Option<i32>, String) {
    let o = Command::new(env!("CARGO_BIN_EXE_soak")).args(args).output().expect("run the soak driver");
    let out = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    (o.status.code(), out)
}

#[test]
fn quick_tcp_transfers_pass_with_every_status_popped() {
    let (rc, out) =
        soak(&["--phase", "tcp-transfers", "--count", "2000", "--samples", "4", "--tolerance-pct", "50", "--time-limit-s", "120"]);
    assert_eq!(rc, Some(0), "{out}");
    assert!(out.contains("target popped 2000 Ok, 0 failed, 0 missing"), "{out}");
    assert!(out.contains("soak tcp-transfers: PASS"), "{out}");
}

#[test]
fn quick_reconnect_cycles_pass() {
    let (rc, out) = soak(&["--phase", "reconnect", "--count", "20", "--samples", "4", "--tolerance-pct", "50", "--time-limit-s", "120"]);
    assert_eq!(rc, Some(0), "{out}");
    assert!(out.contains("20 cycles (10 fresh engines, 10 re-registrations of the target)"), "{out}");
    assert!(out.contains("soak reconnect: PASS"), "{out}");
}

#[test]
fn bad_flags_are_refused_naming_flag_and_limit() {
    let (rc, out) = soak(&["--phase", "reconnect", "--count", "0"]);
    assert_eq!(rc, Some(2), "{out}");
    assert!(out.contains("--count (phase reconnect) 0: allowed 1..=10000000"), "{out}");
    let (rc, out) = soak(&["--phase", "rdma-burst", "--qps", "65"]);
    assert_eq!(rc, Some(2), "{out}");
    assert!(out.contains("--qps 65: allowed 1..=64"), "{out}");
    let (rc, out) = soak(&[]);
    assert_eq!(rc, Some(2), "{out}");
    assert!(out.contains("--phase is required"), "{out}");
}

#[test]
fn the_time_limit_stops_the_phase_naming_the_flag() {
    let (rc, out) = soak(&["--phase", "tcp-transfers", "--count", "100000000", "--samples", "2", "--time-limit-s", "1"]);
    assert_eq!(rc, Some(1), "{out}");
    assert!(out.contains("time limit of 1 s (--time-limit-s) reached"), "{out}");
}
