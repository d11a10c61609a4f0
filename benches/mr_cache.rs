//! Cost of `mori_mr::MrCache` lookups with 10 000 registrations (a registrar that only
//! returns the address: the cache's own bookkeeping, no `ibv_reg_mr`).
//!
//! Registrations are 64 KiB at 1 MiB strides; each measurement walks 1024 pre-drawn queries
//! (reported per query): `lookup` hits (a range inside a registration), `lookup` misses (a
//! range in a gap) and `acquire` + `release` of a cached range (the registration path's
//! fast case).
//!
//! ```text
//! cargo bench --bench mr_cache            # full run
//! cargo bench --bench mr_cache -- --quick # a quick look
//! ```

use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use mori::mr::{MemDomain, MrCache, Registrar};

const H: MemDomain = MemDomain::Host;

const REGS: u64 = 10_000;
const STRIDE: u64 = 1 << 20;
const REG_LEN: u64 = 64 << 10;
const BASE: u64 = 0x7f00_0000_0000;
const QUERIES: usize = 1024;

/// Registers nothing: the handle is the address.
struct Trivial;

impl Registrar for Trivial {
    type Handle = u64;
    type Error = std::convert::Infallible;
    fn register(&mut self, _domain: MemDomain, addr: u64, _len: u64) -> Result<u64, Self::Error> {
        Ok(addr)
    }
    fn deregister(&mut self, _handle: u64) {}
}

fn cache() -> MrCache<Trivial> {
    let mut c = MrCache::new(Trivial, u64::MAX);
    for i in 0..REGS {
        let id = c.acquire(H, BASE + i * STRIDE, REG_LEN).expect("register");
        c.release(id).expect("release"); // cached, unused: findable
    }
    c
}

/// `QUERIES` (addr, len) pairs: inside registration k (hit) or in the gap after it (miss).
fn queries(hit: bool) -> Vec<(u64, u64)> {
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    (0..QUERIES)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let k = x % REGS;
            let off = (x >> 32) % (REG_LEN / 2);
            let start = BASE + k * STRIDE + if hit { 0 } else { REG_LEN };
            (start + off, 4096)
        })
        .collect()
}

fn lookups(c: &mut Criterion) {
    let mut mr = cache();
    let (hits, misses) = (queries(true), queries(false));
    assert!(hits.iter().all(|&(a, l)| mr.lookup(H, a, l).is_some()));
    assert!(misses.iter().all(|&(a, l)| mr.lookup(H, a, l).is_none()));
    let mut g = c.benchmark_group("MrCache/10000-regs");
    g.throughput(Throughput::Elements(QUERIES as u64));
    g.bench_function("lookup-hit", |b| b.iter(|| hits.iter().filter(|&&(a, l)| mr.lookup(H, black_box(a), l).is_some()).count()));
    g.bench_function("lookup-miss", |b| b.iter(|| misses.iter().filter(|&&(a, l)| mr.lookup(H, black_box(a), l).is_some()).count()));
    g.bench_function("acquire+release-hit", |b| {
        b.iter(|| {
            for &(a, l) in &hits {
                let id = mr.acquire(H, black_box(a), l).unwrap();
                mr.release(id).unwrap();
            }
        })
    });
    g.finish();
    assert_eq!(mr.len(), REGS as usize, "no registration was added or dropped");
}

criterion_group!(benches, lookups);
criterion_main!(benches);
