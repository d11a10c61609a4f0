//! The copy pool's resident grid (`mori_ordered_copy_resident`, kernels/scatter_gather_copy.cu)
//! on CPU threads (`MORI_HOST_EMU`: every GPU thread an OS thread, device memory = host
//! memory), driven by a host poster written here from the kernel's ABI (kernels/README.md):
//! the real kernel source's relay from block 0 to the other blocks, its launch numbers, its
//! started marks, its idle exit and stop, and the exit decision racing with posts. mori-gpu's
//! `pool/resident.rs` is the production poster; its GPU test runs on the stand-in driver, which
//! plays the grid on one host thread, so the multi-block protocol is checked here.

use crate::emu_support::{launch, Region};
use std::sync::atomic::{fence, AtomicU32, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// `ResidentParams` (kernels/README.md): 40 bytes, by value.
#[repr(C)]
#[derive(Clone, Copy)]
struct ResidentParams {
    ring: u64,
    scratch: u64,
    idle_ns: u64,
    depth: u32,
    start: u32,
    gen: u32,
    pad: u32,
}
const _: () = assert!(std::mem::size_of::<ResidentParams>() == 40);

const STRIDE: usize = 256;
const BLOCK: u32 = 32;
const WAIT: Duration = Duration::from_secs(20);

/// An `OrderedCopy` table (232 bytes): `segs` (src, dst, len) as one group, or as `groups`
/// groups starting at `first`; arrivals at `arrivals`; `flag_value` into `flag` once done.
fn table(segs: &[(u64, u64, u64)], first: &[u8], arrivals: u64, flag: u64, flag_value: u32) -> Vec<u8> {
    let mut t = vec![0u8; 232];
    for (i, &(s, d, l)) in segs.iter().enumerate() {
        t[24 * i..24 * i + 8].copy_from_slice(&s.to_le_bytes());
        t[24 * i + 8..24 * i + 16].copy_from_slice(&d.to_le_bytes());
        t[24 * i + 16..24 * i + 24].copy_from_slice(&l.to_le_bytes());
    }
    t[192..200].copy_from_slice(&arrivals.to_le_bytes());
    t[200..208].copy_from_slice(&flag.to_le_bytes());
    t[208..212].copy_from_slice(&(segs.len() as u32).to_le_bytes());
    t[212..216].copy_from_slice(&flag_value.to_le_bytes());
    t[216..220].copy_from_slice(&(first.len() as u32).to_le_bytes());
    t[220..220 + first.len()].copy_from_slice(first);
    t
}

/// The host's side of the ring: posts tables and launches a grid when the last one exited.
struct Host {
    ring: Region,
    scratch: Region,
    arrivals: Region,
    depth: u32,
    grid: u32,
    idle: Duration,
    /// Microseconds block 0 holds its exit decision before it writes state 2 (`pad`).
    hold_us: u32,
    posted: u32,
    gen: u32,
    launches: u32,
    running: Option<JoinHandle<()>>,
}

impl Host {
    fn new(depth: u32, grid: u32, idle: Duration) -> Host {
        let ring = Region::new(STRIDE * (1 + depth as usize) + 4 * grid as usize);
        let h = Host {
            ring,
            scratch: Region::new(STRIDE * (1 + depth as usize)),
            arrivals: Region::new(64 * depth as usize),
            depth,
            grid,
            idle,
            hold_us: 0,
            posted: 0,
            gen: 0,
            launches: 0,
            running: None,
        };
        h.word(2).store(3, Ordering::Release);
        // A launch with a depth the kernel does not take returns at once (state 3): it builds
        // the emulation library here, outside the tests' waits.
        let p = ResidentParams { ring: h.ring.addr(), scratch: h.scratch.addr(), idle_ns: 0, depth: 0, start: 0, gen: 0, pad: 0 };
        launch("scatter_gather_copy", "mori_ordered_copy_resident", 1, BLOCK, &p);
        assert_eq!(h.word(2).load(Ordering::Acquire), 3, "a depth of 0: state 3 at once");
        h
    }

    fn word(&self, i: usize) -> &AtomicU32 {
        // SAFETY: the ring is 64-aligned and longer than its header and started words; the
        // grid's threads and this one access these words atomically only.
        unsafe { AtomicU32::from_ptr(self.ring.ptr.add(4 * i) as *mut u32) }
    }

    /// The arrival words of the next table's slot.
    fn next_arrivals(&self) -> u64 {
        self.arrivals.addr() + 64 * u64::from(self.posted.wrapping_add(1) % self.depth)
    }

    /// Posts `t` (built with `next_arrivals`) as the next table; launches a grid when the last
    /// one exited (the kernel's store-fence-load against the grid's). Returns whether it
    /// launched.
    fn post(&mut self, t: &[u8]) -> bool {
        let seq = self.posted.wrapping_add(1);
        let slot = (seq % self.depth) as usize;
        // SAFETY: the slot lies inside the ring; its previous table completed (the tests wait
        // for each table's flag before its slot comes round again).
        unsafe { std::ptr::copy_nonoverlapping(t.as_ptr(), self.ring.ptr.add(STRIDE * (1 + slot)), t.len()) };
        // The slot's three stamps after the table, zeroed (the grid writes them).
        // SAFETY: bytes 232..256 of the slot lie inside the ring; the grid does not touch them
        // before `posted` below.
        unsafe { std::ptr::write_bytes(self.ring.ptr.add(STRIDE * (1 + slot) + 232), 0, 24) };
        fence(Ordering::SeqCst);
        self.word(0).store(seq, Ordering::Release);
        self.posted = seq;
        fence(Ordering::SeqCst);
        let t0 = Instant::now();
        loop {
            match self.word(2).load(Ordering::Acquire) {
                0 | 1 => return false,
                3 => break,
                s => {
                    assert!(t0.elapsed() < WAIT, "the grid stayed in state {s}");
                    std::thread::yield_now();
                }
            }
        }
        self.launch();
        true
    }

    /// The stamps (seen, relayed, flagged: GPU clock, here the host's) of the last table
    /// posted, read once its flag was seen.
    fn stamps(&self) -> [u64; 3] {
        let at = STRIDE * (1 + (self.posted % self.depth) as usize) + 232;
        // SAFETY: inside the ring, 8-aligned; the grid wrote them before the flag.
        [0, 8, 16].map(|o| unsafe { std::ptr::read_volatile(self.ring.ptr.add(at + o) as *const u64) })
    }

    /// Launches a grid after the last table the previous one ran (waiting for the previous
    /// grid's threads first, as the same stream would).
    fn launch(&mut self) {
        if let Some(h) = self.running.take() {
            h.join().unwrap();
        }
        self.gen += 1;
        self.launches += 1;
        self.word(2).store(0, Ordering::Release);
        let p = ResidentParams {
            ring: self.ring.addr(),
            scratch: self.scratch.addr(),
            idle_ns: self.idle.as_nanos() as u64,
            depth: self.depth,
            start: self.word(3).load(Ordering::Acquire),
            gen: self.gen,
            pad: self.hold_us,
        };
        let grid = self.grid;
        self.running = Some(std::thread::spawn(move || launch("scatter_gather_copy", "mori_ordered_copy_resident", grid, BLOCK, &p)));
    }

    /// Sets the stop word and waits for the grid to exit; returns its `done` word.
    fn stop(&mut self) -> u32 {
        self.word(1).store(1, Ordering::Release);
        let t0 = Instant::now();
        while self.word(2).load(Ordering::Acquire) != 3 {
            assert!(t0.elapsed() < WAIT, "the grid did not exit once stopped");
            std::thread::sleep(Duration::from_millis(1));
        }
        if let Some(h) = self.running.take() {
            h.join().unwrap();
        }
        self.word(1).store(0, Ordering::Release);
        self.word(3).load(Ordering::Acquire)
    }

    /// How many blocks marked themselves started with the current launch number.
    fn started(&self) -> usize {
        let base = STRIDE * (1 + self.depth as usize) / 4;
        (0..self.grid as usize).filter(|b| self.word(base + b).load(Ordering::Acquire) == self.gen).count()
    }
}

/// Waits for the u32 at byte `off` of `r` to read `v`.
fn wait_flag(r: &Region, off: usize, v: u32, what: &str) {
    // SAFETY: 4-aligned inside the region; written by the grid atomically (a volatile store).
    let w = unsafe { AtomicU32::from_ptr(r.ptr.add(off) as *mut u32) };
    let t0 = Instant::now();
    while w.load(Ordering::Acquire) != v {
        assert!(t0.elapsed() < WAIT, "{what}: flag {v} not written after {WAIT:?}");
        std::thread::yield_now();
    }
}

fn pattern(r: &Region, seed: u8) {
    // SAFETY: the region's own bytes; no grid runs while it is filled.
    let b = unsafe { std::slice::from_raw_parts_mut(r.ptr, r.bytes().len()) };
    b.iter_mut().enumerate().for_each(|(i, x)| *x = (i as u8).wrapping_mul(31) ^ seed);
}

/// 4 blocks of 32 threads run 12 tables one at a time, 4 in flight (every slot), and a table
/// of two groups; every byte lands where its table says and nowhere else; each block marked
/// itself started; stopped, the grid exits with `done` at the last table.
#[test]
fn resident_grid_on_cpu_threads_runs_posted_tables_then_stops() {
    let (src, dst, flags) = (Region::new(1 << 17), Region::new(1 << 17), Region::new(4096));
    pattern(&src, 5);
    let mut h = Host::new(4, 4, Duration::from_secs(30));
    let mut n = 0u32;
    // Table k: 3000 bytes from src + k * 4096 + 3 to dst + k * 4096 + 8, then a 16-byte pair.
    let mut post = |h: &mut Host, k: u64, first: &[u8]| {
        n += 1;
        let (s, d) = (src.addr() + k * 4096, dst.addr() + k * 4096);
        let segs = [(s + 3, d + 8, 3000), (s + 4000, d + 4064, 16)];
        let segs: Vec<(u64, u64, u64)> =
            if first.len() > 1 { vec![segs[0], segs[1], (s + 3100, d + 3100, 400), (s + 3600, d + 3600, 16)] } else { segs.to_vec() };
        let t = table(&segs, first, h.next_arrivals(), flags.addr() + 4 * k, n);
        h.post(&t);
        n
    };
    for k in 0..12 {
        let v = post(&mut h, k, &[]);
        wait_flag(&flags, 4 * k as usize, v, "one at a time");
        let [seen, relayed, flagged] = h.stamps();
        assert!(seen != 0 && seen <= relayed && relayed <= flagged, "table {k}: stamps {seen}, {relayed}, {flagged}");
    }
    assert_eq!(h.launches, 1, "one grid for tables posted one at a time");
    let vs: Vec<u32> = (12..16).map(|k| post(&mut h, k, &[])).collect();
    for (k, v) in (12..16).zip(vs) {
        wait_flag(&flags, 4 * k, v, "four in flight");
    }
    let v = post(&mut h, 16, &[0, 2]);
    wait_flag(&flags, 4 * 16, v, "two groups");
    assert_eq!(h.started(), 4, "every block marked itself started with launch number {}", h.gen);
    assert_eq!(h.stop(), 17, "done: the last table run");
    assert_eq!(h.launches, 1);
    let (s, d) = (src.bytes(), dst.bytes());
    let mut covered = vec![false; d.len()];
    for k in 0..17usize {
        let mut ranges = vec![(3, 8, 3000), (4000, 4064, 16)];
        if k == 16 {
            ranges.extend([(3100, 3100, 400), (3600, 3600, 16)]);
        }
        for (so, dof, l) in ranges {
            let (so, dof) = (k * 4096 + so, k * 4096 + dof);
            assert_eq!(&d[dof..dof + l], &s[so..so + l], "table {k}: {l} bytes at {dof}");
            covered[dof..dof + l].iter_mut().for_each(|c| *c = true);
        }
    }
    assert!(d.iter().zip(&covered).all(|(&x, &c)| c || x == 0), "bytes outside the tables");
}

/// Posts timed around the grid's idle exit (2 ms with nothing posted, the decision then held
/// 1 ms before the grid says so), 40 of them: each table is run exactly once, by the grid that
/// saw it or by the one its post launched. A post inside the held decision finds the grid
/// running and relies on its second look at `posted`. Each table's destination is cleared
/// after its flag; a table run twice would write it again.
#[test]
fn resident_grid_on_cpu_threads_runs_each_table_once_across_idle_exits() {
    let (src, dst, flags) = (Region::new(64 * 64), Region::new(64 * 64), Region::new(4096));
    pattern(&src, 9);
    let mut h = Host::new(4, 2, Duration::from_millis(2));
    h.hold_us = 1000;
    let mut x = 0x2545_f491u32;
    for k in 0..40u64 {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        std::thread::sleep(Duration::from_micros(u64::from(x % 4000)));
        let (s, d) = (src.addr() + 64 * k, dst.addr() + 64 * k);
        let t = table(&[(s, d, 48), (s + 48, d + 48, 16)], &[], h.next_arrivals(), flags.addr() + 4 * k, k as u32 + 1);
        h.post(&t);
        wait_flag(&flags, 4 * k as usize, k as u32 + 1, "a post near the idle exit");
        let got = &dst.bytes()[64 * k as usize..64 * k as usize + 64];
        assert_eq!(got, &src.bytes()[64 * k as usize..64 * k as usize + 64], "table {k}");
        // SAFETY: the table completed (its flag); a second run would write these bytes again.
        unsafe { std::ptr::write_bytes(dst.ptr.add(64 * k as usize), 0, 64) };
    }
    let done = h.stop();
    assert_eq!(done, 40, "done: the last table run");
    std::thread::sleep(Duration::from_millis(20));
    assert!(dst.bytes().iter().all(|&b| b == 0), "a table ran again after its flag");
    assert!(h.launches >= 2, "the grid never exited between posts ({} launch): the race was not exercised", h.launches);
}
