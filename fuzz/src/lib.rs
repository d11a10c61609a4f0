//! Fuzz targets for every decoder of mori-rs that takes peer or user bytes (docs/FUZZING.md).
//!
//! Each module is one target: `run(data)` feeds one input to the decoder (and asserts what
//! can be asserted: round trips, agreement of two decoding paths, a model's prediction, the
//! bytes around registered memory untouched), `seeds()` returns valid encodings to start the
//! corpus from, and `dict()` tokens for libFuzzer's `-dict` (text formats). The binaries in
//! `fuzz_targets/` are one [`target!`] line each.
//!
//! Every binary also answers two arguments of its own before libFuzzer sees the command line
//! (so the binaries work where there is no cargo, e.g. `scripts/fuzz-long.sh`):
//! `--write-seeds DIR` writes the seeds into DIR (one file per seed, named by content hash)
//! and exits; `--write-dict FILE` writes the dictionary (an empty file when the target has
//! none) and exits.

pub mod bootstrap_wire;
pub mod ctrl_frames;
pub mod desc;
pub mod engine;
pub mod engine_control;
pub mod env_strings;
pub mod fabric_handle;
pub mod gpu_handle;
pub mod inbound;
pub mod inbound_bulk;
pub mod tcp_data;
pub mod topo_capture;
pub mod trace_analyze;
pub mod trace_gantt;

pub use libfuzzer_sys;

/// Defines the libFuzzer entry points for module `$m` of this crate: its `run` per input,
/// and the `--write-seeds` / `--write-dict` arguments answered from its `seeds` and `dict`.
#[macro_export]
macro_rules! target {
    ($m:ident) => {
        $crate::libfuzzer_sys::fuzz_target!(init: $crate::init($crate::$m::seeds, $crate::$m::dict), |data: &[u8]| {
            $crate::$m::run(data)
        });
    };
}

/// Called once before libFuzzer parses its flags: answers `--write-seeds DIR` and
/// `--write-dict FILE` (then exits), otherwise returns and fuzzing starts.
pub fn init(seeds: fn() -> Vec<Vec<u8>>, dict: fn() -> Vec<&'static str>) {
    let args: Vec<String> = std::env::args().collect();
    let code = match (args.get(1).map(String::as_str), args.get(2)) {
        (Some("--write-seeds"), Some(dir)) => write_seeds(std::path::Path::new(dir), &seeds()),
        (Some("--write-dict"), Some(file)) => write_dict(std::path::Path::new(file), &dict()),
        (Some(a @ ("--write-seeds" | "--write-dict")), None) => {
            eprintln!("{a} needs a path");
            2
        }
        _ => return,
    };
    std::process::exit(code);
}

fn write_seeds(dir: &std::path::Path, seeds: &[Vec<u8>]) -> i32 {
    if let Err(e) = std::fs::create_dir_all(dir) {
        eprintln!("{}: {e}", dir.display());
        return 1;
    }
    for s in seeds {
        let p = dir.join(format!("seed-{:016x}", fnv1a(s)));
        if let Err(e) = std::fs::write(&p, s) {
            eprintln!("{}: {e}", p.display());
            return 1;
        }
    }
    println!("{} seeds in {}", seeds.len(), dir.display());
    0
}

/// libFuzzer's dictionary format: one quoted token a line, `\xNN` for bytes outside printable
/// ASCII and for `"` and `\`.
fn write_dict(file: &std::path::Path, tokens: &[&str]) -> i32 {
    let mut out = String::new();
    for t in tokens {
        out.push('"');
        for b in t.bytes() {
            match b {
                b'"' | b'\\' => out.push_str(&format!("\\x{b:02x}")),
                0x20..=0x7e => out.push(b as char),
                _ => out.push_str(&format!("\\x{b:02x}")),
            }
        }
        out.push_str("\"\n");
    }
    match std::fs::write(file, out) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("{}: {e}", file.display());
            1
        }
    }
}

/// FNV-1a, 64 bits: stable seed file names (the same seeds give the same files).
fn fnv1a(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &x| (h ^ u64::from(x)).wrapping_mul(0x0100_0000_01b3))
}

/// Reads an input front to back; past the end it yields zeros (a short input is a valid one).
pub struct Cursor<'a> {
    b: &'a [u8],
}

impl<'a> Cursor<'a> {
    /// A cursor over `b`.
    pub fn new(b: &'a [u8]) -> Self {
        Cursor { b }
    }

    /// The next byte, or 0.
    pub fn u8(&mut self) -> u8 {
        match self.b.split_first() {
            Some((&x, rest)) => {
                self.b = rest;
                x
            }
            None => 0,
        }
    }

    /// The next `N` bytes, zero-padded.
    pub fn array<const N: usize>(&mut self) -> [u8; N] {
        let mut a = [0u8; N];
        let n = N.min(self.b.len());
        a[..n].copy_from_slice(&self.b[..n]);
        self.b = &self.b[n..];
        a
    }

    /// The next `n` bytes or fewer (at the end).
    pub fn take(&mut self, n: usize) -> &'a [u8] {
        let (h, t) = self.b.split_at(n.min(self.b.len()));
        self.b = t;
        h
    }

    /// Everything left.
    pub fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.b)
    }

    /// True when nothing is left.
    pub fn is_empty(&self) -> bool {
        self.b.is_empty()
    }
}

/// `[tag] ++ body`: the seed layout of targets whose first byte picks the decoder.
pub fn tagged(tag: u8, body: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(1 + body.len());
    v.push(tag);
    v.extend_from_slice(body);
    v
}
