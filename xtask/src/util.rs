//! Helpers: running commands, installing Debian packages.

use std::process::Command;

/// `cargo ARGS` from the workspace root ($CARGO when set), announced on stdout.
fn cargo_command(args: &[&str]) -> Command {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    println!("xtask: cargo {}", args.join(" "));
    let mut c = Command::new(cargo);
    c.args(args).current_dir(workspace_root());
    c
}

/// Ok for a successful exit, else an error naming the command and its status.
fn cargo_status(args: &[&str], st: std::process::ExitStatus) -> Result<(), String> {
    if st.success() {
        Ok(())
    } else {
        Err(format!("cargo {} failed ({st})", args.join(" ")))
    }
}

/// Runs `cargo` with `args` from the workspace root, failing on a non-zero exit.
pub fn cargo(args: &[&str]) -> Result<(), String> {
    let st = cargo_command(args).status().map_err(|e| format!("cargo: {e}"))?;
    cargo_status(args, st)
}

/// Tests counted from libtest's `test result:` lines.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct TestCounts {
    pub passed: u64,
    pub failed: u64,
    pub ignored: u64,
}

impl TestCounts {
    /// Adds the counts of one `test result: ok. 3 passed; 0 failed; 1 ignored; ...` line (any
    /// other line adds nothing).
    pub fn add_line(&mut self, line: &str) {
        let Some(rest) = line.strip_prefix("test result: ") else { return };
        for part in rest.split(['.', ';']) {
            let mut w = part.split_whitespace();
            let (Some(n), Some(what)) = (w.next().and_then(|n| n.parse::<u64>().ok()), w.next()) else { continue };
            match what {
                "passed" => self.passed += n,
                "failed" => self.failed += n,
                "ignored" => self.ignored += n,
                _ => {}
            }
        }
    }
}

/// [`cargo`] with the command's standard output passed through line by line and its libtest
/// result lines added to `counts` (also when it fails).
pub fn cargo_counted(args: &[&str], counts: &mut TestCounts) -> Result<(), String> {
    use std::io::BufRead;
    let mut child = cargo_command(args).stdout(std::process::Stdio::piped()).spawn().map_err(|e| format!("cargo: {e}"))?;
    if let Some(out) = child.stdout.take() {
        // Read as bytes (a line that is not UTF-8 is shown lossily) to the end, so that the
        // child never blocks on a full pipe before the wait below.
        for line in std::io::BufReader::new(out).split(b'\n').map_while(Result::ok) {
            let line = String::from_utf8_lossy(&line);
            println!("{line}");
            counts.add_line(&line);
        }
    }
    let st = child.wait().map_err(|e| format!("cargo: {e}"))?;
    cargo_status(args, st)
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

/// `apt-get ARGS` (non-interactive; its output on stderr, so a command's stdout stays its own).
/// Another apt run holding the package lock (a second xtask, unattended upgrades) is waited
/// for up to 10 minutes instead of failing at once.
pub fn apt_get(args: &[&str]) -> Result<(), String> {
    eprintln!("xtask: apt-get {}", args.join(" "));
    let st = Command::new("apt-get")
        .args(["-o", "DPkg::Lock::Timeout=600"])
        .args(args)
        .env("DEBIAN_FRONTEND", "noninteractive")
        .stdout(std::process::Stdio::from(std::io::stderr()))
        .status()
        .map_err(|e| format!("apt-get: {e}"))?;
    if st.success() {
        Ok(())
    } else {
        Err(format!("apt-get {} failed ({st})", args.join(" ")))
    }
}

/// `apt-get update` then `apt-get install` of `pkgs`, as root (otherwise an error saying what
/// to install).
pub fn apt_install(pkgs: &[&str]) -> Result<(), String> {
    if pkgs.is_empty() {
        return Ok(());
    }
    if !is_root() {
        return Err(format!("missing {}; install them (apt-get install {})", pkgs.join(", "), pkgs.join(" ")));
    }
    apt_get(&["update", "-qq"])?;
    apt_get(&[&["install", "-y", "-qq", "--no-install-recommends"], pkgs].concat())
}

/// What building the workspace needs beyond Rust: cmake and libclang for the ibverbs bindings
/// (`sideway`/`rdma-mummy-sys`; the binaries load libibverbs at run time, it is not needed to
/// build). Installs them with apt as root; otherwise says what to install.
pub fn ensure_build_deps() -> Result<(), String> {
    crate::prereq::ensure_group(crate::prereq::Group::Build).map_err(|e| format!("building the ibverbs bindings (cmake, libclang): {e}"))
}

/// `$OVERRIDE` when set and not empty (`override_var` may be ""), else
/// `$XDG_CACHE_HOME/SUB`, else `$HOME/.cache/SUB`.
pub fn cache_dir(override_var: &str, sub: &str) -> Result<std::path::PathBuf, String> {
    let var = |n: &str| std::env::var_os(n).filter(|v| !v.is_empty() && !n.is_empty()).map(std::path::PathBuf::from);
    if let Some(p) = var(override_var) {
        return Ok(p);
    }
    match (var("XDG_CACHE_HOME"), var("HOME")) {
        (Some(x), _) => Ok(x.join(sub)),
        (None, Some(h)) => Ok(h.join(".cache").join(sub)),
        _ => Err(format!(
            "no cache dir for {sub}: set XDG_CACHE_HOME or HOME{}",
            if override_var.is_empty() { String::new() } else { format!(" (or {override_var})") }
        )),
    }
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

#[cfg(test)]
mod tests {
    use super::TestCounts;

    #[test]
    fn result_lines_add_up_and_other_lines_add_nothing() {
        let mut c = TestCounts::default();
        c.add_line("test result: ok. 24 passed; 0 failed; 3 ignored; 0 measured; 24 filtered out; finished in 43.47s");
        c.add_line("test result: FAILED. 5 passed; 2 failed; 0 ignored; 0 measured; 0 filtered out; finished in 1.00s");
        c.add_line("running 24 tests");
        c.add_line("test foo ... ok");
        assert_eq!(c, TestCounts { passed: 29, failed: 2, ignored: 3 });
    }
}
