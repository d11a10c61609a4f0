//! What the xtask installs on a machine, in one table, and how it looks for it.
//!
//! Every Debian package any task installs is named in [`PACKAGES`] with the group that needs
//! it and whether the project's bare machine image already ships it. The installers take
//! their lists from here, and `cargo xtask bare-machine --yes` (run first by `.ci/run`)
//! purges the ones the image lacks, so that every CI run goes through the fresh-machine path.
//!
//! Detection: as root a package is judged present by `dpkg -s` alone (a probe for files can
//! be fooled: the image's `libclang-cpp.so.14` is not the libclang bindgen loads). Not root,
//! nothing can be installed, so the files are probed the way their consumer looks for them
//! ([`find_libclang`] follows clang-sys) and a missing one is named with its package.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Which task needs a package.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Group {
    /// Building the workspace (sideway's ibverbs bindings: cmake + bindgen).
    Build,
    /// The network-namespace tests.
    Netns,
    /// The SoftRoCE guest (host tools the guest runs over 9p, the static busybox of its
    /// initramfs). QEMU itself is unpacked into the guest's cache, not installed: see softroce.rs.
    Softroce,
    /// `cargo xtask kernels`: the host compiler nvcc preprocesses with, pip for the pinned
    /// nvcc wheels, Debian clang + lld for the HIP code objects.
    Kernels,
    /// `cargo xtask compare-tcp`: the peers measured in the same run.
    Compare,
}

/// One Debian package the xtask may install.
#[derive(Clone, Copy, Debug)]
pub struct Package {
    /// Debian package name.
    pub name: &'static str,
    /// Who needs it.
    pub group: Group,
    /// A file or command whose presence means the package's payload is there (the not-root
    /// probe); `None` for libclang, probed by [`find_libclang`].
    pub tool: Option<&'static str>,
    /// The bare image of the project's machines ships it (never purged by `bare-machine`).
    pub in_image: bool,
}

const fn pkg(name: &'static str, group: Group, tool: Option<&'static str>, in_image: bool) -> Package {
    Package { name, group, tool, in_image }
}

/// The clang major version used for the HIP code objects (see kernels.rs).
pub const CLANG_MAJOR: u32 = 22;

/// Everything the xtask installs with apt.
pub const PACKAGES: &[Package] = &[
    pkg("cmake", Group::Build, Some("cmake"), false),
    pkg("libclang-dev", Group::Build, None, false),
    pkg("iproute2", Group::Netns, Some("ip"), true),
    pkg("busybox-static", Group::Softroce, None, false),
    pkg("ibverbs-providers", Group::Softroce, None, false),
    pkg("ibverbs-utils", Group::Softroce, Some("ibv_devinfo"), false),
    pkg("perftest", Group::Softroce, Some("ib_write_bw"), false),
    pkg("rdmacm-utils", Group::Softroce, Some("rping"), false),
    pkg("xz-utils", Group::Softroce, Some("xz"), true),
    pkg("g++", Group::Kernels, Some("g++"), true),
    pkg("python3-pip", Group::Kernels, None, true),
    pkg("clang-22", Group::Kernels, Some("/usr/lib/llvm-22/bin/clang"), false),
    pkg("lld-22", Group::Kernels, Some("/usr/lib/llvm-22/bin/ld.lld"), false),
    pkg("iperf3", Group::Compare, Some("iperf3"), false),
    pkg("ucx-utils", Group::Compare, Some("ucx_perftest"), false),
];

/// The packages of `group`.
pub fn group(g: Group) -> impl Iterator<Item = &'static Package> {
    PACKAGES.iter().filter(move |p| p.group == g)
}

/// `dpkg -s NAME` says "install ok installed".
pub fn dpkg_installed(name: &str) -> bool {
    Command::new("dpkg")
        .args(["-s", name])
        .stderr(Stdio::null())
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).lines().any(|l| l == "Status: install ok installed"))
        .unwrap_or(false)
}

/// The not-root probe of one package's payload.
fn payload_present(p: &Package) -> bool {
    match p.tool {
        Some(t) if t.starts_with('/') => Path::new(t).exists(),
        Some(t) => crate::util::have(t),
        None if p.name == "libclang-dev" => find_libclang(&libclang_search_dirs()).is_some(),
        None => dpkg_installed(p.name),
    }
}

/// Installs the packages of `pkgs` that are absent: as root, judged by `dpkg -s` and
/// installed with apt; otherwise judged by their files, and an error names what to install.
pub fn ensure<'a>(pkgs: impl IntoIterator<Item = &'a Package>) -> Result<(), String> {
    let root = crate::util::is_root();
    let missing: Vec<&str> =
        pkgs.into_iter().filter(|p| if root { !dpkg_installed(p.name) } else { !payload_present(p) }).map(|p| p.name).collect();
    crate::util::apt_install(&missing)
}

/// Installs the packages of `g` that are absent (see [`ensure`]).
pub fn ensure_group(g: Group) -> Result<(), String> {
    ensure(group(g))
}

/// Named packages of the table (installs them when absent; an unknown name is a bug here).
pub fn ensure_named(names: &[&str]) -> Result<(), String> {
    let pkgs: Vec<&Package> = names
        .iter()
        .map(|n| PACKAGES.iter().find(|p| p.name == *n).ok_or(format!("xtask: {n} is not in prereq::PACKAGES")))
        .collect::<Result<_, _>>()?;
    ensure(pkgs)
}

// ------------------------------------------------------------------------- libclang

/// A file name clang-sys (bindgen's loader, `runtime` feature) takes for libclang on Linux:
/// `libclang.so`, `libclang-*.so`, `libclang.so.*`, `libclang-*.so.*`, and never the C++ API
/// library `libclang-cpp*` (any name containing `-cpp.`).
pub fn is_libclang_name(name: &str) -> bool {
    if name.contains("-cpp.") {
        return false;
    }
    if name == "libclang.so" || name.starts_with("libclang.so.") {
        return true;
    }
    match name.strip_prefix("libclang-") {
        Some(rest) => rest.ends_with(".so") || rest.contains(".so."),
        None => false,
    }
}

/// The first regular file (or link to one) in `dirs` whose name [`is_libclang_name`].
pub fn find_libclang(dirs: &[PathBuf]) -> Option<PathBuf> {
    dirs.iter().find_map(|d| {
        let mut names: Vec<PathBuf> = std::fs::read_dir(d)
            .ok()?
            .flatten()
            .filter(|e| is_libclang_name(&e.file_name().to_string_lossy()))
            .map(|e| e.path())
            .filter(|p| p.is_file())
            .collect();
        names.sort();
        names.into_iter().next()
    })
}

/// The directories clang-sys searches, in its order: only `LIBCLANG_PATH` when it is set;
/// else `llvm-config --prefix`'s bin, lib and lib64, `LD_LIBRARY_PATH`, `LIBRARY_PATH`, then
/// the globs `/usr/local/llvm*/lib*`, `/usr/local/lib*/*/*`, `/usr/local/lib*/*`,
/// `/usr/local/lib*`, `/usr/lib*/*/*`, `/usr/lib*/*`, `/usr/lib*`.
pub fn libclang_search_dirs() -> Vec<PathBuf> {
    if let Some(p) = std::env::var_os("LIBCLANG_PATH") {
        let p = PathBuf::from(p);
        return if p.is_file() { p.parent().map(Path::to_path_buf).into_iter().collect() } else { vec![p] };
    }
    let mut dirs = Vec::new();
    if let Ok(o) = Command::new("llvm-config").arg("--prefix").stderr(Stdio::null()).output() {
        if let Some(prefix) = String::from_utf8_lossy(&o.stdout).lines().next().filter(|l| o.status.success() && !l.is_empty()) {
            let prefix = PathBuf::from(prefix);
            dirs.extend(["bin", "lib", "lib64"].map(|s| prefix.join(s)));
        }
    }
    for var in ["LD_LIBRARY_PATH", "LIBRARY_PATH"] {
        if let Some(v) = std::env::var_os(var) {
            dirs.extend(std::env::split_paths(&v));
        }
    }
    for pattern in [
        "/usr/local/llvm*/lib*",
        "/usr/local/lib*/*/*",
        "/usr/local/lib*/*",
        "/usr/local/lib*",
        "/usr/lib*/*/*",
        "/usr/lib*/*",
        "/usr/lib*",
    ] {
        if let Ok(paths) = glob::glob(pattern) {
            dirs.extend(paths.flatten().filter(|p| p.is_dir()));
        }
    }
    dirs
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(files: &[&str]) -> PathBuf {
        let d = std::env::temp_dir().join(format!("mori-prereq-{}-{}", std::process::id(), files.join("+")));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        for f in files {
            std::fs::write(d.join(f), b"\x7fELF").unwrap();
        }
        d
    }

    #[test]
    fn only_libclang_cpp_is_missing() {
        let d = fixture(&["libclang-cpp.so.14", "libLLVM-14.so.1"]);
        assert_eq!(find_libclang(std::slice::from_ref(&d)), None);
        std::fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn versioned_libclang_is_present() {
        let d = fixture(&["libclang-cpp.so.14", "libclang-14.so.1"]);
        assert_eq!(find_libclang(std::slice::from_ref(&d)), Some(d.join("libclang-14.so.1")));
        std::fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn names_follow_clang_sys() {
        for yes in
            ["libclang.so", "libclang.so.1", "libclang.so.14.0.6", "libclang-14.so", "libclang-14.so.1", "libclang-3.9.so", "libclang-.so"]
        {
            assert!(is_libclang_name(yes), "{yes}");
        }
        for no in [
            "libclang-cpp.so.14",
            "libclang-cpp.so",
            "libclang-cpp.so.14.0",
            "libclang.a",
            "libclang-14.a",
            "libclangBasic.a",
            "libclang",
            "clang.so",
        ] {
            assert!(!is_libclang_name(no), "{no}");
        }
    }

    #[test]
    fn later_dirs_are_searched_and_directories_are_not_files() {
        let empty = fixture(&[]);
        let d = fixture(&["libclang.so.1"]);
        std::fs::create_dir_all(empty.join("libclang.so")).unwrap();
        assert_eq!(find_libclang(&[empty.clone(), d.clone()]), Some(d.join("libclang.so.1")));
        std::fs::remove_dir_all(d).unwrap();
        std::fs::remove_dir_all(empty).unwrap();
    }

    #[test]
    fn the_table_names_each_package_once() {
        let mut names: Vec<&str> = PACKAGES.iter().map(|p| p.name).collect();
        names.sort();
        let n = names.len();
        names.dedup();
        assert_eq!(names.len(), n);
        assert!(PACKAGES.iter().any(|p| p.name == format!("clang-{CLANG_MAJOR}")));
    }
}
