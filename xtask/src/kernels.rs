//! `cargo xtask kernels [--check]`: builds the GPU kernels (kernels/*.cu, one source for CUDA
//! and HIP) into kernels/prebuilt/, or with `--check` rebuilds them in a temp dir and fails,
//! naming each stale file, when the committed artifacts differ.
//!
//! Toolchains (installed when missing; see kernels/README.md):
//! - CUDA: nvcc 13.0.88 from PyPI (pinned wheels, `pip install --target` into
//!   `$MORI_NVCC_DIR`, default `${XDG_CACHE_HOME:-$HOME/.cache}/mori-nvcc/13.0.88`), plus the
//!   host g++ nvcc preprocesses with. Outputs `<name>.sm_90.ptx` and `<name>.sm_90.cubin`.
//! - HIP: Debian `clang-22` + `lld-22` (apt, as root; clang-19 if 22 cannot be had), in HIP
//!   mode without any vendor header. Outputs `<name>.<gfx>.hsaco` for gfx942, and gfx950
//!   when the compiler knows it.
//!
//! Builds run in a temp copy of kernels/ with relative names, and every artifact is scanned
//! for absolute paths of this machine. `prebuilt/MANIFEST` holds the compiler versions and
//! the sha256 of each source and artifact (`sha256sum -c` format, run from kernels/).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use crate::util;

/// The pinned PyPI wheels (unpinned pulls 13.5, whose PTX ISA 9.5 the 13.0 driver rejects).
const NVCC_WHEELS: &[&str] = &[
    "nvidia-cuda-nvcc==13.0.88",
    "nvidia-nvvm==13.0.88",
    "nvidia-cuda-crt==13.0.88",
    "nvidia-cuda-runtime==13.0.96",
    "nvidia-cuda-cccl==13.0.85",
];
const NVCC_VERSION: &str = "13.0.88";
/// Where the wheels put the toolkit tree, relative to the `--target` dir.
const NVCC_TREE: &str = "nvidia/cu13";
/// Newest PTX ISA the GPU machine's driver (580, CUDA 13.0) loads.
const MAX_PTX_ISA: (u32, u32) = (9, 0);
const CUDA_ARCH: &str = "sm_90";
/// Debian clang majors, preferred first (22 knows gfx950, 19 does not).
const CLANG_MAJORS: &[u32] = &[crate::prereq::CLANG_MAJOR, 19];
const AMD_ARCHS: &[&str] = &["gfx942", "gfx950"];

pub fn run(args: &[String]) -> Result<(), String> {
    let check = match args.iter().map(String::as_str).collect::<Vec<_>>().as_slice() {
        [] => false,
        ["--check"] => true,
        _ => return Err("usage: cargo xtask kernels [--check]".into()),
    };
    let t0 = Instant::now();
    let tc = Toolchains::ensure()?;
    let kdir = util::workspace_root().join("kernels");
    let tmp = TempDir::new()?;
    let built = build(&kdir, &tc, &tmp.0)?;
    let prebuilt = kdir.join("prebuilt");
    if check {
        let stale = compare(&prebuilt, &built)?;
        if !stale.is_empty() {
            for s in &stale {
                eprintln!("xtask: kernels: stale: {s}");
            }
            // The MANIFEST lines that differ say which source or compiler changed.
            let old = std::fs::read_to_string(prebuilt.join("MANIFEST")).unwrap_or_default();
            let new = String::from_utf8_lossy(&built["MANIFEST"]).into_owned();
            old.lines().filter(|l| !new.lines().any(|n| n == *l)).for_each(|l| eprintln!("  committed MANIFEST: {l}"));
            new.lines().filter(|l| !old.lines().any(|o| o == *l)).for_each(|l| eprintln!("  fresh build:        {l}"));
            return Err(format!(
                "kernels/prebuilt is stale ({} file(s)); run `cargo xtask kernels` and commit kernels/prebuilt/",
                stale.len()
            ));
        }
        println!("xtask: kernels: kernels/prebuilt is up to date ({} files, {:.1} s)", built.len(), t0.elapsed().as_secs_f64());
    } else {
        write(&prebuilt, &built)?;
        for (name, bytes) in &built {
            println!("xtask: kernels: kernels/prebuilt/{name} ({} bytes)", bytes.len());
        }
        println!("xtask: kernels: done in {:.1} s", t0.elapsed().as_secs_f64());
    }
    Ok(())
}

struct Toolchains {
    nvcc: PathBuf,
    /// `nvcc --version`'s last line, e.g. "Cuda compilation tools, release 13.0, V13.0.88".
    nvcc_version: String,
    /// /usr/lib/llvm-N/bin (clang and ld.lld).
    llvm_bin: PathBuf,
    /// `clang --version`'s first line.
    clang_version: String,
    amd_archs: Vec<&'static str>,
}

impl Toolchains {
    fn ensure() -> Result<Self, String> {
        let (nvcc, nvcc_version) = ensure_nvcc()?;
        let llvm_bin = ensure_clang()?;
        let clang_version = first_line(&output(Command::new(llvm_bin.join("clang")).arg("--version"))?);
        let amd_archs: Vec<&str> = AMD_ARCHS.iter().copied().filter(|a| clang_knows(&llvm_bin, a)).collect();
        for a in AMD_ARCHS.iter().filter(|a| !amd_archs.contains(a)) {
            println!("xtask: kernels: {clang_version} does not know {a}: no {a} code objects");
        }
        if amd_archs.is_empty() {
            return Err(format!("{clang_version} knows none of {AMD_ARCHS:?}"));
        }
        Ok(Self { nvcc, nvcc_version, llvm_bin, clang_version, amd_archs })
    }
}

/// The pip `--target` dir of the pinned nvcc (`MORI_NVCC_DIR`, else
/// `${XDG_CACHE_HOME:-$HOME/.cache}/mori-nvcc/VERSION`).
pub(crate) fn nvcc_dir() -> Result<PathBuf, String> {
    if let Some(d) = std::env::var_os("MORI_NVCC_DIR").filter(|v| !v.is_empty()) {
        return Ok(PathBuf::from(d));
    }
    Ok(util::cache_dir("", "mori-nvcc")?.join(NVCC_VERSION))
}

/// The pinned nvcc (pip-installed into the cache when missing) and its version line. The
/// wheels unpack into one toolkit tree (`nvidia/cu13`: bin/nvcc, nvvm/bin/cicc,
/// nvvm/libdevice, include/ with crt/), which `bin/nvcc.profile` finds relative to nvcc
/// itself, so nvcc needs no flags or environment; it preprocesses with the host g++.
fn ensure_nvcc() -> Result<(PathBuf, String), String> {
    crate::prereq::ensure_named(&["g++"])?;
    let dir = nvcc_dir()?;
    let tree = dir.join(NVCC_TREE);
    let nvcc = tree.join("bin/nvcc");
    if !nvcc.exists() {
        install_nvcc(&dir)?;
    }
    for need in [
        "bin/nvcc",
        "bin/ptxas",
        "bin/nvcc.profile",
        "nvvm/bin/cicc",
        "nvvm/libdevice/libdevice.10.bc",
        "include/cuda_runtime.h",
        "include/crt/host_config.h",
    ] {
        if !tree.join(need).exists() {
            return Err(format!("{} is incomplete ({need} is missing); remove it and run again", dir.display()));
        }
    }
    let v = output(Command::new(&nvcc).arg("--version"))?;
    let line = v.lines().rev().find(|l| l.contains("compilation tools")).unwrap_or("").trim().to_string();
    if !line.ends_with(&format!("V{NVCC_VERSION}")) {
        return Err(format!("{} is not nvcc {NVCC_VERSION} ({line:?}); remove {} and run again", nvcc.display(), dir.display()));
    }
    Ok((nvcc, line))
}

fn install_nvcc(dir: &Path) -> Result<(), String> {
    let pip_ok = || Command::new("python3").args(["-m", "pip", "--version"]).output().map(|o| o.status.success()).unwrap_or(false);
    if !pip_ok() {
        crate::prereq::ensure_named(&["python3-pip"])?;
    }
    let parent = dir.parent().ok_or("bad MORI_NVCC_DIR")?;
    std::fs::create_dir_all(parent).map_err(|e| format!("{}: {e}", parent.display()))?;
    let partial = parent.join(format!(".partial-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&partial);
    println!("xtask: kernels: pip install --target {} {}", dir.display(), NVCC_WHEELS.join(" "));
    let st = Command::new("python3")
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-cache-dir",
            "--disable-pip-version-check",
            "--root-user-action=ignore",
            "--target",
        ])
        .arg(&partial)
        .args(NVCC_WHEELS)
        .status()
        .map_err(|e| format!("python3 -m pip: {e}"))?;
    if !st.success() {
        let _ = std::fs::remove_dir_all(&partial);
        return Err(format!("pip install of the pinned nvcc wheels failed ({st})"));
    }
    // Rename into place; a concurrent install that won the race is as good.
    if std::fs::rename(&partial, dir).is_err() {
        let _ = std::fs::remove_dir_all(&partial);
        if !dir.join(NVCC_TREE).join("bin/nvcc").exists() {
            return Err(format!("could not move the nvcc install to {}", dir.display()));
        }
    }
    Ok(())
}

/// /usr/lib/llvm-N/bin of the Debian clang to use: clang-22 (installed with apt as root when
/// absent), else an installed clang-19 (no gfx950).
fn ensure_clang() -> Result<PathBuf, String> {
    let bin = |m: u32| PathBuf::from(format!("/usr/lib/llvm-{m}/bin"));
    let usable = |m: u32| bin(m).join("clang").exists() && bin(m).join("ld.lld").exists();
    let best = CLANG_MAJORS[0];
    let clang = format!("clang-{best}");
    let lld = format!("lld-{best}");
    if let Err(e) = crate::prereq::ensure_named(&[&clang, &lld]) {
        println!("xtask: kernels: {clang} is not installable here ({e})");
    }
    for &m in CLANG_MAJORS {
        if usable(m) {
            if m != best {
                println!("xtask: kernels: WARNING: using clang-{m}, not clang-{best}: the code objects differ from those built with clang-{best}");
            }
            return Ok(bin(m));
        }
    }
    Err(format!("no Debian clang-{best} + lld-{best}; install them (apt-get install clang-{best} lld-{best})"))
}

/// True when this clang accepts `arch` as an AMDGPU processor.
fn clang_knows(llvm_bin: &Path, arch: &str) -> bool {
    Command::new(llvm_bin.join("clang"))
        .args(["--target=amdgcn-amd-amdhsa", &format!("-mcpu={arch}"), "-nogpulib", "-x", "c", "-c", "-o", "/dev/null", "/dev/null"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

/// Builds every kernels/*.cu in `tmp` and returns prebuilt/'s would-be contents by file name.
fn build(kdir: &Path, tc: &Toolchains, tmp: &Path) -> Result<BTreeMap<String, Vec<u8>>, String> {
    let src = tmp.join("src");
    let out = tmp.join("out");
    for d in [&src, &out] {
        std::fs::create_dir_all(d).map_err(|e| format!("{}: {e}", d.display()))?;
    }
    // Sources: kernels/*.cu and the headers they include, copied so that the compilers only
    // ever see relative names.
    let mut sources = BTreeMap::new();
    for e in std::fs::read_dir(kdir).map_err(|e| format!("{}: {e}", kdir.display()))?.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if e.path().is_file() && [".cu", ".h", ".cuh"].iter().any(|x| name.ends_with(x)) {
            let bytes = std::fs::read(e.path()).map_err(|e| format!("{name}: {e}"))?;
            std::fs::write(src.join(&name), &bytes).map_err(|e| format!("{name}: {e}"))?;
            sources.insert(name, bytes);
        }
    }
    let kernels: Vec<&str> = sources.keys().filter_map(|n| n.strip_suffix(".cu")).collect();
    if kernels.is_empty() {
        return Err("no kernels/*.cu".into());
    }
    let path_env = format!("{}:{}", tc.llvm_bin.display(), std::env::var("PATH").unwrap_or_default());
    let mut artifacts = Vec::new();
    for k in &kernels {
        let cu = format!("{k}.cu");
        for (kind, ext) in [("-ptx", "ptx"), ("-cubin", "cubin")] {
            let name = format!("{k}.{CUDA_ARCH}.{ext}");
            compile(
                Command::new(&tc.nvcc)
                    .args([kind, &format!("-arch={CUDA_ARCH}"), "-O3", "-std=c++17", "-o", &format!("../out/{name}"), &cu])
                    .current_dir(&src),
            )?;
            artifacts.push(name);
        }
        for arch in &tc.amd_archs {
            let name = format!("{k}.{arch}.hsaco");
            let mut c = Command::new(tc.llvm_bin.join("clang"));
            c.args(["-x", "hip", &format!("--offload-arch={arch}"), "--offload-device-only", "-nogpulib", "-nogpuinc"])
                // -fuse-cuid=none: the default CUID hashes the output path into a symbol name.
                .args(["--no-gpu-bundle-output", "-fuse-cuid=none", "-O3", "-std=c++17", "-o", &format!("../out/{name}"), &cu])
                .env("PATH", &path_env)
                .current_dir(&src);
            compile(&mut c)?;
            artifacts.push(name);
        }
    }
    let mut built = BTreeMap::new();
    let mut needles: Vec<String> = vec![tmp.display().to_string(), kdir.display().to_string(), tc.nvcc.display().to_string()];
    if let Some(h) = std::env::var_os("HOME").filter(|h| h.len() > 1) {
        needles.push(format!("{}/", PathBuf::from(h).display()));
    }
    for name in artifacts {
        let bytes = std::fs::read(out.join(&name)).map_err(|e| format!("{name}: {e}"))?;
        if let Some(n) = needles.iter().find(|n| find(&bytes, n.as_bytes())) {
            return Err(format!("{name} contains a path of this machine ({n})"));
        }
        if name.ends_with(".ptx") {
            check_ptx(&name, &String::from_utf8_lossy(&bytes))?;
        }
        built.insert(name, bytes);
    }
    let manifest = manifest(tc, &sources, &built);
    built.insert("MANIFEST".to_string(), manifest.into_bytes());
    Ok(built)
}

fn compile(c: &mut Command) -> Result<(), String> {
    let o = c.output().map_err(|e| format!("{:?}: {e}", c.get_program()))?;
    if !o.status.success() {
        let args: Vec<String> = c.get_args().map(|a| a.to_string_lossy().into_owned()).collect();
        return Err(format!(
            "{} {} failed ({}):\n{}{}",
            c.get_program().to_string_lossy(),
            args.join(" "),
            o.status,
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        ));
    }
    Ok(())
}

/// The PTX must load on the GPU machine: `.version` <= 9.0, `.target sm_90`.
fn check_ptx(name: &str, ptx: &str) -> Result<(), String> {
    let field = |key: &str| ptx.lines().find_map(|l| l.trim().strip_prefix(key).map(|v| v.trim().to_string()));
    let version = field(".version ").ok_or(format!("{name}: no .version"))?;
    let (maj, min) = version.split_once('.').ok_or(format!("{name}: bad .version {version}"))?;
    let v = (maj.parse::<u32>().unwrap_or(u32::MAX), min.parse::<u32>().unwrap_or(u32::MAX));
    if v > MAX_PTX_ISA {
        return Err(format!("{name}: PTX .version {version} is newer than {}.{} (driver 580 / CUDA 13.0)", MAX_PTX_ISA.0, MAX_PTX_ISA.1));
    }
    if field(".target ").as_deref() != Some(CUDA_ARCH) {
        return Err(format!("{name}: PTX .target is not {CUDA_ARCH}"));
    }
    Ok(())
}

fn manifest(tc: &Toolchains, sources: &BTreeMap<String, Vec<u8>>, built: &BTreeMap<String, Vec<u8>>) -> String {
    let mut m = String::new();
    m.push_str("# Written by `cargo xtask kernels`; `cargo xtask kernels --check` rebuilds and compares.\n");
    m.push_str("# sha256 of the sources and artifacts; verify with: cd kernels && grep -v '^#' prebuilt/MANIFEST | sha256sum -c\n");
    m.push_str(&format!("# nvcc: {} (PyPI: {})\n", tc.nvcc_version, NVCC_WHEELS.join(" ")));
    m.push_str(&format!("# clang: {}\n", tc.clang_version));
    m.push_str(&format!("# targets: {CUDA_ARCH} (ptx, cubin), {} (hsaco)\n", tc.amd_archs.join(", ")));
    for (name, bytes) in sources {
        m.push_str(&format!("{}  {name}\n", hex(&sha256(bytes))));
    }
    for (name, bytes) in built {
        m.push_str(&format!("{}  prebuilt/{name}\n", hex(&sha256(bytes))));
    }
    m
}

/// Stale files of `prebuilt` against `built`: differing, missing, or not built any more.
fn compare(prebuilt: &Path, built: &BTreeMap<String, Vec<u8>>) -> Result<Vec<String>, String> {
    let mut stale = Vec::new();
    for (name, bytes) in built {
        match std::fs::read(prebuilt.join(name)) {
            Ok(old) if &old == bytes => {}
            Ok(_) => stale.push(format!("kernels/prebuilt/{name} (differs from a fresh build)")),
            Err(_) => stale.push(format!("kernels/prebuilt/{name} (missing)")),
        }
    }
    for name in existing(prebuilt)? {
        if !built.contains_key(&name) {
            stale.push(format!("kernels/prebuilt/{name} (no longer built)"));
        }
    }
    Ok(stale)
}

fn write(prebuilt: &Path, built: &BTreeMap<String, Vec<u8>>) -> Result<(), String> {
    std::fs::create_dir_all(prebuilt).map_err(|e| format!("{}: {e}", prebuilt.display()))?;
    for name in existing(prebuilt)? {
        if !built.contains_key(&name) {
            println!("xtask: kernels: removing kernels/prebuilt/{name} (no longer built)");
            std::fs::remove_file(prebuilt.join(&name)).map_err(|e| format!("{name}: {e}"))?;
        }
    }
    for (name, bytes) in built {
        let p = prebuilt.join(name);
        if std::fs::read(&p).ok().as_ref() != Some(bytes) {
            std::fs::write(&p, bytes).map_err(|e| format!("{}: {e}", p.display()))?;
        }
    }
    Ok(())
}

fn existing(dir: &Path) -> Result<Vec<String>, String> {
    match std::fs::read_dir(dir) {
        Ok(it) => Ok(it.flatten().filter(|e| e.path().is_file()).map(|e| e.file_name().to_string_lossy().into_owned()).collect()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(format!("{}: {e}", dir.display())),
    }
}

fn output(c: &mut Command) -> Result<String, String> {
    let o = c.output().map_err(|e| format!("{:?}: {e}", c.get_program()))?;
    if !o.status.success() {
        return Err(format!("{:?} failed: {}", c.get_program(), String::from_utf8_lossy(&o.stderr)));
    }
    Ok(String::from_utf8_lossy(&o.stdout).into_owned())
}

fn first_line(s: &str) -> String {
    s.lines().next().unwrap_or("").trim().to_string()
}

fn find(hay: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && hay.windows(needle.len()).any(|w| w == needle)
}

/// A temp dir removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> Result<Self, String> {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
        let p = std::env::temp_dir().join(format!("mori-kernels-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&p).map_err(|e| format!("{}: {e}", p.display()))?;
        Ok(Self(p))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Integer root: the largest x with x^k <= n (k = 2 or 3, n < 2^106).
fn iroot(n: u128, k: u32) -> u128 {
    let (mut lo, mut hi) = (0u128, 1u128 << 36);
    while lo < hi {
        let mid = (lo + hi).div_ceil(2);
        if mid.pow(k) <= n {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    lo
}

/// SHA-256 (FIPS 180-4). The constants are the first 32 fractional bits of the square roots
/// (initial hash) and cube roots (round constants) of the first primes, computed exactly.
fn sha256(data: &[u8]) -> [u8; 32] {
    let primes: Vec<u128> = (2u128..).filter(|n| (2..*n).take_while(|d| d * d <= *n).all(|d| n % d != 0)).take(64).collect();
    let k: Vec<u32> = primes.iter().map(|&p| iroot(p << 96, 3) as u32).collect();
    let mut h: Vec<u32> = primes[..8].iter().map(|&p| iroot(p << 64, 2) as u32).collect();
    let mut msg = data.to_vec();
    msg.push(0x80);
    while msg.len() % 64 != 56 {
        msg.push(0);
    }
    msg.extend_from_slice(&((data.len() as u64).wrapping_mul(8)).to_be_bytes());
    for block in msg.chunks_exact(64) {
        let mut w = [0u32; 64];
        for i in 0..16 {
            w[i] = u32::from_be_bytes([block[4 * i], block[4 * i + 1], block[4 * i + 2], block[4 * i + 3]]);
        }
        for i in 16..64 {
            let s0 = w[i - 15].rotate_right(7) ^ w[i - 15].rotate_right(18) ^ (w[i - 15] >> 3);
            let s1 = w[i - 2].rotate_right(17) ^ w[i - 2].rotate_right(19) ^ (w[i - 2] >> 10);
            w[i] = w[i - 16].wrapping_add(s0).wrapping_add(w[i - 7]).wrapping_add(s1);
        }
        let mut v = [h[0], h[1], h[2], h[3], h[4], h[5], h[6], h[7]];
        for i in 0..64 {
            let [a, b, c, d, e, f, g, hh] = v;
            let s1 = e.rotate_right(6) ^ e.rotate_right(11) ^ e.rotate_right(25);
            let ch = (e & f) ^ (!e & g);
            let t1 = hh.wrapping_add(s1).wrapping_add(ch).wrapping_add(k[i]).wrapping_add(w[i]);
            let s0 = a.rotate_right(2) ^ a.rotate_right(13) ^ a.rotate_right(22);
            let maj = (a & b) ^ (a & c) ^ (b & c);
            v = [t1.wrapping_add(s0.wrapping_add(maj)), a, b, c, d.wrapping_add(t1), e, f, g];
        }
        for (x, y) in h.iter_mut().zip(v) {
            *x = x.wrapping_add(y);
        }
    }
    let mut out = [0u8; 32];
    for (i, x) in h.iter().enumerate() {
        out[4 * i..4 * i + 4].copy_from_slice(&x.to_be_bytes());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sha256_known_vectors() {
        assert_eq!(hex(&sha256(b"")), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
        assert_eq!(hex(&sha256(b"abc")), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
        let long = b"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
        assert_eq!(hex(&sha256(long)), "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
        let million = vec![b'a'; 1_000_000];
        assert_eq!(hex(&sha256(&million)), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
    }

    #[test]
    fn ptx_version_gate() {
        assert!(check_ptx("k", ".version 9.0\n.target sm_90\n").is_ok());
        assert!(check_ptx("k", ".version 8.7\n.target sm_90\n").is_ok());
        assert!(check_ptx("k", ".version 9.5\n.target sm_90\n").is_err());
        assert!(check_ptx("k", ".version 9.0\n.target sm_100\n").is_err());
    }
}
