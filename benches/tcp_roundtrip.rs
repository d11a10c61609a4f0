//! Small-message round trips over the tcp backend: two engines on 127.0.0.1 in this process,
//! one lane, one session; each iteration posts one write (or read) and waits for it.
//!
//! ```text
//! cargo bench --bench tcp_roundtrip
//! cargo bench --bench tcp_roundtrip -- --quick
//! ```
//!
//! A write completes when the target acknowledged that the payload is in its memory, so
//! every iteration is a full request/acknowledge round trip over loopback. The target's
//! inbound-status table is not popped here (it is bounded by the engine).

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use mori::io::{BackendConfig, EngineConfig, IoEngine, MemLoc, MemoryDesc, Session, TcpConfig};
use std::time::Duration;

const SIZES: [u64; 3] = [8, 4 << 10, 64 << 10];
const REGION: usize = 1 << 20;
const WAIT: Duration = Duration::from_secs(30);

/// An engine with one registered host buffer.
struct Side {
    eng: IoEngine,
    _buf: Vec<u8>,
    mem: MemoryDesc,
}

fn side(key: &str) -> Side {
    let eng = IoEngine::new(key, EngineConfig::new("127.0.0.1", 0).unwrap()).unwrap();
    eng.create_backend(BackendConfig::Tcp(TcpConfig { lanes: 1, ..TcpConfig::default() })).unwrap();
    let mut buf = vec![0x5Au8; REGION];
    // SAFETY: the Vec's heap buffer never moves or shrinks while registered, it outlives the
    // engine (fields drop in declaration order, the engine first), and every transfer that
    // touches it is waited for inside the benchmark iteration.
    let mem = unsafe { eng.register_memory(buf.as_mut_ptr(), REGION, MemLoc::Host { numa: None }) }.unwrap();
    Side { eng, _buf: buf, mem }
}

fn roundtrips(c: &mut Criterion) {
    let (a, b) = (side("bench-init"), side("bench-target"));
    a.eng.register_remote_engine(b.eng.desc().clone()).unwrap();
    b.eng.register_remote_engine(a.eng.desc().clone()).unwrap();
    let sess: Session = a.eng.create_session(&a.mem, &b.mem).unwrap();
    for (name, write) in [("tcp_write_1lane", true), ("tcp_read_1lane", false)] {
        let mut g = c.benchmark_group(name);
        for size in SIZES {
            g.throughput(Throughput::Bytes(size));
            g.bench_with_input(BenchmarkId::from_parameter(size), &size, |bch, &size| {
                bch.iter(|| {
                    let id = a.eng.allocate_transfer_uid();
                    let st = if write { sess.write(0, 4096, size, id) } else { sess.read(4096, 0, size, id) };
                    st.wait_for(WAIT).unwrap()
                })
            });
        }
        g.finish();
    }
}

criterion_group!(benches, roundtrips);
criterion_main!(benches);
