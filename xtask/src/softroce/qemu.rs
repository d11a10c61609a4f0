//! QEMU for the guest, without installing it.
//!
//! Debian 12's `qemu-system-x86` (7.2) cannot be installed next to the newer `qemu-utils` the
//! project's machine image ships: that `qemu-utils` (10.x) Breaks `qemu-system-common` < 8.0,
//! so apt would remove `qemu-img` from the machine. Instead, when no `qemu-system-x86_64` is on
//! PATH, the packages apt would install for it are fetched with `apt-get download` and unpacked
//! (`dpkg-deb -x`) into the cache; the binary runs from there with its libraries on
//! `LD_LIBRARY_PATH` and its firmware on `-L`. Nothing on the machine changes.

use super::{output, status, TempDir};
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// How to start QEMU: the program, `LD_LIBRARY_PATH` (unpacked only) and firmware dirs.
pub(super) struct Qemu {
    pub program: PathBuf,
    pub lib_path: Option<String>,
    pub firmware: Vec<PathBuf>,
}

impl Qemu {
    /// A command for QEMU (under `setpriv --pdeathsig KILL` when `wrap`), with its library
    /// path and `-L` firmware dirs set.
    pub fn command(&self, wrap: bool) -> Command {
        let mut c = if wrap {
            let mut c = Command::new("setpriv");
            c.args(["--pdeathsig", "KILL", "--"]).arg(&self.program);
            c
        } else {
            Command::new(&self.program)
        };
        if let Some(p) = &self.lib_path {
            c.env("LD_LIBRARY_PATH", p);
        }
        for d in &self.firmware {
            c.arg("-L").arg(d);
        }
        c
    }
}

const BIN: &str = "qemu-system-x86_64";

/// The installed QEMU, or the one unpacked in `cache/qemu` (unpacked now if absent).
pub(super) fn ensure(cache: &Path) -> Result<Qemu, String> {
    if crate::util::have(BIN) {
        return Ok(Qemu { program: BIN.into(), lib_path: None, firmware: Vec::new() });
    }
    let root = cache.join("qemu/root");
    let program = root.join("usr/bin").join(BIN);
    let libs = ["lib/x86_64-linux-gnu", "usr/lib/x86_64-linux-gnu"].map(|d| root.join(d).display().to_string());
    let mut lib_path = libs.join(":");
    if let Some(old) = std::env::var_os("LD_LIBRARY_PATH").filter(|v| !v.is_empty()) {
        lib_path = format!("{lib_path}:{}", old.to_string_lossy());
    }
    let firmware = ["usr/share/qemu", "usr/share/seabios"].map(|d| root.join(d)).to_vec();
    let q = Qemu { program, lib_path: Some(lib_path), firmware };
    // Unpacked against the libraries the machine had then: unpack again if it no longer starts.
    let starts = |q: &Qemu| q.program.exists() && output(q.command(false).arg("--version"), "qemu --version").is_ok();
    if !starts(&q) {
        unpack(cache)?;
        if !starts(&q) {
            return Err(format!(
                "the unpacked {} does not start: {}",
                q.program.display(),
                output(q.command(false).arg("--version"), "qemu --version").err().unwrap_or_default()
            ));
        }
    }
    Ok(q)
}

/// The packages `apt-get install qemu-system-x86` would install here (`-s`: simulated).
fn packages() -> Result<Vec<String>, String> {
    let sim = output(
        Command::new("apt-get").args(["install", "-s", "--no-install-recommends", "qemu-system-x86"]),
        "apt-get install -s qemu-system-x86",
    )?;
    let pkgs: Vec<String> =
        sim.lines().filter_map(|l| l.strip_prefix("Inst ")).filter_map(|l| l.split_whitespace().next()).map(str::to_string).collect();
    if pkgs.iter().any(|p| p == "qemu-system-x86") {
        Ok(pkgs)
    } else {
        Err(format!("apt-get install -s qemu-system-x86 plans no qemu-system-x86 (stale package lists? {} packages)", pkgs.len()))
    }
}

fn unpack(cache: &Path) -> Result<(), String> {
    let pkgs = match packages() {
        Ok(p) => p,
        Err(_) => {
            status(Command::new("apt-get").args(["update", "-qq"]), "apt-get update")?;
            packages()?
        }
    };
    log!("unpacking QEMU into {} (not installed: see xtask/src/softroce/qemu.rs): {}", cache.join("qemu").display(), pkgs.join(" "));
    // In the temp dir, open to apt's _apt user (see ensure_kernel).
    let dl = TempDir::create("qemu-dl")?;
    let _ = fs::set_permissions(&dl.0, fs::Permissions::from_mode(0o777));
    status(Command::new("apt-get").args(["download", "-q"]).args(&pkgs).current_dir(&dl.0), "apt-get download (QEMU)")?;
    let partial = cache.join(format!("qemu.partial-{}", std::process::id()));
    let _ = fs::remove_dir_all(&partial);
    let root = partial.join("root");
    fs::create_dir_all(&root).map_err(|e| format!("{}: {e}", root.display()))?;
    let debs: Vec<PathBuf> = fs::read_dir(&dl.0)
        .map_err(|e| format!("{}: {e}", dl.0.display()))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "deb"))
        .collect();
    if debs.len() != pkgs.len() {
        return Err(format!("apt-get download left {} .deb files for {} packages", debs.len(), pkgs.len()));
    }
    for deb in &debs {
        status(Command::new("dpkg-deb").arg("-x").arg(deb).arg(&root), &format!("dpkg-deb -x {}", deb.display()))?;
    }
    fs::write(partial.join("packages"), pkgs.join("\n") + "\n").map_err(|e| format!("{}: {e}", partial.display()))?;
    let dst = cache.join("qemu");
    let _ = fs::remove_dir_all(&dst);
    fs::rename(&partial, &dst).map_err(|e| format!("{} -> {}: {e}", partial.display(), dst.display()))
}
