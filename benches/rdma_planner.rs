//! Cost of the sans-IO RDMA work-request planner (`mori_io_core::wr_plan::plan_wrs`) on a
//! 32 768-descriptor batch of 4 KiB entries, 4 QPs, one worker: contiguous (everything merges)
//! and scattered (remote slots 8 KiB apart in shuffled order: nothing merges, the sort works),
//! each with chunking on (64 KiB chunks, at most 64 per merged WR) and off. Reported per WR
//! of the resulting plan (the WR count is in the benchmark's name).
//!
//! ```text
//! cargo bench --bench rdma_planner            # full run
//! cargo bench --bench rdma_planner -- --quick # a quick look
//! ```

use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use mori::io_core::wr_plan::{plan_wrs, EndpointLimits, WrPlanConfig};
use mori::io_core::Seg;

const N: u64 = 32_768;
const LEN: u64 = 4096;

/// mlx5-like limits: 2 GiB messages, the backend's default 8 SGEs and 1024-deep send queues.
const LIMITS: EndpointLimits = EndpointLimits { max_msg_sz: 1 << 31, max_sge: 8, max_send_wr: 1024 };

fn config(chunking: bool) -> WrPlanConfig {
    WrPlanConfig { chunking, chunk_bytes: 64 << 10, max_chunks: 64, num_qps: 4, num_nics: 1, workers: 1 }
}

fn contiguous() -> Vec<Seg> {
    (0..N).map(|i| Seg { local_off: i * LEN, remote_off: i * LEN, len: LEN }).collect()
}

/// Local slots back to back, remote slots 2 x LEN apart (never adjacent) in a fixed shuffled
/// order (Fisher-Yates over xorshift64).
fn scattered() -> Vec<Seg> {
    let mut slot: Vec<u64> = (0..N).collect();
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for i in (1..slot.len()).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        slot.swap(i, (x % (i as u64 + 1)) as usize);
    }
    slot.iter().enumerate().map(|(i, &s)| Seg { local_off: i as u64 * LEN, remote_off: s * 2 * LEN, len: LEN }).collect()
}

fn planner(c: &mut Criterion) {
    let mut g = c.benchmark_group("plan_wrs/32768x4KiB/4qp");
    for (layout, batch) in [("contiguous", contiguous()), ("scattered", scattered())] {
        for chunking in [true, false] {
            let cfg = config(chunking);
            let plan = plan_wrs(&batch, &LIMITS, &cfg, 0).expect("plan");
            let wrs: usize = plan.queues.iter().map(|q| q.wrs.len()).sum();
            g.throughput(Throughput::Elements(wrs as u64));
            let id = format!("{layout}/chunking-{}/{wrs}WRs", if chunking { "on" } else { "off" });
            g.bench_function(BenchmarkId::from_parameter(id), |b| {
                b.iter(|| plan_wrs(black_box(&batch), &LIMITS, &cfg, black_box(1)).unwrap())
            });
        }
    }
    g.finish();
}

criterion_group!(benches, planner);
criterion_main!(benches);
