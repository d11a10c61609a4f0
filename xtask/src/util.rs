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

/// `apt-get update` then `apt-get install` of `pkgs`, as root (otherwise an error saying what
/// to install). apt's output goes to stderr, so a command's stdout stays its own.
pub fn apt_install(pkgs: &[&str]) -> Result<(), String> {
    if pkgs.is_empty() {
        return Ok(());
    }
    if !is_root() {
        return Err(format!("missing {}; install them (apt-get install {})", pkgs.join(", "), pkgs.join(" ")));
    }
    eprintln!("xtask: apt-get install {}", pkgs.join(" "));
    let apt = |args: &[&str]| {
        Command::new("apt-get")
            .args(args)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .stdout(std::process::Stdio::from(std::io::stderr()))
            .status()
            .map_err(|e| format!("apt-get: {e}"))
    };
    apt(&["update", "-qq"])?;
    let mut a = vec!["install", "-y", "-qq", "--no-install-recommends"];
    a.extend_from_slice(pkgs);
    if apt(&a)?.success() {
        Ok(())
    } else {
        Err(format!("apt-get install {} failed", pkgs.join(" ")))
    }
}

/// Installs the Debian package of every (tool, package) whose tool is missing.
pub fn ensure_tools(tools: &[(&str, &str)]) -> Result<(), String> {
    let missing: Vec<&str> = tools.iter().filter(|(t, _)| !have(t)).map(|(_, p)| *p).collect();
    apt_install(&missing)
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
        apt_install(&["libclang-dev"]).map_err(|e| format!("libclang (needed to build the ibverbs bindings): {e}"))?;
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
