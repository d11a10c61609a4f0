//! `cargo xtask bare-machine --yes`: puts this machine back into the state of the project's
//! bare image for everything the xtask installs, so the next command goes through the
//! fresh-machine path (`.ci/run` runs it first, on every CI run).
//!
//! It purges the Debian packages of [`crate::prereq::PACKAGES`] that the image does not ship
//! and that are installed, then `apt-get autoremove --purge` (which removes nothing on the bare
//! image, so it takes only what those packages pulled in), and removes the caches the xtask
//! fills: the pinned nvcc wheels, the SoftRoCE guest's kernel, initramfs and QEMU, and the
//! Python venv of `cargo xtask py`. Cargo's
//! own registry and build caches are kept: cargo fetches what it misses by itself.
//!
//! Why this and not a fresh chroot or mount namespace: a chroot would need the whole image,
//! Rust toolchain included, laid out again on every run, and an overlay namespace still shows
//! whatever the host has installed unless it is removed anyway; purging exactly what the table
//! names returns the package set the image has, on these 2-core machines, for the cost of the
//! downloads.

use crate::prereq::{dpkg_installed, PACKAGES};
use crate::util::apt_get as apt;
use std::time::Instant;

pub fn run(args: &[String]) -> Result<(), String> {
    if args.iter().map(String::as_str).ne(["--yes"]) {
        return Err("bare-machine purges Debian packages and caches: run it as `cargo xtask bare-machine --yes` (root only)".into());
    }
    if !crate::util::is_root() {
        return Err("bare-machine needs root (it runs apt-get purge)".into());
    }
    let t0 = Instant::now();
    let purge: Vec<&str> = PACKAGES.iter().filter(|p| !p.in_image && dpkg_installed(p.name)).map(|p| p.name).collect();
    if purge.is_empty() {
        println!("xtask: bare-machine: none of the packages the xtask installs is installed");
    } else {
        apt(&[&["purge", "-y", "-qq"], purge.as_slice()].concat())?;
    }
    apt(&["autoremove", "--purge", "-y", "-qq"])?;
    let still: Vec<&str> = purge.iter().copied().filter(|p| dpkg_installed(p)).collect();
    if !still.is_empty() {
        return Err(format!("bare-machine: still installed after the purge: {}", still.join(" ")));
    }
    for dir in [crate::kernels::nvcc_dir()?, crate::softroce::cache_dir()?, crate::python::venv_dir()?] {
        if dir.exists() {
            println!("xtask: bare-machine: rm -r {}", dir.display());
            std::fs::remove_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        }
    }
    println!("xtask: bare-machine: done in {:.1} s", t0.elapsed().as_secs_f64());
    Ok(())
}
