#!/usr/bin/env python3
"""Runs the prebuilt CUDA kernels on an NVIDIA GPU and checks them (by hand, on the GPU machine).

    python3 kernels/check_on_gpu.py            # from the repository root

Needs PyTorch with CUDA (allocation, reference data) and the driver's libcuda; loads
kernels/prebuilt/*.sm_90.ptx and *.sm_90.cubin with cuModuleLoadData, launches
mori_scatter_gather_copy over batches of descriptors of every alignment and length
(0 included) on several grid/block shapes, and compares every byte of the destination
buffer (also the bytes no descriptor covers) with a host reference. Then prints the copy
rate of large and small batches next to torch's device-to-device copy.
"""
import ctypes
import os
import random
import sys

import torch

BLOCK = 64  # recommended block size (kernels/README.md)
HERE = os.path.dirname(os.path.abspath(__file__))
PREBUILT = os.path.join(HERE, "prebuilt")
cuda = ctypes.CDLL("libcuda.so.1")


def ck(rc, what):
    if rc != 0:
        name = ctypes.c_char_p()
        cuda.cuGetErrorName(rc, ctypes.byref(name))
        raise RuntimeError(f"{what}: {rc} {name.value}")


def load(path):
    data = open(path, "rb").read()
    if path.endswith(".ptx"):
        data += b"\0"
    mod = ctypes.c_void_p()
    ck(cuda.cuModuleLoadData(ctypes.byref(mod), ctypes.c_char_p(data)), f"cuModuleLoadData {os.path.basename(path)}")
    fn = ctypes.c_void_p()
    ck(cuda.cuModuleGetFunction(ctypes.byref(fn), mod, b"mori_scatter_gather_copy"), "cuModuleGetFunction")
    return fn


def launch(fn, descs_ptr, n, grid, block):
    p0 = ctypes.c_uint64(descs_ptr)
    p1 = ctypes.c_uint32(n)
    params = (ctypes.c_void_p * 2)(ctypes.cast(ctypes.byref(p0), ctypes.c_void_p), ctypes.cast(ctypes.byref(p1), ctypes.c_void_p))
    ck(cuda.cuLaunchKernel(fn, grid, 1, 1, block, 1, 1, 0, None, params, None), "cuLaunchKernel")


def descs_tensor(descs):
    t = torch.tensor([x for d in descs for x in d], dtype=torch.int64)
    return t.cuda()


def check(fn, label, rng):
    cases = 0
    for block in (32, 64, 256, 1024):
        for grid in (1, 3, 528, 8448):
            size = 1 << 22
            src = torch.randint(0, 256, (size,), dtype=torch.uint8, device="cuda")
            dst = torch.full((size + 64,), 0xAB, dtype=torch.uint8, device="cuda")
            expect = dst.cpu().clone()
            host_src = src.cpu()
            descs, off = [], 0
            lens = [0, 1, 2, 3, 15, 16, 17, 31, 32, 33, 63, 64, 100, 255, 4096, 4097, 65536 + 7, 300000]
            while True:
                ln = rng.choice(lens) if rng.random() < 0.5 else rng.randrange(0, 9000)
                so = rng.randrange(0, size - ln + 1)
                off += rng.randrange(0, 40)  # any dst alignment, gaps left untouched
                if off + ln > size:
                    break
                descs.append((src.data_ptr() + so, dst.data_ptr() + off, ln))
                expect[off:off + ln] = host_src[so:so + ln]
                off += ln
            rng.shuffle(descs)
            d = descs_tensor(descs)
            launch(fn, d.data_ptr(), len(descs), grid, block)
            torch.cuda.synchronize()
            got = dst.cpu()
            if not torch.equal(got, expect):
                bad = (got != expect).nonzero()
                raise SystemExit(f"{label}: MISMATCH block={block} grid={grid}: {bad.numel()} bytes, first at {bad[0].item()}")
            cases += len(descs)
    # n = 0 and a grid larger than n
    launch(fn, 0, 0, 4, 256)
    torch.cuda.synchronize()
    print(f"{label}: ok ({cases} descriptors over 16 launch shapes, every byte compared)")


def recommended_grid(n, total_bytes):
    """kernels/README.md: min(128 x multiprocessors, max(n, total bytes / 16 KiB))."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    return max(1, min(128 * sms, max(n, -(-total_bytes // 16384))))


def rate(fn, label, count, each, align=16):
    total = count * (each + align)
    src = torch.empty(total, dtype=torch.uint8, device="cuda")
    dst = torch.empty(total, dtype=torch.uint8, device="cuda")
    step = each + align
    d = descs_tensor([(src.data_ptr() + i * step, dst.data_ptr() + i * step, each) for i in range(count)])
    grid = recommended_grid(count, count * each)
    for _ in range(3):
        launch(fn, d.data_ptr(), count, grid, BLOCK)
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    iters = 20
    s.record()
    for _ in range(iters):
        launch(fn, d.data_ptr(), count, grid, BLOCK)
    e.record()
    e.synchronize()
    t = s.elapsed_time(e) / 1e3 / iters
    a, b = src[: count * each], dst[: count * each]
    for _ in range(3):
        b.copy_(a)
    s.record()
    for _ in range(iters):
        b.copy_(a)
    e.record()
    e.synchronize()
    tt = s.elapsed_time(e) / 1e3 / iters
    gb = count * each / 1e9
    print(f"{label}: {count} x {each} B: {gb / t:.0f} GB/s payload ({t * 1e6:.1f} us); torch contiguous copy of the same bytes {gb / tt:.0f} GB/s")


def main():
    torch.zeros(1, device="cuda")  # primary context, current on this thread
    print(torch.cuda.get_device_name(), "torch", torch.__version__)
    rng = random.Random(1)
    for f in sorted(os.listdir(PREBUILT)):
        # Only the scatter/gather copy's images: the EP and shmem kernels are checked by
        # bench_dispatch_combine (against the host reference) and the shmem GPU test.
        if f.startswith("scatter_gather_copy.") and (f.endswith(".sm_90.ptx") or f.endswith(".sm_90.cubin")):
            fn = load(os.path.join(PREBUILT, f))
            check(fn, f, rng)
    fn = load(os.path.join(PREBUILT, "scatter_gather_copy.sm_90.cubin"))
    rate(fn, "cubin", 4096, 256 * 1024)
    rate(fn, "cubin", 65536, 4096)
    rate(fn, "cubin", 65536, 1024)
    rate(fn, "cubin", 65536, 4096 + 3, align=5)
    rate(fn, "cubin", 262144, 256)
    rate(fn, "cubin", 8, 32 << 20)
    return 0


if __name__ == "__main__":
    sys.exit(main())
