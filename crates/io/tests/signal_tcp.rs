//! Signalled writes on the tcp backend with 8 lanes, every batch striped over them (64 bytes
//! per lane at least): 10 000 writes whose counters a checker on the target watches, then the
//! error cases.

mod conformance;

use conformance::*;
use mori_io::{BackendConfig, TcpConfig};
use std::time::Duration;

fn tcp8() -> BackendConfig {
    BackendConfig::Tcp(TcpConfig { lanes: 8, min_lane_bytes: 64, ..TcpConfig::default() })
}

#[test]
fn signalled_writes_tcp_8_lanes() {
    let n = 10_000;
    let (c, took) = signalled_writes(&tcp8, n, 512, Duration::from_secs(120));
    println!(
        "tcp, 8 lanes: {n} signalled writes in {:.3} s ({:.0} per s); checker verified {} ({} while writes were still being posted), {} mismatches",
        took.as_secs_f64(),
        n as f64 / took.as_secs_f64(),
        c.verified,
        c.verified_while_writing,
        c.mismatches
    );
    let plain = plain_writes(&tcp8, n, 512);
    println!(
        "tcp, 8 lanes: the same {n} writes without signals in {:.3} s ({:.0} per s)",
        plain.as_secs_f64(),
        n as f64 / plain.as_secs_f64()
    );
}

#[test]
fn signal_errors_tcp() {
    signal_errors(&tcp8, &["target engine refused", "exceeds region"]);
}

#[test]
fn planned_writes_stripe_and_stay_apart() {
    let (plan, bytes) = plan_writes(10_000);
    assert_eq!(plan.len(), 10_000);
    assert!(plan.iter().all(|p| (1..=8).contains(&p.sizes.len()) && p.sizes.iter().all(|&s| s > 0)));
    let totals: Vec<u64> = plan.iter().map(|p| p.sizes.iter().sum()).collect();
    assert_eq!(totals.iter().min(), Some(&1));
    assert_eq!(totals.iter().max(), Some(&65536));
    assert!(plan.windows(2).all(|w| w[0].slot.1 <= w[1].slot.0), "slots disjoint, in order");
    assert_eq!(plan.last().unwrap().slot.1 as usize, bytes);
    println!(
        "10 000 planned writes: {} bytes of data, {} entries",
        totals.iter().sum::<u64>(),
        plan.iter().map(|p| p.sizes.len()).sum::<usize>()
    );
}
