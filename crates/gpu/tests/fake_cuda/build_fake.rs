//! Builds the stand-in libcuda (fake_cuda.c, beside this file) with the system C compiler into
//! a fresh temporary directory and returns it (for `LD_LIBRARY_PATH`); `None`, with a note on
//! stdout, when there is no C compiler. Shared by the fake-driver tests of several crates
//! (included with `#[path]`).

use std::path::PathBuf;
use std::process::Command;

/// `tag` names the directory (with this process's id), so concurrent test binaries never share one.
pub fn build_fake(tag: &str) -> Option<PathBuf> {
    // `file!()` is relative to the workspace root (crates/<name>/ is two levels below it).
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..").join(file!()).with_file_name("fake_cuda.c");
    let dir = std::env::temp_dir().join(format!("mori-{tag}-fake-cuda-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let lib = dir.join("libcuda.so.1");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_string());
    let out = match Command::new(&cc)
        .args(["-shared", "-fPIC", "-O1", "-Wall", "-Wextra", "-Werror", "-fvisibility=hidden", "-o"])
        .arg(&lib)
        .arg(&src)
        .arg("-lpthread")
        .output()
    {
        Ok(out) => out,
        Err(e) => {
            println!("no C compiler ({cc}: {e}): the fake-driver run is skipped");
            return None;
        }
    };
    assert!(out.status.success(), "building the fake libcuda from {} failed:\n{}", src.display(), String::from_utf8_lossy(&out.stderr));
    std::os::unix::fs::symlink("libcuda.so.1", dir.join("libcuda.so")).unwrap();
    Some(dir)
}
