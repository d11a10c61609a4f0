//! CPU-only tests of mori-gpu: what must hold on a machine without any GPU driver (CI), and the
//! pure pieces (handle encodings, error texts, bus ids, sysfs NUMA, dmabuf windows, launch
//! shapes, kernel arguments, image validation, fd passing).

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::process::Command;

use mori_gpu::cuda::CudaRuntime;
use mori_gpu::hip::HipRuntime;
use mori_gpu::{
    cuda_error_name, detect, detect_with, dmabuf_window, fdpass, hip_error_name, numa_node_from_sysfs, GpuError, HandleKinds, IpcHandle,
    KernelArgs, LaunchConfig, ModuleImage, PciBusId, RuntimeChoice, RuntimeKind, ShareableHandle, ShareableKind,
};

fn cuda_absent() -> bool {
    matches!(CudaRuntime::load(), Err(GpuError::LibraryNotFound { .. }))
}

fn hip_absent() -> bool {
    matches!(HipRuntime::load(), Err(GpuError::LibraryNotFound { .. }))
}

fn no_driver() -> bool {
    let absent = cuda_absent() && hip_absent();
    if !absent {
        println!("a GPU library is installed here: the no-runtime assertions are skipped");
    }
    absent
}

#[test]
fn detect_without_driver_names_both_libraries() {
    if !no_driver() {
        return;
    }
    let err = detect_with(RuntimeChoice::Auto).expect_err("no driver here");
    let text = err.to_string();
    println!("{text}");
    assert!(matches!(err, GpuError::NoRuntime { forced: None, .. }), "{err:?}");
    assert!(text.starts_with("no GPU runtime: "), "{text}");
    assert!(text.contains("libcuda"), "{text}");
    assert!(text.contains("libamdhip64"), "{text}");
    // The plain entry point agrees (MORI_GPU_RUNTIME is unset in CI).
    if std::env::var_os(RuntimeChoice::ENV).is_none() {
        assert_eq!(detect().expect_err("no driver").to_string(), text);
    }
    // And the trait-object spelling.
    assert!(<dyn mori_gpu::Runtime>::detect().is_err());
}

#[test]
fn forced_runtimes_without_driver_name_only_their_library() {
    if !no_driver() {
        return;
    }
    let cuda = detect_with(RuntimeChoice::Cuda).expect_err("no libcuda").to_string();
    assert!(cuda.contains("MORI_GPU_RUNTIME=CUDA") && cuda.contains("libcuda") && !cuda.contains("libamdhip64"), "{cuda}");
    let hip = detect_with(RuntimeChoice::Hip).expect_err("no libamdhip64").to_string();
    assert!(hip.contains("MORI_GPU_RUNTIME=HIP") && hip.contains("libamdhip64") && !hip.contains("libcuda"), "{hip}");
}

#[test]
fn vendor_loaders_error_cleanly_without_driver() {
    if !no_driver() {
        return;
    }
    // Twice each: the second call goes through the cached load result.
    for _ in 0..2 {
        let e = CudaRuntime::load().expect_err("no libcuda");
        let t = e.to_string();
        assert!(t.contains("libcuda not found") && t.contains("libcuda.so"), "{t}");
        let e = HipRuntime::load().expect_err("no libamdhip64");
        let t = e.to_string();
        assert!(t.contains("libamdhip64 not found") && t.contains("libamdhip64.so"), "{t}");
    }
}

#[test]
fn runtime_choice_parsing() {
    assert_eq!(RuntimeChoice::from_env_value(None).unwrap(), RuntimeChoice::Auto);
    assert_eq!(RuntimeChoice::from_env_value(Some("")).unwrap(), RuntimeChoice::Auto);
    assert_eq!(RuntimeChoice::from_env_value(Some("auto")).unwrap(), RuntimeChoice::Auto);
    assert_eq!(RuntimeChoice::from_env_value(Some(" CUDA ")).unwrap(), RuntimeChoice::Cuda);
    assert_eq!(RuntimeChoice::from_env_value(Some("hip")).unwrap(), RuntimeChoice::Hip);
    let e = RuntimeChoice::from_env_value(Some("rocm5")).unwrap_err().to_string();
    assert_eq!(e, "MORI_GPU_RUNTIME=\"rocm5\" is not understood: expected cuda, hip or auto");
    assert!(RuntimeChoice::Cuda.allows(RuntimeKind::Cuda) && !RuntimeChoice::Cuda.allows(RuntimeKind::Hip));
    assert!(RuntimeChoice::Auto.allows(RuntimeKind::Cuda) && RuntimeChoice::Auto.allows(RuntimeKind::Hip));
}

/// Re-executed by `env_override_reaches_detect` with `MORI_GPU_RUNTIME` set; a no-op otherwise.
#[test]
fn child_detect_env() {
    let Ok(expect) = std::env::var("MORI_GPU_TEST_EXPECT") else {
        return;
    };
    let text = detect().expect_err("child expects an error").to_string();
    println!("child: {text}");
    assert!(text.contains(&expect), "{text:?} lacks {expect:?}");
}

#[test]
fn env_override_reaches_detect() {
    let mut cases = vec![("bogus", "MORI_GPU_RUNTIME=\"bogus\" is not understood")];
    if no_driver() {
        cases.push(("hip", "no GPU runtime (MORI_GPU_RUNTIME=HIP): HIP (libamdhip64)"));
        cases.push(("cuda", "no GPU runtime (MORI_GPU_RUNTIME=CUDA): CUDA (libcuda)"));
    }
    let exe = std::env::current_exe().unwrap();
    for (value, expect) in cases {
        let out = Command::new(&exe)
            .args(["--exact", "child_detect_env", "--nocapture", "--test-threads=1"])
            .env(RuntimeChoice::ENV, value)
            .env("MORI_GPU_TEST_EXPECT", expect)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "MORI_GPU_RUNTIME={value}: {stdout}{}", String::from_utf8_lossy(&out.stderr));
        assert!(stdout.contains("child: "), "the child test did not run: {stdout}");
    }
}

#[test]
fn error_texts_name_call_code_and_name() {
    assert_eq!(cuda_error_name(800), Some("CUDA_ERROR_NOT_PERMITTED"));
    assert_eq!(cuda_error_name(2), Some("CUDA_ERROR_OUT_OF_MEMORY"));
    assert_eq!(cuda_error_name(424242), None);
    assert_eq!(hip_error_name(2), Some("hipErrorOutOfMemory"));
    assert_eq!(hip_error_name(600), Some("hipErrorNotReady"));
    assert_eq!(hip_error_name(424242), None);
    let e = GpuError::Call {
        runtime: RuntimeKind::Cuda,
        call: "cuMemCreate",
        code: 800,
        name: "CUDA_ERROR_NOT_PERMITTED".into(),
        hint: Some("FABRIC handles need an IMEX channel".into()),
    };
    assert_eq!(e.to_string(), "cuMemCreate failed: CUDA_ERROR_NOT_PERMITTED (800): FABRIC handles need an IMEX channel");
    assert_eq!((e.code(), e.call()), (Some(800), Some("cuMemCreate")));
    let e = GpuError::Call { runtime: RuntimeKind::Hip, call: "hipMalloc", code: 2, name: "hipErrorOutOfMemory".into(), hint: None };
    assert_eq!(e.to_string(), "hipMalloc failed: hipErrorOutOfMemory (2)");
}

fn sample_ipc() -> IpcHandle {
    let mut raw = [0u8; 64];
    for (i, b) in raw.iter_mut().enumerate() {
        *b = (i * 7 + 3) as u8;
    }
    IpcHandle::new(RuntimeKind::Cuda, raw, 1_052_928, 65_536, 4242)
}

#[test]
fn ipc_handle_round_trips_with_offset() {
    let h = sample_ipc();
    let b = h.to_bytes();
    assert_eq!(b.len(), IpcHandle::ENCODED_LEN);
    let back = IpcHandle::from_bytes(&b).unwrap();
    assert_eq!(back, h);
    assert_eq!((back.offset(), back.len(), back.exporter_pid(), back.runtime()), (1_052_928, 65_536, 4242, RuntimeKind::Cuda));
    assert_eq!(back.raw(), h.raw());
    let hip = IpcHandle::new(RuntimeKind::Hip, [9; 64], 0, 1, 1);
    assert_eq!(IpcHandle::from_bytes(&hip.to_bytes()).unwrap(), hip);
}

#[test]
fn ipc_handle_rejects_malformed_bytes() {
    let b = sample_ipc().to_bytes();
    let err = |bytes: &[u8]| IpcHandle::from_bytes(bytes).unwrap_err().to_string();
    assert!(err(&b[..95]).contains("95 bytes, expected 96"));
    let mut bad = b;
    bad[0] = b'X';
    assert!(err(&bad).contains("bad magic"));
    let mut bad = b;
    bad[4] = 2;
    assert!(err(&bad).contains("version 2"));
    let mut bad = b;
    bad[5] = 9;
    assert!(err(&bad).contains("runtime tag 9"));
    let mut bad = b;
    bad[16..24].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(err(&bad).contains("overflows"));
}

#[test]
fn shareable_descriptor_round_trips() {
    let raw: [u8; 64] = std::array::from_fn(|i| i as u8 ^ 0x5a);
    let f = ShareableHandle::from_fabric(RuntimeKind::Cuda, raw, 4 << 20);
    let d = f.descriptor();
    let back = ShareableHandle::from_descriptor(&d, None).unwrap();
    assert_eq!((back.kind(), back.size(), back.fabric(), back.runtime()), (ShareableKind::Fabric, 4 << 20, Some(&raw), RuntimeKind::Cuda));
    assert!(back.posix_fd().is_none());

    let (r, _w) = nix::unistd::pipe().unwrap();
    let p = ShareableHandle::from_posix_fd(RuntimeKind::Hip, r, 2 << 20);
    let d = p.descriptor();
    let e = ShareableHandle::from_descriptor(&d, None).unwrap_err().to_string();
    assert!(e.contains("without a file descriptor"), "{e}");
    let (r2, _w2) = nix::unistd::pipe().unwrap();
    let back = ShareableHandle::from_descriptor(&d, Some(r2)).unwrap();
    assert_eq!((back.kind(), back.size(), back.runtime()), (ShareableKind::PosixFd, 2 << 20, RuntimeKind::Hip));
    assert!(ShareableHandle::from_descriptor(&d[..79], None).is_err());
    let mut bad = d;
    bad[6] = 7;
    assert!(ShareableHandle::from_descriptor(&bad, None).unwrap_err().to_string().contains("kind tag 7"));
    let mut bad = d;
    bad[8..16].fill(0);
    assert!(ShareableHandle::from_descriptor(&bad, None).unwrap_err().to_string().contains("size 0"));
}

#[test]
fn handle_kinds() {
    assert!(HandleKinds::POSIX_FD.contains(ShareableKind::PosixFd) && !HandleKinds::POSIX_FD.contains(ShareableKind::Fabric));
    assert!(HandleKinds::FABRIC.contains(ShareableKind::Fabric));
    assert_eq!(HandleKinds::from(ShareableKind::Fabric), HandleKinds::FABRIC);
    assert_eq!(ShareableKind::PosixFd.to_string(), "POSIX_FD");
}

#[test]
fn pci_bus_ids_parse_and_print() {
    let id: PciBusId = "0000:1b:00.0".parse().unwrap();
    assert_eq!(id, PciBusId { domain: 0, bus: 0x1b, device: 0, function: 0 });
    assert_eq!(id.to_string(), "0000:1b:00.0");
    let nv: PciBusId = "00000001:C1:1F.7".parse().unwrap();
    assert_eq!(nv, PciBusId { domain: 1, bus: 0xc1, device: 0x1f, function: 7 });
    assert_eq!(nv.to_string(), "0001:c1:1f.7");
    assert_eq!("3b:00.1".parse::<PciBusId>().unwrap().to_string(), "0000:3b:00.1");
    assert_eq!("0000:1B:00.0\0\0".parse::<PciBusId>().unwrap(), id);
    for bad in ["", "0000:1b:00", "0000:1b:20.0", "0000:1b:00.8", "0000:1g:00.0", "0:0:0:0.0", "123456789:00:00.0", "0000:100:00.0"] {
        assert!(bad.parse::<PciBusId>().is_err(), "{bad:?} parsed");
    }
}

#[test]
fn numa_node_from_a_sysfs_fixture() {
    let root = std::env::temp_dir().join(format!("mori-gpu-sysfs-{}", std::process::id()));
    let dev = |id: &str, numa: &str| {
        let d = root.join("bus/pci/devices").join(id);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("numa_node"), numa).unwrap();
    };
    dev("0000:1b:00.0", "1\n");
    dev("0000:3b:00.0", "-1\n");
    dev("0000:5b:00.0", "garbage");
    let id = |s: &str| s.parse::<PciBusId>().unwrap();
    assert_eq!(numa_node_from_sysfs(&root, &id("0000:1B:00.0")), Some(1));
    assert_eq!(numa_node_from_sysfs(&root, &id("0000:3b:00.0")), None);
    assert_eq!(numa_node_from_sysfs(&root, &id("0000:5b:00.0")), None);
    assert_eq!(numa_node_from_sysfs(&root, &id("0000:7b:00.0")), None);
    std::fs::remove_dir_all(&root).unwrap();
}

#[test]
fn dmabuf_windows() {
    let base = 0x7f00_0020_0000u64;
    let len = 8 << 20;
    // Interior range: widened to pages, offset of the first byte kept.
    assert_eq!(dmabuf_window(base + 3 * 4096 + 100, 1 << 20, base, len, 4096).unwrap(), (base + 3 * 4096, (1 << 20) + 4096, 100));
    // Page-aligned range: unchanged.
    assert_eq!(dmabuf_window(base, len, base, len, 4096).unwrap(), (base, len, 0));
    // Last byte of the allocation.
    assert_eq!(dmabuf_window(base + len - 1, 1, base, len, 4096).unwrap(), (base + len - 4096, 4096, 4095));
    // A small allocation whose page window would expose its neighbours.
    let e = dmabuf_window(0x1000_0100, 1000, 0x1000_0100, 1000, 4096).unwrap_err().to_string();
    assert!(e.contains("leaves its allocation"), "{e}");
    assert!(dmabuf_window(base - 1, 10, base, len, 4096).unwrap_err().to_string().contains("not inside"));
    assert!(dmabuf_window(base, len + 1, base, len, 4096).is_err());
    assert!(dmabuf_window(base, 0, base, len, 4096).is_err());
    assert!(dmabuf_window(base, 1, base, len, 3000).is_err());
    assert!(dmabuf_window(u64::MAX - 1, 10, base, len, 4096).is_err());
}

#[test]
fn launch_shapes() {
    let c = LaunchConfig::for_elements(1_000_003, 256).unwrap();
    assert_eq!((c.grid, c.block, c.shared_mem_bytes), ((3907, 1, 1), (256, 1, 1), 0));
    assert_eq!(LaunchConfig::for_elements(0, 128).unwrap().grid, (1, 1, 1));
    assert_eq!(LaunchConfig::for_elements(256, 256).unwrap().grid, (1, 1, 1));
    assert!(LaunchConfig::for_elements(10, 0).is_err());
    assert!(LaunchConfig::for_elements(u64::MAX, 1).is_err());
}

#[test]
fn kernel_args_point_at_their_values() {
    #[derive(Clone, Copy)]
    #[repr(C, align(16))]
    struct Wide {
        a: u64,
        b: u32,
    }
    let mut args = KernelArgs::new();
    args.push(7u32).push(-2.5f64).push(0xdead_beef_cafe_f00du64).push(Wide { a: 11, b: 12 }).push(1u8);
    let p = args.params();
    assert_eq!((p.len(), args.len()), (5, 5));
    for ptr in &p {
        assert_eq!(*ptr as usize % 16, 0, "slot not 16-byte aligned");
    }
    // SAFETY: each pointer addresses a live slot holding a value of the pushed type.
    unsafe {
        assert_eq!(*(p[0] as *const u32), 7);
        assert_eq!(*(p[1] as *const f64), -2.5);
        assert_eq!(*(p[2] as *const u64), 0xdead_beef_cafe_f00d);
        let w = *(p[3] as *const Wide);
        assert_eq!((w.a, w.b), (11, 12));
        assert_eq!(*(p[4] as *const u8), 1);
    }
}

fn elf_header(shoff: u64, shnum: u16) -> Vec<u8> {
    let mut b = vec![0u8; 64];
    b[0..4].copy_from_slice(b"\x7fELF");
    b[4] = 2; // 64-bit
    b[5] = 1; // little-endian
    b[0x28..0x30].copy_from_slice(&shoff.to_le_bytes());
    b[0x3A..0x3C].copy_from_slice(&64u16.to_le_bytes());
    b[0x3C..0x3E].copy_from_slice(&shnum.to_le_bytes());
    b
}

#[test]
fn module_images_are_validated() {
    let cuda = RuntimeKind::Cuda;
    let ptx = include_str!("fixtures/mori_test_fill.ptx");
    ModuleImage::Ptx(ptx).validate(cuda).unwrap();
    assert!(ModuleImage::Ptx("  ").validate(cuda).is_err());
    assert!(ModuleImage::Ptx("a\0b").validate(cuda).is_err());
    let e = ModuleImage::Ptx(ptx).validate(RuntimeKind::Hip).unwrap_err().to_string();
    assert!(e.contains("loading PTX is not supported by HIP"), "{e}");

    let cubin = include_bytes!("fixtures/mori_test_fill.sm_90.cubin");
    ModuleImage::Cubin(cubin).validate(cuda).unwrap();
    let e = ModuleImage::Cubin(&cubin[..cubin.len() - 200]).validate(cuda).unwrap_err().to_string();
    assert!(e.contains("truncated"), "{e}");
    assert!(ModuleImage::Cubin(b"not an elf at all, no sir, not one bit of it, nope nope nope nope!!").validate(cuda).is_err());
    assert!(ModuleImage::Cubin(cubin).validate(RuntimeKind::Hip).is_err());
    assert!(ModuleImage::HipCodeObject(cubin).validate(cuda).is_err());
    ModuleImage::HipCodeObject(cubin).validate(RuntimeKind::Hip).unwrap(); // an ELF is an ELF

    ModuleImage::Cubin(&elf_header(0, 0)).validate(cuda).unwrap();
    assert!(ModuleImage::Cubin(&elf_header(64, 2)).validate(cuda).is_err());

    let mut fat = vec![0u8; 16 + 32];
    fat[0..4].copy_from_slice(&0xBA55_ED50u32.to_le_bytes());
    fat[6..8].copy_from_slice(&16u16.to_le_bytes());
    fat[8..16].copy_from_slice(&32u64.to_le_bytes());
    ModuleImage::Fatbin(&fat).validate(cuda).unwrap();
    assert!(ModuleImage::Fatbin(&fat[..40]).validate(cuda).is_err());

    let mut bundle = b"__CLANG_OFFLOAD_BUNDLE__".to_vec();
    bundle.extend_from_slice(&1u64.to_le_bytes());
    let entry_at = bundle.len() as u64 + 24 + 4;
    bundle.extend_from_slice(&entry_at.to_le_bytes());
    bundle.extend_from_slice(&8u64.to_le_bytes());
    bundle.extend_from_slice(&4u64.to_le_bytes());
    bundle.extend_from_slice(b"hipv");
    bundle.extend_from_slice(&[0u8; 8]);
    ModuleImage::HipCodeObject(&bundle).validate(RuntimeKind::Hip).unwrap();
    assert!(ModuleImage::HipCodeObject(&bundle[..bundle.len() - 1]).validate(RuntimeKind::Hip).is_err());
}

#[test]
fn fd_passing_over_a_unix_socket() {
    let (a, b) = UnixStream::pair().unwrap();
    let (r, w) = nix::unistd::pipe().unwrap();
    fdpass::send_with_fd(&a, b"hello, fd", Some(std::os::fd::AsFd::as_fd(&r))).unwrap();
    drop(r);
    let mut buf = [0u8; 9];
    let got = fdpass::recv_with_fd(&b, &mut buf).unwrap().expect("an fd");
    assert_eq!(&buf, b"hello, fd");
    let mut wf = std::fs::File::from(w);
    wf.write_all(b"through the passed pipe").unwrap();
    drop(wf);
    let mut text = String::new();
    std::fs::File::from(got).read_to_string(&mut text).unwrap();
    assert_eq!(text, "through the passed pipe");

    // Without an fd, and a message longer than one read.
    fdpass::send_with_fd(&a, &[1u8; 80], None).unwrap();
    let mut buf = [0u8; 80];
    assert!(fdpass::recv_with_fd(&b, &mut buf).unwrap().is_none());
    assert_eq!(buf, [1u8; 80]);

    // A shareable-handle descriptor with its fd, as the VMM test sends it.
    let (r, _w) = nix::unistd::pipe().unwrap();
    let h = ShareableHandle::from_posix_fd(RuntimeKind::Cuda, r, 2 << 20);
    fdpass::send_with_fd(&a, &h.descriptor(), h.posix_fd()).unwrap();
    let mut d = [0u8; ShareableHandle::DESCRIPTOR_LEN];
    let fd = fdpass::recv_with_fd(&b, &mut d).unwrap();
    let back = ShareableHandle::from_descriptor(&d, fd).unwrap();
    assert_eq!((back.kind(), back.size()), (ShareableKind::PosixFd, 2 << 20));

    // Peer gone.
    drop(a);
    let e = fdpass::recv_with_fd(&b, &mut [0u8; 4]).unwrap_err().to_string();
    assert!(e.contains("peer closed"), "{e}");
    assert!(fdpass::send_with_fd(&b, &[], None).is_err());
}
