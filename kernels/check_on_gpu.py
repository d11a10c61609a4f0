#!/usr/bin/env python3
"""Runs the prebuilt CUDA kernels on an NVIDIA GPU and checks them (by hand, on the GPU machine).

    python3 kernels/check_on_gpu.py            # from the repository root

Needs PyTorch with CUDA (allocation, reference data) and the driver's libcuda; loads
kernels/prebuilt/*.sm_90.ptx and *.sm_90.cubin with cuModuleLoadData, launches
mori_scatter_gather_copy over batches of descriptors of every alignment and length
(0 included) on several grid/block shapes, and compares every byte of the destination
buffer (also the bytes no descriptor covers) with a host reference. Then prints the copy
rate of large and small batches next to torch's device-to-device copy.

mori_paged_copy (same module) is checked the same way over random block tables (with and
without runs of consecutive blocks), 2 to 32 layers, 1 or 2 halves, both directions, block
sizes of 4 KiB, 32 KiB and 4100 B, two cache layouts and unaligned bases; then timed on
paged transfers whose side B lives in another process (mapped through CUDA IPC by torch),
next to one contiguous copy_ of the same bytes between the same two buffers.

    MORI_PAGED_VARIANTS=DIR   also check and time every DIR/*.cubin (builds of the same
                              source with other -D settings) over several block and grid
                              shapes, to choose the defaults
"""
import ctypes
import os
import random
import struct
import sys
import time

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


def load(path, name=b"mori_scatter_gather_copy"):
    data = open(path, "rb").read()
    if path.endswith(".ptx"):
        data += b"\0"
    mod = ctypes.c_void_p()
    ck(cuda.cuModuleLoadData(ctypes.byref(mod), ctypes.c_char_p(data)), f"cuModuleLoadData {os.path.basename(path)}")
    fn = ctypes.c_void_p()
    ck(cuda.cuModuleGetFunction(ctypes.byref(fn), mod, name), f"cuModuleGetFunction {name.decode()}")
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


# ---- mori_paged_copy ----

PAGED_BLOCK = 64  # recommended block size of mori_paged_copy (kernels/README.md)
PAGED_GRID_PER_SM = 128  # recommended grid cap, blocks per multiprocessor
PAGED_CHUNK = 4096  # recommended grid: at least one block per this many bytes


def paged_grid(units, total_bytes, per_sm=PAGED_GRID_PER_SM, chunk=PAGED_CHUNK):
    """kernels/README.md: min(128 x multiprocessors, max(units, total bytes / 4 KiB))."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    return max(1, min(per_sm * sms, max(units, -(-total_bytes // chunk))))


def paged_params(a, b, block_bytes, layers, halves, n_runs, a_to_b):
    """PagedParams, 88 bytes: a/b = (base, layer_stride, half_stride, block_stride)."""
    return struct.pack("<9Q4I", *a, *b, block_bytes, layers, halves, n_runs, 1 if a_to_b else 0)


def paged_args(runs_ptr, params):
    """The kernelParams array of a mori_paged_copy launch (kept alive with its storage)."""
    p0 = ctypes.c_uint64(runs_ptr)
    p1 = ctypes.create_string_buffer(params, len(params))
    ptrs = (ctypes.c_void_p * 2)(ctypes.cast(ctypes.byref(p0), ctypes.c_void_p), ctypes.cast(p1, ctypes.c_void_p))
    return ptrs, (p0, p1)


def paged_launch(fn, runs_ptr, params, grid, block, args=None):
    ptrs, _keep = args if args is not None else paged_args(runs_ptr, params)
    ck(cuda.cuLaunchKernel(fn, grid, 1, 1, block, 1, 1, 0, None, ptrs, None), "cuLaunchKernel mori_paged_copy")


def runs_tensor(runs):
    return torch.tensor([x for r in runs for x in r], dtype=torch.int32).cuda()


def layout(kind, layers, halves, nblocks, bb, pad):
    """(layer_stride, half_stride, block_stride, bytes) of a cache side. lhb: [layer][half][block]
    (blocks contiguous, so runs may merge); blh: [block][layer][half] (never merged)."""
    if kind == "lhb":
        bs = bb
        hs = nblocks * bs + pad
        ls = halves * hs + pad
        return ls, hs, bs, layers * ls
    hs = bb + pad
    ls = halves * hs
    bs = layers * ls + pad
    return ls, hs, bs, nblocks * bs


def make_runs(rng, nd, ns, merge, max_runs):
    """Runs (dst_block, src_block, count): destination ranges disjoint, sources anywhere."""
    runs, at = [], 0
    while at < nd and len(runs) < max_runs:
        at += rng.randrange(0, 3)
        c = rng.randrange(1, 5) if merge else 1
        if at + c > nd or c > ns:
            break
        runs.append((at, rng.randrange(0, ns - c + 1), c))
        at += c
    rng.shuffle(runs)
    return runs


def check_paged(fn, label, rng, cases=None):
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    shapes = [(64, 1), (256, 3), (1024, 7), (32, 8448), (PAGED_BLOCK, None)]
    n = 0
    units_total = 0
    combos = []
    for layers in (2, 5, 32):
        for halves in (1, 2):
            for bb in (4096, 32768, 4100):
                for kind in ("lhb", "blh"):
                    for a_to_b in (True, False):
                        combos.append((layers, halves, bb, kind, a_to_b))
    if cases is not None:
        combos = rng.sample(combos, cases)
    for layers, halves, bb, kind, a_to_b in combos:
        merge = kind == "lhb" and rng.random() < 0.7
        budget = 24 << 20
        nblocks = max(2, min(64, budget // (layers * halves * bb)))
        na, nb = nblocks, max(2, nblocks - rng.randrange(0, 3))
        pad_a, pad_b = rng.choice([0, 16, 4, 3]), rng.choice([0, 16, 4, 1])
        la = layout(kind, layers, halves, na, bb, pad_a)
        lb = layout(kind, layers, halves, nb, bb, pad_b)
        off_a, off_b = rng.choice([0, 0, 16, 5]), rng.choice([0, 0, 32, 12])
        A = torch.randint(0, 256, (la[3] + off_a + 64,), dtype=torch.uint8, device="cuda")
        B = torch.randint(0, 256, (lb[3] + off_b + 64,), dtype=torch.uint8, device="cuda")
        ha, hb = A.cpu(), B.cpu()
        src_sz, dst_sz = (na, nb) if a_to_b else (nb, na)
        raw = make_runs(rng, dst_sz, src_sz, merge, rng.choice([1, 7, 40, 1000]))
        if not raw:
            continue
        runs = [(s, d, c) if a_to_b else (d, s, c) for d, s, c in raw]  # (a_block, b_block, count)
        ea, eb = ha.clone(), hb.clone()
        for layer in range(layers):
            for half in range(halves):
                for ab, bblk, c in runs:
                    ao = off_a + layer * la[0] + half * la[1] + ab * la[2]
                    bo = off_b + layer * lb[0] + half * lb[1] + bblk * lb[2]
                    ln = c * bb
                    if a_to_b:
                        eb[bo:bo + ln] = ha[ao:ao + ln]
                    else:
                        ea[ao:ao + ln] = hb[bo:bo + ln]
        block, grid = rng.choice(shapes)
        units = layers * halves * len(runs)
        total = units * bb * sum(c for *_, c in runs) // len(runs)
        if grid is None:
            grid = paged_grid(units, total)
        a = (A.data_ptr() + off_a, la[0], la[1], la[2])
        b = (B.data_ptr() + off_b, lb[0], lb[1], lb[2])
        t = runs_tensor(runs)
        paged_launch(fn, t.data_ptr(), paged_params(a, b, bb, layers, halves, len(runs), a_to_b), grid, block)
        torch.cuda.synchronize()
        for what, got, want in (("A", A.cpu(), ea), ("B", B.cpu(), eb)):
            if not torch.equal(got, want):
                bad = (got != want).nonzero()
                raise SystemExit(
                    f"{label}: paged MISMATCH on side {what}: layers={layers} halves={halves} bb={bb} {kind} "
                    f"a_to_b={a_to_b} merge={merge} runs={len(runs)} block={block} grid={grid}: "
                    f"{bad.numel()} bytes, first at {bad[0].item()}"
                )
        n += 1
        units_total += units
    print(f"{label}: mori_paged_copy ok ({n} block tables, {units_total} units, both sides compared byte for byte)")


def _ipc_child(q, ev, nbytes):
    import torch.multiprocessing  # noqa: F401 - registers the CUDA tensor reductions

    t = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    q.put(t)
    ev.wait()


class Remote:
    """A CUDA buffer allocated by another process, mapped here through CUDA IPC (torch's
    tensor sharing); falls back to a local buffer, saying so, if that fails."""

    def __init__(self, nbytes):
        import torch.multiprocessing as mp

        self.proc = None
        try:
            ctx = mp.get_context("spawn")
            self.q, self.ev = ctx.Queue(), ctx.Event()
            self.proc = ctx.Process(target=_ipc_child, args=(self.q, self.ev, nbytes), daemon=True)
            self.proc.start()
            self.t = self.q.get(timeout=120)
            self.where = "another process (CUDA IPC)"
        except Exception as e:  # noqa: BLE001 - any failure: measure locally, and say so
            print(f"IPC buffer failed ({e!r}): timing with a local buffer instead")
            self.close()
            self.t = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
            self.where = "this process (IPC failed)"

    def close(self):
        if self.proc is not None:
            self.t = None
            self.ev.set()
            self.proc.join(timeout=30)
            self.proc = None


def time_it(fn_once, iters):
    """GPU seconds per call: the calls are queued behind a spin kernel, so the host's launch
    cost (Python, ctypes) does not leave the GPU idle between them."""
    for _ in range(2):
        fn_once()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    if hasattr(torch.cuda, "_sleep"):
        torch.cuda._sleep(20_000_000)  # ~10 ms at 2 GHz: longer than queueing the calls takes
    s.record()
    for _ in range(iters):
        fn_once()
    e.record()
    e.synchronize()
    return s.elapsed_time(e) / 1e3 / iters


PAGED_CASES = [  # (blocks, block bytes, layers, halves, A -> B): blocks = layers x halves x runs
    (16384, 32768, 32, 2, True),
    (16384, 32768, 32, 2, False),
    (16384, 32768, 1, 1, True),
    (4096, 32768, 32, 2, True),
    (4096, 4096, 32, 2, True),
    (128, 65536, 2, 2, True),
]


def rate_paged(fns, rng, remote):
    """fns: [(label, function, unroll label)]. Side A local, side B in `remote`; random
    permutation tables (no merged runs). Prints per case the best and default variants."""
    print(f"paged timing: side B in {remote.where}; payload GB/s = 1e9 bytes / s; ratio = kernel / copy_")
    rows = []
    for blocks, bb, layers, halves, a_to_b in PAGED_CASES:
        n_runs = blocks // (layers * halves)
        total = blocks * bb
        A = torch.randint(0, 256, (total,), dtype=torch.uint8, device="cuda")
        B = remote.t[:total]
        a = (A.data_ptr(), halves * n_runs * bb, n_runs * bb, bb)
        b = (B.data_ptr(), halves * n_runs * bb, n_runs * bb, bb)
        pa, pb = list(range(n_runs)), list(range(n_runs))
        rng.shuffle(pa)
        rng.shuffle(pb)
        runs = list(zip(pa, pb, [1] * n_runs))
        t = runs_tensor(runs)
        host = torch.tensor([x for r in runs for x in r], dtype=torch.int32).pin_memory()
        params = paged_params(a, b, bb, layers, halves, n_runs, a_to_b)
        args = paged_args(t.data_ptr(), params)
        iters = max(10, min(200, (2 << 30) // total))
        src, dst = (A, B) if a_to_b else (B, A)
        tc = time_it(lambda: dst.copy_(src), iters)
        res = []
        if len(fns) > 1:
            shapes = [(b, g, c) for b in (64, 128, 256, 512) for g in (128, 2048 // b) for c in (16384, 4096)]
        else:
            shapes = [(PAGED_BLOCK, PAGED_GRID_PER_SM, PAGED_CHUNK)]
        for label, fn, _ in fns:
            for block, per_sm, chunk in shapes:
                grid = paged_grid(blocks, total, per_sm, chunk)
                try:
                    tk = time_it(lambda: paged_launch(fn, 0, b"", grid, block, args), iters)
                except RuntimeError as e:
                    print(f"  {label} block {block} grid {grid}: {e}")
                    tk = float("inf")
                res.append((tk, label, block, per_sm, chunk, grid))
        res.sort()
        tk, label, block, per_sm, chunk, grid = res[0]
        default = [r for r in res if r[1:5] == (fns[0][0], PAGED_BLOCK, PAGED_GRID_PER_SM, PAGED_CHUNK)]
        du = default[0] if default else res[0]
        fn0 = fns[0][1]
        g0 = paged_grid(blocks, total)

        def with_upload():
            t.copy_(host, non_blocking=True)
            paged_launch(fn0, 0, b"", g0, PAGED_BLOCK, args)

        tu = time_it(with_upload, iters)
        # correctness of the timed transfer (every block of every layer and half)
        if not a_to_b:
            src.copy_(torch.randint(0, 256, (total,), dtype=torch.uint8, device="cuda"))
        dst.zero_()
        paged_launch(fn0, t.data_ptr(), params, g0, PAGED_BLOCK)
        torch.cuda.synchronize()
        va = A.view(layers, halves, n_runs, bb)
        vb = B.view(layers, halves, n_runs, bb)
        if not torch.equal(vb[:, :, pb], va[:, :, pa]):
            raise SystemExit(f"paged timing case {blocks} x {bb}: MISMATCH")
        gb = total / 1e9
        name = f"{blocks} x {bb // 1024} KiB (L{layers} H{halves}{'' if a_to_b else ', B->A'})"
        if len(fns) > 1:
            print(f"  {name}, GB/s by block b, grid cap g per SM, grid >= bytes / c KiB (copy_ {gb / tc:.0f}):")
            print("    " + " " * 10 + "".join(f"{f'{b}/{g}/{c >> 10}':>10}" for b, g, c in shapes))
            by = {(r[1], r[2], r[3], r[4]): gb / r[0] for r in res}
            for lab, _, _ in fns:
                print(f"    {lab:<10}" + "".join(f"{by[(lab, b, g, c)]:>10.0f}" for b, g, c in shapes))
            print(f"    fastest: {label} block {block} grid cap {per_sm}/SM chunk {chunk} ({gb / tk:.0f} GB/s)")
        rows.append((name, gb / du[0], gb / tu, gb / tc))
    print(f"  {'blocks':<30} {'kernel':>8} {'+upload':>8} {'copy_':>8} {'ratio':>6} {'+upl.':>6}"
          f"   (GB/s; kernel: {fns[0][0]}, block {PAGED_BLOCK}, grid <= {PAGED_GRID_PER_SM}/SM; +upload: with the"
          " table's H2D copy from pinned memory on the same stream)")
    for name, k, u, c in rows:
        print(f"  {name:<30} {k:>8.0f} {u:>8.0f} {c:>8.0f} {k / c:>6.2f} {u / c:>6.2f}")


def main():
    torch.zeros(1, device="cuda")  # primary context, current on this thread
    print(torch.cuda.get_device_name(), "torch", torch.__version__)
    rng = random.Random(1)
    for f in sorted(os.listdir(PREBUILT)):
        # Only the scatter/gather copy's images: the EP and shmem kernels are checked by
        # bench_dispatch_combine (against the host reference) and the shmem GPU test.
        if f.startswith("scatter_gather_copy.") and (f.endswith(".sm_90.ptx") or f.endswith(".sm_90.cubin")):
            path = os.path.join(PREBUILT, f)
            check(load(path), f, rng)
            check_paged(load(path, b"mori_paged_copy"), f, rng)
    fn = load(os.path.join(PREBUILT, "scatter_gather_copy.sm_90.cubin"))
    rate(fn, "cubin", 4096, 256 * 1024)
    rate(fn, "cubin", 65536, 4096)
    rate(fn, "cubin", 65536, 1024)
    rate(fn, "cubin", 65536, 4096 + 3, align=5)
    rate(fn, "cubin", 262144, 256)
    rate(fn, "cubin", 8, 32 << 20)
    paged = [("prebuilt", load(os.path.join(PREBUILT, "scatter_gather_copy.sm_90.cubin"), b"mori_paged_copy"), "")]
    vdir = os.environ.get("MORI_PAGED_VARIANTS")
    if vdir:
        for f in sorted(os.listdir(vdir)):
            if not (f.endswith(".cubin") or f.endswith(".ptx")):
                continue
            try:
                fnv = load(os.path.join(vdir, f), b"mori_paged_copy")
                check_paged(fnv, f, rng, cases=12)
            except (RuntimeError, SystemExit) as e:
                print(f"variant {f}: FAILED, left out: {e}")
                continue
            if f.endswith(".cubin"):
                paged.append((f[: -len(".cubin")], fnv, ""))
    remote = Remote(max(c[0] * c[1] for c in PAGED_CASES) + (1 << 20))
    try:
        rate_paged(paged, rng, remote)
    finally:
        remote.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
