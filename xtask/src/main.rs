//! Project tasks, run as `cargo xtask <task>`.
//!
//! - `test`: installs what the tests need (as root, with apt), runs every workspace test,
//!   then the root-only network-namespace tests.
//! - `compare-tcp`: bench_engine against iperf3 and ucx_perftest on loopback, in one run,
//!   printing the ratios recorded in docs/PERFORMANCE.md.
//! - `softroce [--] CMD [ARGS...]`: runs CMD in a QEMU guest with SoftRoCE (rxe0); see softroce.rs.

mod compare;
mod softroce;
mod util;

use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let r = match args.first().map(String::as_str) {
        Some("test") => test(&args[1..]),
        Some("compare-tcp") => compare::run(&args[1..]),
        Some("softroce") => return softroce::main(&args[1..]),
        _ => {
            eprintln!("usage: cargo xtask <test | compare-tcp [--secs N] | softroce [--] CMD [ARGS...]>");
            return ExitCode::from(2);
        }
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Every test of the workspace, then the network-namespace tests (they need root and `ip`).
fn test(extra: &[String]) -> Result<(), String> {
    let root = util::is_root();
    if root {
        util::ensure_tools(&[("ip", "iproute2")])?;
    }
    let mut a = vec!["test", "--workspace"];
    a.extend(extra.iter().map(String::as_str));
    util::cargo(&a)?;
    if root {
        util::cargo(&["test", "-p", "mori-bench", "--test", "netns", "--", "--ignored", "--test-threads=1"])?;
    } else {
        println!("xtask: the network-namespace tests (crates/bench/tests/netns.rs) need root: NOT run");
    }
    Ok(())
}
