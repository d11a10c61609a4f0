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
