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

/// What [`run_module_against_fake`] saw: the child's exit, stdout and stderr.
#[allow(dead_code)]
pub struct FakeRun {
    pub success: bool,
    pub stdout: String,
    pub stderr: String,
}

/// Builds the fake libcuda (`tag` as for [`build_fake`]) and re-runs this test binary's ignored
/// tests under `module` (`gpu_tests::`, the GPU tests a fake-driver test includes as a module)
/// with it on `LD_LIBRARY_PATH`, plus `envs` and without the variables `unset`; prints their
/// output and removes the library. `None` without a C compiler.
#[allow(dead_code)]
pub fn run_module_against_fake(tag: &str, module: &str, envs: &[(&str, &str)], unset: &[&str]) -> Option<FakeRun> {
    let dir = build_fake(tag)?;
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([module, "--ignored", "--nocapture", "--test-threads=1"]).env("LD_LIBRARY_PATH", &dir);
    for (k, v) in envs {
        cmd.env(k, v);
    }
    for k in unset {
        cmd.env_remove(k);
    }
    let out = cmd.output().unwrap();
    let run = FakeRun {
        success: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    };
    println!("{}{}", run.stdout, run.stderr);
    let _ = std::fs::remove_dir_all(&dir);
    Some(run)
}
