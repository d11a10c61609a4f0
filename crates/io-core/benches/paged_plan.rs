//! Cost per block of checking a paged batch (`mori_io_core::paged::check_paged`: bounds of
//! both sides, tables merged into runs) and, separately, of expanding the plan into segments
//! (`PagedPlan::expand`, what tcp and rdma post), for block tables of 10 to 10^6 entries:
//! random tables (distinct blocks of pools twice the table, nothing merges) and fully
//! consecutive ones (one run). Throughput is in blocks (table entries x layers x halves for
//! `expand`, table entries for `check_paged`, which does not depend on the layer count: the
//! `random-32layers` rows show it), so criterion's time per element is the cost per block.
//!
//! ```text
//! cargo bench -p mori-io-core --bench paged_plan              # full run
//! cargo bench -p mori-io-core --bench paged_plan -- --quick   # a quick look
//! ```

use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use mori_io_core::paged::{check_paged, PagedBatch, PagedLayout};

const BLOCK: u64 = 4096;
const SIZES: [u32; 6] = [10, 100, 1_000, 10_000, 100_000, 1_000_000];

/// `n` distinct blocks of `0..pool` in a fixed random order (partial Fisher-Yates over
/// xorshift64).
fn random_table(n: u32, pool: u32, seed: u64) -> Vec<u32> {
    let mut p: Vec<u32> = (0..pool).collect();
    let mut x = seed | 1;
    for i in 0..n as usize {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let j = i + (x % (p.len() - i) as u64) as usize;
        p.swap(i, j);
    }
    p.truncate(n as usize);
    p
}

/// The tables of one case: (name, local, remote, pool blocks).
fn tables(n: u32) -> [(&'static str, Vec<u32>, Vec<u32>, u32); 2] {
    [
        ("random", random_table(n, 2 * n, 0x9e37_79b9_7f4a_7c15), random_table(n, 2 * n, 0xd6e8_feb8_6659_fd93), 2 * n),
        ("consecutive", (0..n).collect(), (n..2 * n).collect(), 2 * n),
    ]
}

fn batch<'a>(local: &'a [u32], remote: &'a [u32], pool: u32, layers: u32, halves: u32) -> PagedBatch<'a> {
    let lay = PagedLayout::pool(0, BLOCK, u64::from(pool), halves);
    PagedBatch { local_blocks: local, remote_blocks: remote, block_size: BLOCK, layers, halves, local: lay, remote: lay }
}

/// Both regions: exactly the pool of `layers` x `halves` x `pool` blocks.
fn region(pool: u32, layers: u32, halves: u32) -> u64 {
    u64::from(layers) * u64::from(halves) * u64::from(pool) * BLOCK
}

fn check(c: &mut Criterion) {
    let mut g = c.benchmark_group("check_paged");
    for n in SIZES {
        for (name, lt, rt, pool) in tables(n) {
            for layers in [1u32, 32] {
                if layers > 1 && name != "random" {
                    continue;
                }
                let halves = if layers > 1 { 2 } else { 1 };
                let b = batch(&lt, &rt, pool, layers, halves);
                let len = region(pool, layers, halves);
                g.throughput(Throughput::Elements(u64::from(n)));
                let id = if layers > 1 { format!("{name}-32layers") } else { name.to_string() };
                g.bench_with_input(BenchmarkId::new(id, n), &b, |bench, b| {
                    bench.iter(|| check_paged((1, len), (2, len), black_box(b)).unwrap())
                });
            }
        }
    }
    g.finish();
}

fn expand(c: &mut Criterion) {
    let mut g = c.benchmark_group("expand");
    for n in SIZES {
        for (name, lt, rt, pool) in tables(n) {
            let b = batch(&lt, &rt, pool, 1, 1);
            let len = region(pool, 1, 1);
            let plan = check_paged((1, len), (2, len), &b).unwrap();
            g.throughput(Throughput::Elements(u64::from(plan.entries())));
            g.bench_with_input(BenchmarkId::new(name, n), &plan, |bench, p| bench.iter(|| black_box(p).expand()));
        }
    }
    g.finish();
}

criterion_group!(benches, check, expand);
criterion_main!(benches);
