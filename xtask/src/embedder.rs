//! `cargo xtask embedder-check`: builds a fresh cargo project that depends on the facade as a
//! new embedder would (`mori = { path = ... }`, default features: tcp only), runs it (one tcp
//! write between two engines on loopback), and checks with `cargo tree` that no GPU or
//! ibverbs binding was compiled. `.ci/run` runs it right after `bare-machine`, where neither
//! cmake nor libclang is installed, so a build that needed them fails there.

use std::path::Path;
use std::process::Command;
use std::time::Instant;

/// Crates a host-only (default-feature) build of `mori` must not contain.
const FORBIDDEN: &[&str] = &["sideway", "rdma-mummy-sys", "cudarc", "cubecl-hip-sys", "mori-gpu", "mori-io-rdma"];

const MAIN_RS: &str = r#"use mori::io::{BackendConfig, EngineConfig, EngineDesc, IoEngine, MemLoc, MemoryDesc, TcpConfig};
use std::time::Duration;

fn main() -> Result<(), mori::io::IoError> {
    let a = IoEngine::new("a", EngineConfig::new("127.0.0.1", 0)?)?;
    let b = IoEngine::new("b", EngineConfig::new("127.0.0.1", 0)?)?;
    for e in [&a, &b] {
        e.create_backend(BackendConfig::Tcp(TcpConfig::from_env()?))?;
    }
    let mut src: Vec<u8> = (0..=255u8).cycle().take(1 << 20).collect();
    let mut dst = vec![0u8; 1 << 20];
    // SAFETY: both buffers outlive their registrations.
    let s = unsafe { a.register_memory(src.as_mut_ptr(), src.len(), MemLoc::Host { numa: None })? };
    let d = unsafe { b.register_memory(dst.as_mut_ptr(), dst.len(), MemLoc::Host { numa: None })? };
    a.register_remote_engine(EngineDesc::unpack(&b.desc().pack())?)?;
    let remote = MemoryDesc::unpack(&d.pack())?;
    a.write(&s, 0, &remote, 0, 1 << 20, a.allocate_transfer_uid()).wait_for(Duration::from_secs(30))?;
    b.deregister_memory(&d)?;
    a.deregister_memory(&s)?;
    assert!(src == dst, "the bytes differ");
    println!("embedder: 1 MiB written over tcp, bytes equal");
    Ok(())
}
"#;

pub fn run(args: &[String]) -> Result<(), String> {
    if !args.is_empty() {
        return Err("embedder-check takes no arguments".into());
    }
    let root = crate::util::workspace_root();
    let dir = root.join("target/embedder-check");
    let src = dir.join("src");
    std::fs::create_dir_all(&src).map_err(|e| format!("{}: {e}", src.display()))?;
    let manifest = format!(
        "[package]\nname = \"embedder\"\nversion = \"0.0.0\"\nedition = \"2021\"\npublish = false\n\n[dependencies]\nmori = {{ path = {:?} }}\n\n[workspace]\n",
        root.display().to_string()
    );
    write(&dir.join("Cargo.toml"), &manifest)?;
    write(&src.join("main.rs"), MAIN_RS)?;
    // The workspace's lock file pins the same versions the workspace was tested with.
    std::fs::copy(root.join("Cargo.lock"), dir.join("Cargo.lock")).map_err(|e| format!("Cargo.lock: {e}"))?;
    let libclang = crate::prereq::find_libclang(&crate::prereq::libclang_search_dirs());
    println!(
        "xtask: embedder-check: cmake is {}on PATH; libclang (where clang-sys looks): {}",
        if crate::util::have("cmake") { "" } else { "not " },
        libclang.map(|p| p.display().to_string()).unwrap_or_else(|| "none".into())
    );
    let t0 = Instant::now();
    cargo_in(&dir, &["build", "--quiet"])?;
    let built = t0.elapsed();
    let tree = cargo_out(&dir, &["tree", "--edges", "normal,build", "--prefix", "none", "--format", "{p}"])?;
    let mut crates: Vec<&str> = tree.lines().filter_map(|l| l.split_whitespace().next()).collect();
    crates.sort();
    crates.dedup();
    let bad: Vec<&str> = crates.iter().copied().filter(|c| FORBIDDEN.contains(c)).collect();
    if !bad.is_empty() {
        return Err(format!("a default-feature build of mori compiles {} (features must keep them out)", bad.join(", ")));
    }
    let exe = dir.join("target/debug/embedder");
    let size = std::fs::metadata(&exe).map(|m| m.len()).map_err(|e| format!("{}: {e}", exe.display()))?;
    let st = Command::new(&exe).status().map_err(|e| format!("{}: {e}", exe.display()))?;
    if !st.success() {
        return Err(format!("the embedder program failed ({st})"));
    }
    println!(
        "xtask: embedder-check: OK: built in {:.1} s, {} crates, none of {}; debug binary {:.1} MB",
        built.as_secs_f64(),
        crates.len(),
        FORBIDDEN.join(", "),
        size as f64 / 1e6
    );
    Ok(())
}

fn write(p: &Path, s: &str) -> Result<(), String> {
    std::fs::write(p, s).map_err(|e| format!("{}: {e}", p.display()))
}

fn cargo_cmd(dir: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    c.args(args).current_dir(dir).env_remove("CARGO_TARGET_DIR");
    c
}

fn cargo_in(dir: &Path, args: &[&str]) -> Result<(), String> {
    println!("xtask: embedder-check: cargo {}", args.join(" "));
    let st = cargo_cmd(dir, args).status().map_err(|e| format!("cargo: {e}"))?;
    if st.success() {
        Ok(())
    } else {
        Err(format!("cargo {} in {} failed ({st})", args.join(" "), dir.display()))
    }
}

fn cargo_out(dir: &Path, args: &[&str]) -> Result<String, String> {
    let o = cargo_cmd(dir, args).output().map_err(|e| format!("cargo: {e}"))?;
    if !o.status.success() {
        return Err(format!("cargo {} failed: {}", args.join(" "), String::from_utf8_lossy(&o.stderr)));
    }
    Ok(String::from_utf8_lossy(&o.stdout).into_owned())
}
