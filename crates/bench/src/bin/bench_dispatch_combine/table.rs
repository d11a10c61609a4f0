//! The per-rank output both paths print: the seed's line per rank, then a table.

use comfy_table::{presets::UTF8_BORDERS_ONLY, Table};

/// Prints `rank R recv N tokens M rdma tokens` per `(rank, recv, rdma algo)` (the seed's line,
/// in rank order), then a table of `header` and `rows`.
pub fn print_ranks(lines: &[(usize, u64, u64)], header: &[&str], rows: Vec<Vec<String>>) {
    for (rank, recv, rdma) in lines {
        println!("rank {rank} recv {recv} tokens {rdma} rdma tokens");
    }
    let mut t = Table::new();
    t.load_preset(UTF8_BORDERS_ONLY);
    t.set_header(header.to_vec());
    for r in rows {
        t.add_row(r);
    }
    println!("{t}");
}
