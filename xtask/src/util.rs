//! Helpers: running commands, installing Debian packages.

use std::process::Command;

/// Runs `cargo` with `args` from the workspace root, failing on a non-zero exit.
pub fn cargo(args: &[&str]) -> Result<(), String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    println!("xtask: cargo {}", args.join(" "));
    let st = Command::new(cargo).args(args).current_dir(workspace_root()).status().map_err(|e| format!("cargo: {e}"))?;
    if st.success() {
        Ok(())
    } else {
        Err(format!("cargo {} failed ({st})", args.join(" ")))
    }
}

/// The workspace root (parent of xtask/).
pub fn workspace_root() -> std::path::PathBuf {
    let here = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    here.parent().map(|p| p.to_path_buf()).unwrap_or(here)
}

/// True when running as root.
pub fn is_root() -> bool {
    Command::new("id").arg("-u").output().map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0").unwrap_or(false)
}

/// True when `tool` is on PATH.
pub fn have(tool: &str) -> bool {
    Command::new("sh").args(["-c", &format!("command -v {tool} >/dev/null 2>&1")]).status().map(|s| s.success()).unwrap_or(false)
}

/// Installs the Debian package of every (tool, package) whose tool is missing.
pub fn ensure_tools(tools: &[(&str, &str)]) -> Result<(), String> {
    let missing: Vec<&str> = tools.iter().filter(|(t, _)| !have(t)).map(|(_, p)| *p).collect();
    if missing.is_empty() {
        return Ok(());
    }
    if !is_root() {
        return Err(format!("missing {}; install them (apt-get install {})", missing.join(", "), missing.join(" ")));
    }
    println!("xtask: apt-get install {}", missing.join(" "));
    let run = |args: &[&str]| {
        Command::new("apt-get")
            .args(args)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()
            .map_err(|e| format!("apt-get: {e}"))
    };
    run(&["update", "-qq"])?;
    let mut a = vec!["install", "-y", "-qq", "--no-install-recommends"];
    a.extend(missing.iter().copied());
    let st = run(&a)?;
    if st.success() {
        Ok(())
    } else {
        Err(format!("apt-get install {} failed", missing.join(" ")))
    }
}

/// True when a libclang shared library is installed (bindgen needs it to build the ibverbs
/// bindings of `sideway`).
fn have_libclang() -> bool {
    let dirs = ["/usr/lib", "/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu"];
    let direct = dirs.iter().any(|d| {
        std::fs::read_dir(d)
            .map(|it| it.flatten().any(|e| e.file_name().to_string_lossy().starts_with("libclang")))
            .unwrap_or(false)
    });
    direct
        || std::fs::read_dir("/usr/lib")
            .map(|it| {
                it.flatten().filter(|e| e.file_name().to_string_lossy().starts_with("llvm-")).any(|e| {
                    std::fs::read_dir(e.path().join("lib"))
                        .map(|l| l.flatten().any(|f| f.file_name().to_string_lossy().starts_with("libclang")))
                        .unwrap_or(false)
                })
            })
            .unwrap_or(false)
}

/// What building the workspace needs beyond Rust: cmake and libclang for the ibverbs bindings
/// (`sideway`/`rdma-mummy-sys`; the binaries load libibverbs at run time, it is not needed to
/// build). Installs them with apt as root; otherwise says what to install.
pub fn ensure_build_deps() -> Result<(), String> {
    ensure_tools(&[("cmake", "cmake")])?;
    if !have_libclang() {
        if !is_root() {
            return Err("libclang is missing (needed to build the ibverbs bindings); install it: apt-get install libclang-dev".into());
        }
        println!("xtask: apt-get install libclang-dev");
        let st = Command::new("apt-get")
            .args(["install", "-y", "-qq", "--no-install-recommends", "libclang-dev"])
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()
            .map_err(|e| format!("apt-get: {e}"))?;
        if !st.success() {
            let _ = Command::new("apt-get").args(["update", "-qq"]).status();
            let st = Command::new("apt-get")
                .args(["install", "-y", "-qq", "--no-install-recommends", "libclang-dev"])
                .env("DEBIAN_FRONTEND", "noninteractive")
                .status()
                .map_err(|e| format!("apt-get: {e}"))?;
            if !st.success() {
                return Err("apt-get install libclang-dev failed".into());
            }
        }
    }
    Ok(())
}

/// Runs `cargo` with `args` and returns its stdout (stderr passes through).
pub fn cargo_stdout(args: &[&str]) -> Result<String, String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let o = Command::new(cargo)
        .args(args)
        .current_dir(workspace_root())
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| format!("cargo: {e}"))?;
    if !o.status.success() {
        return Err(format!("cargo {} failed ({})", args.join(" "), o.status));
    }
    Ok(String::from_utf8_lossy(&o.stdout).into_owned())
}
