//! A real [`IoEngine`] on loopback for the end-to-end targets (`engine_control`, `tcp_data`):
//! the input travels over a TCP connection to the engine's listener exactly as a peer's
//! bytes would, and is answered by the engine's own threads.
//!
//! The engine has the tcp backend and three registered host regions (4096, 64 and 1 bytes),
//! each inside a buffer with [`GUARD`] bytes of a known pattern on both sides, plus the id of
//! a region registered and deregistered again. A shadow copy of every buffer is kept: the
//! targets apply to it what the protocol says a request does, and [`Target::check_memory`]
//! compares, so a write that lands outside its region (or anywhere it should not) is caught
//! without AddressSanitizer. The engine is rebuilt every [`RESTART_EVERY`] inputs so that what
//! inputs leave behind (inbound transfer records of unfinished multi-piece transfers, which
//! the engine keeps until the transfer completes) stays bounded over a long run.

use mori_io::{BackendConfig, EngineConfig, IoEngine, MemLoc, MemoryDesc, TcpConfig};
use mori_io_core::wire::{handshake, Role};
use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::Duration;

/// Bytes of known pattern before and after every registered region.
pub const GUARD: usize = 64;
/// Sizes of the registered regions.
pub const REGION_LENS: [usize; 3] = [4096, 64, 1];
/// Inputs served by one engine before it is rebuilt.
pub const RESTART_EVERY: u64 = 20_000;
/// How long the harness waits for the engine to answer and close: a hang past it is a
/// finding (the engine must close a connection whose peer stopped sending).
pub const ANSWER_WITHIN: Duration = Duration::from_secs(5);
/// Key of the engine under test.
pub const TARGET_KEY: &str = "fuzz-target";
/// Key the harness connects as.
pub const INITIATOR_KEY: &str = "fuzz-initiator";

/// One registered region and its buffer.
pub struct Buf {
    /// Start of the buffer (guard, region, guard), allocated once for the process.
    base: *mut u8,
    /// Region length.
    pub len: usize,
    /// What the engine returned at registration.
    pub desc: MemoryDesc,
    /// What the buffer must hold (guards included).
    pub shadow: Vec<u8>,
}

// SAFETY: `base` points to a buffer leaked for the life of the process; it is read and written
// only under the harness mutex, while no connection of the harness is open (so no engine
// thread is touching it).
unsafe impl Send for Buf {}

/// The engine under test and what it registered.
pub struct Target {
    /// The engine (`None` only while being rebuilt).
    pub eng: Option<IoEngine>,
    /// The registered regions, in [`REGION_LENS`] order.
    pub bufs: Vec<Buf>,
    /// Id of a region that was registered and deregistered.
    pub gone: u64,
    execs: u64,
}

fn pattern(i: usize) -> u8 {
    (i as u8).wrapping_mul(31) ^ 0xa5
}

impl Target {
    fn build(bases: &[*mut u8]) -> Target {
        let eng = IoEngine::new(TARGET_KEY, EngineConfig::default()).expect("engine on 127.0.0.1");
        eng.create_backend(BackendConfig::Tcp(TcpConfig::default())).expect("tcp backend");
        let mut bufs = Vec::new();
        for (&base, &len) in bases.iter().zip(REGION_LENS.iter()) {
            let total = len + 2 * GUARD;
            let shadow: Vec<u8> = (0..total).map(pattern).collect();
            // SAFETY: `base` is a leaked allocation of `total` bytes; nothing else uses it now.
            unsafe { std::ptr::copy_nonoverlapping(shadow.as_ptr(), base, total) };
            // SAFETY: the region lies inside the leaked buffer, valid for the whole process.
            let desc = unsafe { eng.register_memory(base.add(GUARD), len, MemLoc::Host { numa: None }) }.expect("register");
            bufs.push(Buf { base, len, desc, shadow });
        }
        let mut spare = [0u8; 8];
        // SAFETY: `spare` outlives the registration, which is removed right away.
        let g = unsafe { eng.register_memory(spare.as_mut_ptr(), spare.len(), MemLoc::Host { numa: None }) }.expect("register");
        eng.deregister_memory(&g).expect("deregister");
        Target { eng: Some(eng), bufs, gone: g.id, execs: 0 }
    }

    /// The engine.
    pub fn eng(&self) -> &IoEngine {
        self.eng.as_ref().expect("engine")
    }

    /// Counts an input; rebuilds the engine every [`RESTART_EVERY`] inputs.
    fn tick(&mut self) {
        self.execs += 1;
        if self.execs.is_multiple_of(RESTART_EVERY) {
            let bases: Vec<*mut u8> = self.bufs.iter().map(|b| b.base).collect();
            if let Some(eng) = self.eng.take() {
                for b in &self.bufs {
                    eng.deregister_memory(&b.desc).expect("deregister");
                }
                drop(eng);
            }
            *self = Target { execs: self.execs, ..Target::build(&bases) };
        }
    }

    /// Compares every buffer with its shadow; panics naming the first byte that differs and
    /// whether it is a guard byte (a write outside the region) or inside the region.
    pub fn check_memory(&self) {
        for (k, b) in self.bufs.iter().enumerate() {
            let total = b.len + 2 * GUARD;
            // SAFETY: the buffer is `total` bytes, and no connection is open (see `Buf`).
            let now = unsafe { std::slice::from_raw_parts(b.base, total) };
            if let Some(i) = now.iter().zip(&b.shadow).position(|(x, y)| x != y) {
                let place = if i < GUARD || i >= GUARD + b.len { "a GUARD byte outside" } else { "a byte inside" };
                panic!(
                    "region {k} (id {}, {} bytes): {place} the region changed: buffer byte {i} (region offset {}) is {:#04x}, expected {:#04x}",
                    b.desc.id,
                    b.len,
                    i as i64 - GUARD as i64,
                    now[i],
                    b.shadow[i]
                );
            }
        }
    }
}

/// The harness, built on first use (and SIGPIPE ignored: under libFuzzer's own `main` the Rust
/// runtime does not do it, and a write to a connection the engine closed must be an error).
pub fn target() -> MutexGuard<'static, Target> {
    static T: OnceLock<Mutex<Target>> = OnceLock::new();
    let m = T.get_or_init(|| {
        // SAFETY: setting a signal disposition to SIG_IGN has no preconditions.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) };
        let bases: Vec<*mut u8> =
            REGION_LENS.iter().map(|&n| Box::leak(vec![0u8; n + 2 * GUARD].into_boxed_slice()).as_mut_ptr()).collect();
        Mutex::new(Target::build(&bases))
    });
    let mut g = m.lock().unwrap_or_else(|p| p.into_inner());
    g.tick();
    g
}

/// Connects to the engine's listener.
pub fn connect(t: &Target) -> TcpStream {
    let d = t.eng().desc();
    let s = TcpStream::connect((d.host.as_str(), d.port)).expect("connect to the engine");
    s.set_nodelay(true).ok();
    s.set_read_timeout(Some(ANSWER_WITHIN)).ok();
    s
}

/// Connects and exchanges hellos for `role`, as a peer engine `INITIATOR_KEY` would; panics
/// unless the engine accepts.
pub fn dial(t: &Target, role: Role) -> TcpStream {
    let mut s = connect(t);
    let from = mori_io_core::EngineDesc {
        key: INITIATOR_KEY.into(),
        node_id: "fuzz-node".into(),
        hostname: "fuzz-host".into(),
        host: "127.0.0.1".into(),
        port: 1,
        pid: 1,
        epoch: 1,
        secret: mori_io_core::Secret::NONE,
    };
    match handshake(&mut s, &from, t.eng().desc(), role, ANSWER_WITHIN) {
        Ok(d) => assert_eq!(&d, t.eng().desc(), "the engine answered with another descriptor"),
        Err(e) => panic!("the engine refused a valid hello: {e}"),
    }
    s.set_read_timeout(Some(ANSWER_WITHIN)).ok();
    s
}

/// Sends `bytes` and ends the sending side, while reading everything the engine answers
/// until it closes the connection; returns it, and whether the connection ended with a reset
/// rather than an orderly close. Panics if the engine neither answers nor closes within
/// [`ANSWER_WITHIN`] of the last byte it sent.
pub fn exchange(mut s: TcpStream, bytes: &[u8]) -> (Vec<u8>, bool) {
    let mut w = s.try_clone().expect("clone the stream");
    std::thread::scope(|sc| {
        sc.spawn(move || {
            // The engine may close before taking everything (a protocol error): not a finding.
            let _ = w.write_all(bytes);
            let _ = w.shutdown(Shutdown::Write);
        });
        let mut out = Vec::new();
        let mut buf = [0u8; 16 << 10];
        let reset = loop {
            match s.read(&mut buf) {
                Ok(0) => break false,
                Ok(n) => out.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => panic!(
                    "the engine neither answered nor closed the connection within {ANSWER_WITHIN:?} after the input ended ({} bytes sent, {} received)",
                    bytes.len(),
                    out.len()
                ),
                // A reset after the engine refused the stream ends it as well.
                Err(_) => break true,
            }
        };
        (out, reset)
    })
}
