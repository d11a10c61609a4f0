//! `cargo xtask py <test | install | wheel> [--release]`: the Python package `mori_rs`
//! (crates/py) built by a pinned maturin in a virtual environment of its own.
//!
//! - `test` (run by `cargo xtask test`): builds the wheel (debug), installs it with pinned
//!   numpy and pytest into the venv, runs `pytest crates/py/tests`.
//! - `install`: the same build (release with `--release`) installed into the venv; prints how
//!   to activate it.
//! - `wheel`: only builds the wheel (release by default) into `target/wheels/` and prints its
//!   path: an abi3 wheel (CPython >= 3.10) that installs on the GPU machine too.
//!
//! The venv lives in `$MORI_PY_VENV`, else the user cache (`~/.cache/mori-py-venv`); `cargo
//! xtask bare-machine` removes it, so CI proves the path from a bare machine.

use crate::util;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Pinned tools: maturin builds the wheel; numpy is the package's one dependency; pytest runs
/// the tests.
const PINS: &[&str] = &["maturin==1.16.0", "numpy==2.4.6", "pytest==9.2.0"];

/// The venv directory.
pub(crate) fn venv_dir() -> Result<PathBuf, String> {
    util::cache_dir("MORI_PY_VENV", "mori-py-venv")
}

fn run(cmd: &mut Command, what: &str) -> Result<(), String> {
    println!("xtask: {what}");
    let st = cmd.status().map_err(|e| format!("{what}: {e}"))?;
    if st.success() {
        Ok(())
    } else {
        Err(format!("{what} failed ({st})"))
    }
}

/// Creates the venv when missing and installs the pinned tools into it; returns its python.
fn venv() -> Result<PathBuf, String> {
    let dir = venv_dir()?;
    let py = dir.join("bin/python");
    if !py.exists() {
        let host = ["python3", "python"].into_iter().find(|p| util::have(p)).ok_or("python3 is required (3.10 or newer, with venv)")?;
        run(Command::new(host).args(["-m", "venv"]).arg(&dir), &format!("{host} -m venv {}", dir.display()))?;
    }
    run(
        Command::new(&py).args(["-m", "pip", "install", "-q", "--disable-pip-version-check"]).args(PINS),
        &format!("pip install {}", PINS.join(" ")),
    )?;
    Ok(py)
}

/// Builds the wheel into target/wheels and returns its path.
fn build(py: &Path, release: bool) -> Result<PathBuf, String> {
    let root = util::workspace_root();
    let out = root.join("target/wheels");
    // Only this build's wheel is left, so the path below is unambiguous.
    if out.exists() {
        for e in std::fs::read_dir(&out).map_err(|e| format!("{}: {e}", out.display()))?.flatten() {
            if e.path().extension().is_some_and(|x| x == "whl") {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
    let maturin = py.with_file_name("maturin");
    let mut cmd = Command::new(&maturin);
    cmd.args(["build", "--quiet", "--interpreter"]).arg(py).arg("--out").arg(&out).current_dir(root.join("crates/py"));
    if release {
        cmd.arg("--release");
    }
    // The venv's python, so that maturin finds it without activation.
    cmd.env("VIRTUAL_ENV", py.parent().and_then(Path::parent).unwrap_or(py));
    run(&mut cmd, &format!("maturin build{} (crates/py)", if release { " --release" } else { "" }))?;
    std::fs::read_dir(&out)
        .map_err(|e| format!("{}: {e}", out.display()))?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .ok_or_else(|| format!("maturin left no wheel in {}", out.display()))
}

fn install(py: &Path, wheel: &Path) -> Result<(), String> {
    run(
        Command::new(py).args(["-m", "pip", "install", "-q", "--disable-pip-version-check", "--force-reinstall", "--no-deps"]).arg(wheel),
        &format!("pip install {}", wheel.display()),
    )
}

/// The usage line.
const USAGE: &str = "usage: cargo xtask py <test | install | wheel> [--release]   (venv: $MORI_PY_VENV, default ~/.cache/mori-py-venv)";

pub fn main(args: &[String]) -> Result<(), String> {
    if args.iter().any(|a| a == "--help" || a == "-h") {
        println!("{USAGE}");
        return Ok(());
    }
    let release = args.iter().any(|a| a == "--release");
    let verb = args.iter().find(|a| !a.starts_with("--")).map(String::as_str).unwrap_or("test");
    if let Some(bad) = args.iter().find(|a| a.starts_with("--") && *a != "--release") {
        return Err(format!("xtask py: unknown option {bad} ({USAGE})"));
    }
    util::ensure_build_deps()?;
    let py = venv()?;
    match verb {
        "test" => {
            let wheel = build(&py, release)?;
            install(&py, &wheel)?;
            // Run from the tests' folder (not the source tree), so `import mori_rs` takes the
            // installed wheel.
            let tests = util::workspace_root().join("crates/py/tests");
            run(
                Command::new(&py).args(["-m", "pytest", "-q", "-p", "no:cacheprovider"]).arg(&tests).current_dir(&tests),
                "pytest crates/py/tests",
            )
        }
        "install" => {
            let wheel = build(&py, release)?;
            install(&py, &wheel)?;
            println!("xtask: mori_rs installed; use it with: source {}/bin/activate", venv_dir()?.display());
            Ok(())
        }
        "wheel" => {
            let wheel = build(&py, true)?;
            println!("{}", wheel.display());
            Ok(())
        }
        other => Err(format!("xtask py: unknown task {other:?} ({USAGE})")),
    }
}
