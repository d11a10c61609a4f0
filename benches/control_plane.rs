//! Control-plane costs without sockets: descriptor `pack`/`unpack` and control-frame
//! encode/decode (`wire::encode_frame` + `FrameDecoder`).
//!
//! ```text
//! cargo bench --bench control_plane            # full run
//! cargo bench --bench control_plane -- --quick # a quick look
//! ```

use criterion::{black_box, criterion_group, criterion_main, Criterion};
use mori::io_core::wire::{encode_frame, CtrlReply, CtrlRequest, FrameDecoder, DEFAULT_MAX_FRAME};
use mori::io_core::{BackendHandle, BackendKind, EngineDesc, MemLoc, MemoryDesc};

/// A descriptor shaped as a prefill engine would advertise it.
fn engine() -> EngineDesc {
    EngineDesc {
        key: "prefill-0".into(),
        node_id: "0123456789abcdef0123456789abcdef".into(),
        hostname: "node-17.cluster.example".into(),
        host: "10.0.17.4".into(),
        port: 18516,
        pid: 424242,
        epoch: 0x9e37_79b9_7f4a_7c15,
        secret: mori::io_core::Secret(0x0123_4567_89ab_cdef_fedc_ba98_7654_3210),
    }
}

/// A GPU region with a bus id and one 64-byte backend handle (an IPC handle's size).
fn memory() -> MemoryDesc {
    MemoryDesc {
        engine_key: "prefill-0".into(),
        engine_epoch: 0x9e37_79b9_7f4a_7c15,
        id: 7,
        addr: 0x7f00_dead_0000,
        len: 512 << 20,
        loc: MemLoc::Gpu { device: 3 },
        bus_id: Some("0000:1b:00.0".into()),
        handles: vec![BackendHandle { backend: BackendKind::Xgmi, bytes: vec![0xAB; 64] }],
    }
}

fn descriptors(c: &mut Criterion) {
    let (e, m) = (engine(), memory());
    let (ep, mp) = (e.pack(), m.pack());
    let mut g = c.benchmark_group("desc");
    g.bench_function("EngineDesc::pack", |b| b.iter(|| black_box(&e).pack()));
    g.bench_function("EngineDesc::unpack", |b| b.iter(|| EngineDesc::unpack(black_box(&ep)).unwrap()));
    g.bench_function("MemoryDesc::pack", |b| b.iter(|| black_box(&m).pack()));
    g.bench_function("MemoryDesc::unpack", |b| b.iter(|| MemoryDesc::unpack(black_box(&mp)).unwrap()));
    g.finish();
}

fn frames(c: &mut Criterion) {
    let req = CtrlRequest::LookupMemory(7);
    let reply = CtrlReply::Memory(memory());
    let mut g = c.benchmark_group("frame");
    g.bench_function("CtrlRequest::LookupMemory encode+decode", |b| {
        let mut d = FrameDecoder::new(DEFAULT_MAX_FRAME);
        b.iter(|| {
            d.push(&encode_frame(black_box(&req)).unwrap());
            d.next_message::<CtrlRequest>().unwrap().unwrap()
        })
    });
    g.bench_function("CtrlReply::Memory encode", |b| b.iter(|| encode_frame(black_box(&reply)).unwrap()));
    g.bench_function("CtrlReply::Memory encode+decode", |b| {
        let mut d = FrameDecoder::new(DEFAULT_MAX_FRAME);
        b.iter(|| {
            d.push(&encode_frame(black_box(&reply)).unwrap());
            d.next_message::<CtrlReply>().unwrap().unwrap()
        })
    });
    // A reply arriving in 16-byte pieces, as a slow socket would deliver it.
    let bytes = encode_frame(&reply).unwrap();
    g.bench_function("CtrlReply::Memory decode in 16-byte pieces", |b| {
        let mut d = FrameDecoder::new(DEFAULT_MAX_FRAME);
        b.iter(|| {
            let mut out = None;
            for piece in black_box(&bytes).chunks(16) {
                d.push(piece);
                if let Some(r) = d.next_message::<CtrlReply>().unwrap() {
                    out = Some(r);
                }
            }
            out.unwrap()
        })
    });
    g.finish();
}

criterion_group!(benches, descriptors, frames);
criterion_main!(benches);
