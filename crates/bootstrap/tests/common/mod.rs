//! Shared helpers for the socket integration tests.
#![allow(dead_code)]

use std::net::{SocketAddr, TcpListener};
use std::time::Duration;

use mori_bootstrap::{Bootstrap, SocketBootstrapConfig};

/// A loopback address with a port that was free a moment ago.
pub fn free_master() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
    l.local_addr().expect("local_addr")
}

pub fn cfg(rank: usize, world: usize, master: SocketAddr, budget: Duration, op: Duration) -> SocketBootstrapConfig {
    SocketBootstrapConfig::new(rank, world, master).with_timeouts(budget, op)
}

/// Rank-dependent allgather payload: rank 0 empty, the others of different lengths,
/// rank 5 large enough (300 KB) to need several non-blocking writes.
pub fn gather_payload(rank: usize) -> Vec<u8> {
    let len = if rank == 5 { 300_000 } else { rank * 3 };
    (0..len).map(|i| (rank * 31 + i) as u8).collect()
}

/// What rank `from` sends to rank `to` in all_to_all (empty when `to == from + 1`).
pub fn a2a_payload(from: usize, to: usize, n: usize) -> Vec<u8> {
    if to == (from + 1) % n {
        Vec::new()
    } else {
        format!("{from}->{to}:{}", "x".repeat(from * to)).into_bytes()
    }
}

pub fn bcast_payload(root: usize) -> Vec<u8> {
    (0..(root * 1000 + 7)).map(|i| (i % 251) as u8 ^ root as u8).collect()
}

/// Runs allgather, all_to_all, two broadcasts and a barrier, checking every result.
pub fn check_collectives(bs: &dyn Bootstrap) -> Result<(), String> {
    let (me, n) = (bs.rank(), bs.world_size());
    let got = bs.allgather(&gather_payload(me)).map_err(|e| e.to_string())?;
    let want: Vec<Vec<u8>> = (0..n).map(gather_payload).collect();
    if got != want {
        return Err(format!("rank {me}: allgather mismatch (lens {:?})", got.iter().map(Vec::len).collect::<Vec<_>>()));
    }
    let got = bs.all_to_all((0..n).map(|j| a2a_payload(me, j, n)).collect()).map_err(|e| e.to_string())?;
    let want: Vec<Vec<u8>> = (0..n).map(|i| a2a_payload(i, me, n)).collect();
    if got != want {
        return Err(format!("rank {me}: all_to_all mismatch"));
    }
    for root in [n - 1, 0] {
        let mine = bcast_payload(root);
        let got = bs.broadcast(root, (me == root).then_some(mine.as_slice())).map_err(|e| e.to_string())?;
        if got != mine {
            return Err(format!("rank {me}: broadcast from {root} mismatch"));
        }
    }
    bs.barrier().map_err(|e| e.to_string())?;
    Ok(())
}
