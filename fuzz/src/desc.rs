//! `desc`: [`EngineDesc::unpack`] and [`MemoryDesc::unpack`], the descriptors peers hand each
//! other out of band (and the control plane returns for a lookup).
//!
//! Every input goes to both decoders. Asserted for whatever decodes: packing it again gives a
//! descriptor that unpacks to the same value, starts with [`DESC_VERSION`] and is no longer
//! than the input (postcard accepts over-long varints, so the canonical encoding may be
//! shorter, never longer); [`MemoryDesc::handle`] finds the first handle of each backend.

use mori_io_core::{BackendHandle, BackendKind, EngineDesc, MemLoc, MemoryDesc, Secret, DESC_VERSION};

const KINDS: [BackendKind; 4] = [BackendKind::Xgmi, BackendKind::Fabric, BackendKind::Rdma, BackendKind::Tcp];

/// One input.
pub fn run(data: &[u8]) {
    if let Ok(d) = EngineDesc::unpack(data) {
        let b = d.pack();
        assert_eq!(b[0], DESC_VERSION);
        assert!(b.len() <= data.len(), "canonical EngineDesc of {} bytes from {} input bytes", b.len(), data.len());
        assert_eq!(EngineDesc::unpack(&b).as_ref(), Ok(&d), "EngineDesc round trip");
    }
    if let Ok(m) = MemoryDesc::unpack(data) {
        let b = m.pack();
        assert_eq!(b[0], DESC_VERSION);
        assert!(b.len() <= data.len(), "canonical MemoryDesc of {} bytes from {} input bytes", b.len(), data.len());
        assert_eq!(MemoryDesc::unpack(&b).as_ref(), Ok(&m), "MemoryDesc round trip");
        for k in KINDS {
            let first = m.handles.iter().find(|h| h.backend == k).map(|h| h.bytes.as_slice());
            assert_eq!(m.handle(k), first, "handle({k:?})");
        }
    }
}

/// Engine descriptors and host, GPU and handle-carrying memory descriptors.
pub fn seeds() -> Vec<Vec<u8>> {
    let e = EngineDesc {
        key: "prefill-0".into(),
        node_id: "0123456789abcdef".into(),
        hostname: "node-a".into(),
        host: "10.0.0.1".into(),
        port: 18516,
        pid: 4242,
        epoch: 0x1234_5678_9abc_def0,
        secret: Secret(0x0123_4567_89ab_cdef_fedc_ba98_7654_3210),
    };
    let v6 = EngineDesc { host: "fe80::1".into(), port: 0, pid: 1, epoch: 1, secret: Secret::NONE, ..e.clone() };
    let host = MemoryDesc {
        engine_key: e.key.clone(),
        engine_epoch: e.epoch,
        id: 1,
        addr: 0x7f00_0000_1000,
        len: 1 << 20,
        loc: MemLoc::Host { numa: Some(1) },
        bus_id: None,
        handles: Vec::new(),
    };
    let gpu = MemoryDesc {
        id: 7,
        loc: MemLoc::Gpu { device: 3 },
        bus_id: Some("0000:1b:00.0".into()),
        handles: vec![
            BackendHandle { backend: BackendKind::Xgmi, bytes: vec![0x4d; 96] },
            BackendHandle { backend: BackendKind::Rdma, bytes: vec![1, 2, 3, 4] },
            BackendHandle { backend: BackendKind::Fabric, bytes: vec![9; 40] },
        ],
        ..host.clone()
    };
    let no_numa = MemoryDesc { loc: MemLoc::Host { numa: None }, len: 1, ..host.clone() };
    vec![e.pack(), v6.pack(), host.pack(), gpu.pack(), no_numa.pack()]
}

/// No dictionary (binary format).
pub fn dict() -> Vec<&'static str> {
    Vec::new()
}
