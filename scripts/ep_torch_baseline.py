#!/usr/bin/env python3
"""PyTorch baseline for MoE (MORI-EP / DeepEP style) dispatch and combine.

The comparison figures for `bench_dispatch_combine`, run on the GPU machine in the same
run as the Rust benchmark. Only torch is needed.

Semantics (DeepEP V1 / MORI intranode):
  * each of W ranks holds T tokens of hidden H and, per token, top-K expert ids
    (E experts split evenly, E/W per rank; -1 = none) and f32 weights;
  * dispatch sends each token once to every rank owning >= 1 of its experts
    (deduplicated per rank);
  * combine sends each rank's processed rows back and sums them per original token
    (fp32 accumulation, bf16 out). The expert here is the identity: the received rows
    cast (fp8: dequantised) to bf16, prepared outside the timed region.

Accounting (DeepEP / MORI, see the MORI-EP seed "Bandwidth Computation"):
  * dispatch bytes = received tokens x H x elem size; fp8 rows carry 128-wide f32 scales:
    H x 1 + H/128 x 4 bytes per token (= bf16 bytes x (1 + 4/128) / 2);
  * combine bytes = the same received-token count x H x 2 (bf16);
  * GB = 1e9; GB/s = bytes / time.
  Weights and expert ids are not moved by this baseline (they are not in the accounted
  bytes either: K x 8 bytes per token, < 0.5% of a bf16 row at H = 7168).

Routing generator (DeepEP tests): scores = |randn(T, E)| + 1, topk_idx = topk(scores, K).

Modes:
  --mode single (default): W logical ranks on ONE GPU. Dispatch = one index_select per
      (source, destination) pair into a preallocated receive buffer; combine = one
      index_add_ per (destination, source) pair into the source's fp32 accumulator, then
      a cast to bf16. The layout (masks, index lists, offsets) is computed once outside the
      timed region, as a real implementation computes its layout first.
  --mode nccl: one rank per GPU under `torchrun --nproc_per_node=N`. Dispatch =
      index_select into a send buffer + all_to_all_single of the rows (and fp8 scales);
      combine = the reverse all_to_all_single + index_add_ into the fp32 accumulator + cast.
      The per-destination counts are exchanged with an all_to_all of sizes outside the
      timed region (DeepEP's layout step). NCCL_NVLS_ENABLE=0 (no NVLink multicast).

GPU machine commands:
  python3 scripts/ep_torch_baseline.py --shapes --json ep_torch_single.json
  NCCL_NVLS_ENABLE=0 torchrun --nproc_per_node=8 scripts/ep_torch_baseline.py \
      --mode nccl --shapes --json ep_torch_nccl.json
"""

import argparse
import json
import math
import os
import sys
import time

# Before torch / NCCL initialise: never use NVLink multicast (NVLS).
os.environ["NCCL_NVLS_ENABLE"] = "0"

try:
    import torch
except ImportError:  # pragma: no cover - depends on the machine
    sys.stderr.write("error: torch is not importable; this script needs PyTorch "
                     "(it runs on the GPU machine)\n")
    sys.exit(2)

SCALE_BLOCK = 128
FP8 = getattr(torch, "float8_e4m3fn", None)

DEEPSEEK_SHAPES = [
    # (tokens, hidden, experts, topk, dtype)
    (4096, 7168, 256, 8, "bf16"),
    (4096, 7168, 256, 8, "fp8"),
    (128, 7168, 256, 8, "bf16"),
    (128, 7168, 256, 8, "fp8"),
]


def die(msg, code=2):
    sys.stderr.write(f"error: {msg}\n")
    sys.stderr.flush()
    sys.exit(code)


# --------------------------------------------------------------------------------------
# Inputs, routing, layout
# --------------------------------------------------------------------------------------

def gen_routing(rank, T, E, K, seed, masked_frac):
    """DeepEP's generator, on the CPU with a per-rank generator (identical in every mode
    and on every rank that regenerates it). Returns (topk_idx [T,K] int64, weights [T,K] f32)."""
    g = torch.Generator(device="cpu")
    g.manual_seed(seed * 100003 + rank * 7919 + 1)
    scores = torch.randn((T, E), dtype=torch.float32, generator=g).abs() + 1
    vals, topk_idx = torch.topk(scores, K, dim=-1, largest=True, sorted=False)
    topk_idx = topk_idx.to(torch.int64)
    if masked_frac > 0:
        drop = torch.rand((T, K), generator=g) < masked_frac
        topk_idx = topk_idx.masked_fill(drop, -1)
        vals = vals.masked_fill(drop, 0.0)
    weights = vals / vals.sum(dim=-1, keepdim=True).clamp_min(1e-6)
    return topk_idx, weights.to(torch.float32)


def token_in_rank(topk_idx, E, W):
    """[T, W] bool: does token t go to rank r (deduplicated; -1 entries skipped)."""
    T = topk_idx.shape[0]
    rank_idx = torch.div(topk_idx, E // W, rounding_mode="floor")
    valid = topk_idx >= 0
    # send invalid entries to a spare column W, dropped afterwards
    rank_idx = torch.where(valid, rank_idx, torch.full_like(rank_idx, W))
    m = torch.zeros((T, W + 1), dtype=torch.bool)
    m.scatter_(1, rank_idx, True)
    return m[:, :W].contiguous()


def gen_inputs(rank, T, H, dtype, seed, device):
    """Small-integer token rows so that every sum in the check is exact.
    bf16: x in [-8, 8]. fp8: x in [-8, 8] as e4m3 (exact) with power-of-two scales."""
    g = torch.Generator(device="cpu")
    g.manual_seed(seed * 100003 + rank * 7919 + 2)
    x = torch.randint(-8, 9, (T, H), generator=g, dtype=torch.int32).to(torch.float32)
    if dtype == "bf16":
        return x.to(torch.bfloat16).to(device), None
    # powers of two in {0.5, 1, 2}: dequantised values x * s are exact in bf16
    e = torch.randint(-1, 2, (T, H // SCALE_BLOCK), generator=g, dtype=torch.int32)
    scales = torch.pow(2.0, e.to(torch.float32))
    return x.to(FP8).to(device), scales.to(device)


def dequant_bf16(rows, scales):
    """Identity expert: received rows -> bf16 (fp8: rows x 128-wide scales)."""
    if scales is None:
        return rows.to(torch.bfloat16)
    f = rows.to(torch.float32) * scales.repeat_interleave(SCALE_BLOCK, dim=1)
    return f.to(torch.bfloat16)


def as_bytes(t):
    """Byte view of a row-major [N, C] tensor (fp8 rows move as bytes: index_select and
    collectives over uint8 are supported everywhere; the bytes are the same)."""
    return t.view(torch.uint8)


def move_view(t):
    """What the dispatch moves: bf16 rows as bf16 (PyTorch's own element width), fp8 rows as
    uint8 (same 1-byte width; every index_select build supports it)."""
    return t.view(torch.uint8) if t.dtype == FP8 else t


def bytes_per_token(H, dtype):
    if dtype == "bf16":
        return H * 2
    return H * 1 + (H // SCALE_BLOCK) * 4


# --------------------------------------------------------------------------------------
# Timing
# --------------------------------------------------------------------------------------

class Timer:
    def __init__(self, device):
        self.cuda = device.type == "cuda"

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize()

    def time(self, fn, warmup, iters):
        """Per-iteration times in microseconds (CUDA events on the GPU)."""
        for _ in range(warmup):
            fn()
        self.sync()
        out = []
        if self.cuda:
            evs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                   for _ in range(iters)]
            for s, e in evs:
                s.record()
                fn()
                e.record()
            torch.cuda.synchronize()
            out = [s.elapsed_time(e) * 1e3 for s, e in evs]
        else:
            for _ in range(iters):
                t0 = time.perf_counter()
                fn()
                out.append((time.perf_counter() - t0) * 1e6)
        return out


def stats(us):
    s = sorted(us)
    return {"mean_us": sum(s) / len(s), "median_us": s[len(s) // 2], "min_us": s[0],
            "max_us": s[-1]}


def gbps(nbytes, us):
    return nbytes / 1e9 / (us * 1e-6) if us > 0 and nbytes > 0 else float("nan")


def measure_copy(nbytes, device, timer, warmup, iters):
    """Roofline: dst.copy_(src) of the same byte count, device to device."""
    n = max(int(nbytes), 1)
    src = torch.empty(n, dtype=torch.uint8, device=device)
    src.fill_(1)
    dst = torch.empty_like(src)
    t = stats(timer.time(lambda: dst.copy_(src), warmup, iters))
    del src, dst
    return t


# --------------------------------------------------------------------------------------
# Single GPU, W logical ranks
# --------------------------------------------------------------------------------------


def copy_rooflines(n_recv, H, dtype, device, timer, args):
    """Bytes moved by dispatch (n_recv rows of `dtype`, scales included) and combine (bf16
    rows), and the same-run device copy time of each (one copy measured when they are equal).
    Frees the caching allocator's blocks first, so the copies get fresh memory."""
    disp_bytes = n_recv * bytes_per_token(H, dtype)
    comb_bytes = n_recv * H * 2
    if device.type == "cuda":
        torch.cuda.empty_cache()
    t_copy_d = measure_copy(disp_bytes, device, timer, args.warmup, args.iters)
    t_copy_c = t_copy_d if comb_bytes == disp_bytes else measure_copy(
        comb_bytes, device, timer, args.warmup, args.iters)
    return disp_bytes, comb_bytes, t_copy_d, t_copy_c

def run_single_shape(args, device, timer, T, H, E, K, dtype):
    W = args.world
    if E % W:
        die(f"experts ({E}) must divide evenly over world ({W})")
    if dtype == "fp8" and H % SCALE_BLOCK:
        die(f"fp8 needs hidden ({H}) to be a multiple of {SCALE_BLOCK}")

    # ---- layout (outside the timed region) ----
    topk = [gen_routing(r, T, E, K, args.seed, args.masked_frac)[0] for r in range(W)]
    in_rank = [token_in_rank(topk[s], E, W) for s in range(W)]
    # idx[s][d]: sorted token ids of source s that go to destination d
    idx_cpu = [[torch.nonzero(in_rank[s][:, d], as_tuple=False).flatten() for d in range(W)]
               for s in range(W)]
    counts = [[int(idx_cpu[s][d].numel()) for d in range(W)] for s in range(W)]
    recv_tokens = [sum(counts[s][d] for s in range(W)) for d in range(W)]
    # received count per rank by the DeepEP formula (gbl_num_tokens_per_rank)
    deepep_recv = [int(sum(int(in_rank[s][:, d].sum()) for s in range(W))) for d in range(W)]
    assert deepep_recv == recv_tokens, (deepep_recv, recv_tokens)
    total_recv = sum(recv_tokens)
    # offsets: destination d receives source 0's tokens, then source 1's, ...
    off = [[0] * W for _ in range(W)]  # off[s][d]
    for d in range(W):
        o = 0
        for s in range(W):
            off[s][d] = o
            o += counts[s][d]
    idx = [[t.to(device) for t in row] for row in idx_cpu]
    n_unique = [in_rank[s].sum(dim=1).to(device) for s in range(W)]  # [T] per source

    # ---- inputs and buffers ----
    xs, scs = [], []
    for r in range(W):
        x, sc = gen_inputs(r, T, H, dtype, args.seed, device)
        xs.append(x)
        scs.append(sc)
    xb = [move_view(x) for x in xs]  # [T, H] bf16, or uint8 views of fp8 rows
    recv = [torch.empty((recv_tokens[d], H), dtype=xb[0].dtype, device=device)
            for d in range(W)]
    recv_sc = None
    if dtype == "fp8":
        recv_sc = [torch.empty((recv_tokens[d], H // SCALE_BLOCK), dtype=torch.float32,
                               device=device) for d in range(W)]
    acc = torch.zeros((W, T, H), dtype=torch.float32, device=device)
    out = torch.empty((W, T, H), dtype=torch.bfloat16, device=device)
    # slices of the receive buffers per (s, d), fixed by the layout
    pairs = [(s, d) for d in range(W) for s in range(W) if counts[s][d] > 0]

    def dispatch():
        for s, d in pairs:
            a, n = off[s][d], counts[s][d]
            torch.index_select(xb[s], 0, idx[s][d], out=recv[d][a:a + n])
            if recv_sc is not None:
                torch.index_select(scs[s], 0, idx[s][d], out=recv_sc[d][a:a + n])

    expert_out = [None] * W

    def prepare_expert():  # identity expert, not timed
        for d in range(W):
            rows = recv[d]
            if dtype == "fp8":
                rows = rows.view(FP8)
                expert_out[d] = dequant_bf16(rows, recv_sc[d])
            else:
                expert_out[d] = rows.clone()

    def combine():
        acc.zero_()
        for d in range(W):
            if recv_tokens[d] == 0:
                continue
            f = expert_out[d].float()  # fp32 accumulation
            for s in range(W):
                n = counts[s][d]
                if n:
                    a = off[s][d]
                    acc[s].index_add_(0, idx[s][d], f[a:a + n])
        out.copy_(acc)  # fp32 -> bf16

    # ---- correctness (first iteration) ----
    check = "skipped"
    if not args.no_check:
        dispatch()
        for d in range(W):
            for s in range(W):
                n = counts[s][d]
                if not n:
                    continue
                a = off[s][d]
                if not torch.equal(recv[d][a:a + n], xb[s].index_select(0, idx[s][d])):
                    die(f"dispatch check failed: rows {s}->{d} ({dtype} T={T})", 1)
                if recv_sc is not None and not torch.equal(
                        recv_sc[d][a:a + n], scs[s].index_select(0, idx[s][d])):
                    die(f"dispatch check failed: scales {s}->{d} ({dtype} T={T})", 1)
        prepare_expert()
        combine()
        timer.sync()
        for s in range(W):
            base = dequant_bf16(xs[s], scs[s]).float()
            want = (base * n_unique[s].to(torch.float32).unsqueeze(1)).to(torch.bfloat16)
            if not torch.equal(out[s], want):
                bad = (out[s] != want).any(dim=1).nonzero().flatten()[:5].tolist()
                die(f"combine check failed on rank {s} ({dtype} T={T}): "
                    f"combine(dispatch(x)) != x * unique destination ranks at tokens {bad}", 1)
        check = "ok"
    else:
        dispatch()
        prepare_expert()

    # ---- timing ----
    t_disp = stats(timer.time(dispatch, args.warmup, args.iters))
    prepare_expert()
    t_comb = stats(timer.time(combine, args.warmup, args.iters))

    del recv, recv_sc, acc, out, expert_out, xs, scs, xb, idx
    disp_bytes, comb_bytes, t_copy_d, t_copy_c = copy_rooflines(total_recv, H, dtype, device, timer, args)

    row = {
        "mode": "single", "world": W, "tokens": T, "hidden": H, "experts": E, "topk": K,
        "dtype": dtype, "check": check,
        "recv_tokens_per_rank": recv_tokens, "total_recv_tokens": total_recv,
        "dispatch_bytes": disp_bytes, "combine_bytes": comb_bytes,
        "dispatch": t_disp, "combine": t_comb,
        "copy_dispatch_bytes": t_copy_d, "copy_combine_bytes": t_copy_c,
    }
    finish_row(row)
    return row


def finish_row(row):
    d_us, c_us = row["dispatch"]["mean_us"], row["combine"]["mean_us"]
    row["dispatch_us"] = d_us
    row["combine_us"] = c_us
    row["dispatch_gbps"] = gbps(row["dispatch_bytes"], d_us)
    row["combine_gbps"] = gbps(row["combine_bytes"], c_us)
    row["copy_gbps"] = gbps(row["dispatch_bytes"], row["copy_dispatch_bytes"]["mean_us"])
    row["copy_combine_gbps"] = gbps(row["combine_bytes"], row["copy_combine_bytes"]["mean_us"])
    row["dispatch_over_copy"] = ratio(row["dispatch_gbps"], row["copy_gbps"])
    row["combine_over_copy"] = ratio(row["combine_gbps"], row["copy_combine_gbps"])


def ratio(a, b):
    return a / b if b > 0 else float("nan")


HEADER_COLS = ("{:<32} {:>6} {:>9} {:>10} {:>9} {:>10} {:>9} {:>9} {:>9} {:>7} {:>7}")


def print_table_header(first_col="shape"):
    print(HEADER_COLS.format(first_col, "check", "recv_tok", "disp_us", "disp_GB/s", "comb_us",
                             "comb_GB/s", "copy_GB/s", "copyc_GB/s", "d/copy", "c/copy"))


def print_row(label, r):
    print(HEADER_COLS.format(
        label, r["check"], r["total_recv_tokens"], f"{r['dispatch_us']:.1f}",
        f"{r['dispatch_gbps']:.1f}", f"{r['combine_us']:.1f}", f"{r['combine_gbps']:.1f}",
        f"{r['copy_gbps']:.1f}", f"{r['copy_combine_gbps']:.1f}",
        f"{r['dispatch_over_copy']:.2f}", f"{r['combine_over_copy']:.2f}"))
    sys.stdout.flush()


def shape_label(T, H, E, K, dtype):
    return f"T={T} H={H} E={E} K={K} {dtype}"


def describe(mode, args, device, W):
    lines = [
        f"# ep_torch_baseline mode={mode} world={W} device={device_name(device)} "
        f"torch={torch.__version__} iters={args.iters} warmup={args.warmup} seed={args.seed}",
        "# routing: DeepEP generator scores=|randn(T,E)|+1, topk(scores,K); experts split "
        "evenly (E/W per rank); dispatch dedup per rank",
        "# layout (masks, index lists, offsets"
        + (", counts all_to_all" if mode == "nccl" else "")
        + ") computed ONCE outside the timed region, as a real implementation computes "
        "its layout first",
    ]
    if mode == "single":
        lines.append("# dispatch: index_select per (src,dst) pair into preallocated receive "
                     "buffers (bf16 rows; fp8 rows as uint8 + f32 scales [T,H/128]); combine: identity "
                     "expert (rows->bf16, prepared untimed), index_add_ per (dst,src) into "
                     "fp32 [T,H] accumulators, cast to bf16")
    else:
        lines.append("# dispatch: index_select into send buffer + all_to_all_single of rows "
                     "(fp8: + scales); combine: reverse all_to_all_single + index_add_ into "
                     "fp32 accumulator, cast to bf16; NCCL_NVLS_ENABLE=0")
    lines.append("# bytes (DeepEP/MORI): dispatch = received tokens x (bf16: H*2 | fp8: H + "
                 "H/128*4); combine = received tokens x H*2; GB=1e9; times are means of "
                 + ("CUDA-event" if device.type == "cuda" else "perf_counter")
                 + "-timed iterations")
    lines.append("# copy_GB/s: dst.copy_(src) of the dispatch byte count (copyc: of the "
                 "combine byte count), same run; d/copy and c/copy are the ratios")
    lines.append("# check: dispatched rows/scales equal the source rows, and "
                 "combine(dispatch(x)) == x * unique destination ranks exactly")
    for l in lines:
        print(l)
    sys.stdout.flush()


def device_name(device):
    if device.type == "cuda":
        return f"cuda:{device.index if device.index is not None else torch.cuda.current_device()}" \
               f" ({torch.cuda.get_device_name(device)})"
    return "cpu"


def shape_list(args):
    if args.shapes:
        return DEEPSEEK_SHAPES
    return [(args.tokens, args.hidden, args.experts, args.topk, args.dtype)]


def main_single(args, device):
    timer = Timer(device)
    describe("single", args, device, args.world)
    print_table_header()
    rows = []
    for T, H, E, K, dtype in shape_list(args):
        r = run_single_shape(args, device, timer, T, H, E, K, dtype)
        rows.append(r)
        print_row(shape_label(T, H, E, K, dtype), r)
    write_json(args, {"mode": "single", "device": device_name(device),
                      "torch": torch.__version__, "args": vars(args), "rows": rows})


# --------------------------------------------------------------------------------------
# One rank per GPU, NCCL all_to_all
# --------------------------------------------------------------------------------------

def run_nccl_shape(args, device, timer, dist, rank, W, T, H, E, K, dtype):
    if E % W:
        die(f"experts ({E}) must divide evenly over world ({W})")
    if dtype == "fp8" and H % SCALE_BLOCK:
        die(f"fp8 needs hidden ({H}) to be a multiple of {SCALE_BLOCK}")
    # ---- layout (outside the timed region) ----
    topk, _ = gen_routing(rank, T, E, K, args.seed, args.masked_frac)
    in_rank = token_in_rank(topk, E, W)
    idx_d = [torch.nonzero(in_rank[:, d], as_tuple=False).flatten() for d in range(W)]
    send_counts = [int(t.numel()) for t in idx_d]
    send_idx = torch.cat(idx_d).to(device)
    n_unique = in_rank.sum(dim=1).to(device)
    # counts exchanged with an all_to_all of sizes (DeepEP's layout step)
    sc_t = torch.tensor(send_counts, dtype=torch.int64, device=device)
    rc_t = torch.empty_like(sc_t)
    dist.all_to_all_single(rc_t, sc_t)
    recv_counts = [int(v) for v in rc_t.tolist()]
    n_send, n_recv = sum(send_counts), sum(recv_counts)

    x, scales = gen_inputs(rank, T, H, dtype, args.seed, device)
    xb = move_view(x)  # bf16 rows, or uint8 views of fp8 rows
    send = torch.empty((n_send, H), dtype=xb.dtype, device=device)
    recv = torch.empty((n_recv, H), dtype=xb.dtype, device=device)
    S = H // SCALE_BLOCK
    if scales is not None:
        send_sc = torch.empty((n_send, S), dtype=torch.float32, device=device)
        recv_sc = torch.empty((n_recv, S), dtype=torch.float32, device=device)
    back = torch.empty((n_send, H), dtype=torch.bfloat16, device=device)
    acc = torch.zeros((T, H), dtype=torch.float32, device=device)
    out = torch.empty((T, H), dtype=torch.bfloat16, device=device)

    def dispatch():
        torch.index_select(xb, 0, send_idx, out=send)
        # collectives move bytes (same bytes; every backend supports uint8)
        dist.all_to_all_single(as_bytes(recv), as_bytes(send), recv_counts, send_counts)
        if scales is not None:
            torch.index_select(scales, 0, send_idx, out=send_sc)
            dist.all_to_all_single(as_bytes(recv_sc), as_bytes(send_sc), recv_counts,
                                   send_counts)

    holder = {}

    def prepare_expert():  # identity expert, not timed
        if scales is not None:
            holder["y"] = dequant_bf16(recv.view(FP8), recv_sc)
        else:
            holder["y"] = recv.clone()

    def combine():
        y = holder["y"]
        dist.all_to_all_single(as_bytes(back), as_bytes(y), send_counts, recv_counts)
        acc.zero_()
        acc.index_add_(0, send_idx, back.float())
        out.copy_(acc)

    check = "skipped"
    if not args.no_check:
        dispatch()
        timer.sync()
        ok, msg = True, ""
        # the rows from source s must equal x_s[idx_{s->rank}] (regenerated here)
        a = 0
        for s in range(W):
            n = recv_counts[s]
            tk_s, _ = gen_routing(s, T, E, K, args.seed, args.masked_frac)
            ir_s = token_in_rank(tk_s, E, W)
            want_idx = torch.nonzero(ir_s[:, rank], as_tuple=False).flatten().to(device)
            if want_idx.numel() != n:
                ok, msg = False, f"count from {s}: {n} != {want_idx.numel()}"
                break
            if n:
                xs_s, sc_s = gen_inputs(s, T, H, dtype, args.seed, device)
                if not torch.equal(recv[a:a + n], move_view(xs_s).index_select(0, want_idx)):
                    ok, msg = False, f"dispatched rows from {s} differ"
                    break
                if sc_s is not None and not torch.equal(recv_sc[a:a + n],
                                                        sc_s.index_select(0, want_idx)):
                    ok, msg = False, f"dispatched scales from {s} differ"
                    break
            a += n
        agree_or_exit(dist, device, rank, ok, f"dispatch check failed ({dtype} T={T}): {msg}")
        # every rank runs combine (a collective) whatever its own figures
        prepare_expert()
        combine()
        timer.sync()
        want = (dequant_bf16(x, scales).float()
                * n_unique.to(torch.float32).unsqueeze(1)).to(torch.bfloat16)
        ok = torch.equal(out, want)
        agree_or_exit(dist, device, rank, ok, f"combine check failed ({dtype} T={T}): "
                      "combine(dispatch(x)) != x * unique destination ranks")
        check = "ok"
    else:
        dispatch()
        prepare_expert()

    dist.barrier()
    t_disp = stats(timer.time(dispatch, args.warmup, args.iters))
    prepare_expert()
    dist.barrier()
    t_comb = stats(timer.time(combine, args.warmup, args.iters))
    dist.barrier()

    del send, recv, back, acc, out, holder
    disp_bytes, comb_bytes, t_copy_d, t_copy_c = copy_rooflines(n_recv, H, dtype, device, timer, args)
    row = {
        "mode": "nccl", "rank": rank, "world": W, "tokens": T, "hidden": H, "experts": E,
        "topk": K, "dtype": dtype, "check": check,
        "recv_tokens_per_source": recv_counts, "total_recv_tokens": n_recv,
        "sent_tokens": n_send,
        "dispatch_bytes": disp_bytes, "combine_bytes": comb_bytes,
        "dispatch": t_disp, "combine": t_comb,
        "copy_dispatch_bytes": t_copy_d, "copy_combine_bytes": t_copy_c,
    }
    finish_row(row)
    return row


def agree_or_exit(dist, device, rank, ok, msg):
    """All ranks learn whether any rank failed; all exit together (no rank left waiting in
    a collective)."""
    flag = torch.tensor([0 if ok else 1], dtype=torch.int64, device=device)
    dist.all_reduce(flag)
    if int(flag.item()):
        if not ok:
            sys.stderr.write(f"error: rank {rank}: {msg}\n")
            sys.stderr.flush()
        dist.destroy_process_group()
        sys.exit(1)


def main_nccl(args, device_kind):
    import torch.distributed as dist
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        die("--mode nccl runs under torchrun, e.g. "
            "torchrun --nproc_per_node=8 scripts/ep_torch_baseline.py --mode nccl --shapes")
    rank = int(os.environ["RANK"])
    W = int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    if device_kind == "cuda":
        if local >= torch.cuda.device_count():
            die(f"LOCAL_RANK {local} but only {torch.cuda.device_count()} CUDA device(s)")
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
        dist.init_process_group("nccl", device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    timer = Timer(device)
    if rank == 0:
        describe("nccl" if device_kind == "cuda" else "nccl(gloo on cpu)", args, device, W)
        print_table_header("shape / rank")
    all_rows = []
    for T, H, E, K, dtype in shape_list(args):
        r = run_nccl_shape(args, device, timer, dist, rank, W, T, H, E, K, dtype)
        gathered = gather_rows(dist, r, W, device)
        if rank == 0:
            label = shape_label(T, H, E, K, dtype)
            for g in gathered:
                print_row(f"{label} r{g['rank']}", g)
            agg = aggregate(gathered)
            print_row(f"{label} all", agg)
            all_rows.append({"shape": label, "ranks": gathered, "aggregate": agg})
    if rank == 0:
        try:
            nccl_version = ".".join(str(v) for v in torch.cuda.nccl.version())
        except Exception:  # noqa: BLE001 - cpu/gloo test runs
            nccl_version = None
        print(f"# backend={dist.get_backend()} nccl={nccl_version} "
              f"NCCL_NVLS_ENABLE={os.environ.get('NCCL_NVLS_ENABLE')}; 'all' rows: bytes of "
              "all ranks over the slowest rank's mean time, copy = sum of per-rank copy GB/s")
        write_json(args, {"mode": "nccl", "backend": dist.get_backend(), "world": W,
                          "nccl_version": nccl_version,
                          "device": device_name(device), "torch": torch.__version__,
                          "nccl_nvls_enable": os.environ.get("NCCL_NVLS_ENABLE"),
                          "args": vars(args), "rows": all_rows})
    dist.barrier()
    dist.destroy_process_group()


STAT_KEYS = ("mean_us", "median_us", "min_us", "max_us")
TIMED = ("dispatch", "combine", "copy_dispatch_bytes", "copy_combine_bytes")
CHECK_CODES = ("ok", "skipped", "FAIL")


def gather_rows(dist, r, W, device):
    """Every rank's figures to every rank as one float64 tensor (all_gather_object would
    need numpy, which the GPU machine need not have)."""
    vals = [r["rank"], CHECK_CODES.index(r["check"]), r["total_recv_tokens"],
            r["sent_tokens"], r["dispatch_bytes"], r["combine_bytes"]]
    for k in TIMED:
        vals += [r[k][s] for s in STAT_KEYS]
    vals += r["recv_tokens_per_source"]
    t = torch.tensor(vals, dtype=torch.float64, device=device)
    out = [torch.empty_like(t) for _ in range(W)]
    dist.all_gather(out, t)
    rows = []
    for o in out:
        v = o.tolist()
        g = {k: r[k] for k in ("mode", "world", "tokens", "hidden", "experts", "topk", "dtype")}
        g["rank"] = int(v[0])
        g["check"] = CHECK_CODES[int(v[1])]
        g["total_recv_tokens"], g["sent_tokens"] = int(v[2]), int(v[3])
        g["dispatch_bytes"], g["combine_bytes"] = int(v[4]), int(v[5])
        i = 6
        for k in TIMED:
            g[k] = dict(zip(STAT_KEYS, v[i:i + 4]))
            i += 4
        g["recv_tokens_per_source"] = [int(c) for c in v[i:i + W]]
        finish_row(g)
        rows.append(g)
    return rows


def aggregate(rows):
    """All ranks together: total received tokens / bytes over the slowest rank's time
    (the collective finishes when the last rank does); copy = mean of the ranks' copy."""
    r0 = rows[0]
    agg = {k: r0[k] for k in ("mode", "world", "tokens", "hidden", "experts", "topk", "dtype")}
    agg["rank"] = "all"
    agg["check"] = "ok" if all(r["check"] == "ok" for r in rows) else \
        ("skipped" if all(r["check"] == "skipped" for r in rows) else "FAIL")
    agg["total_recv_tokens"] = sum(r["total_recv_tokens"] for r in rows)
    agg["dispatch_bytes"] = sum(r["dispatch_bytes"] for r in rows)
    agg["combine_bytes"] = sum(r["combine_bytes"] for r in rows)
    agg["dispatch"] = {"mean_us": max(r["dispatch"]["mean_us"] for r in rows)}
    agg["combine"] = {"mean_us": max(r["combine"]["mean_us"] for r in rows)}
    # per-rank copy bandwidths run on separate GPUs at once: sum of the ranks' bandwidths
    cd = sum(r["copy_gbps"] for r in rows)
    cc = sum(r["copy_combine_gbps"] for r in rows)
    agg["copy_dispatch_bytes"] = {"mean_us": ratio(agg["dispatch_bytes"] / 1e9, cd) * 1e6}
    agg["copy_combine_bytes"] = {"mean_us": ratio(agg["combine_bytes"] / 1e9, cc) * 1e6}
    finish_row(agg)
    agg["note"] = ("aggregate: bytes of all ranks over the slowest rank's mean time; "
                   "copy = sum of per-rank copy GB/s")
    return agg


# --------------------------------------------------------------------------------------

def write_json(args, obj):
    if not args.json:
        return
    def clean(v):  # NaN/inf (e.g. no received tokens) -> null: strict JSON readers
        if isinstance(v, float) and not math.isfinite(v):
            return None
        if isinstance(v, dict):
            return {k: clean(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [clean(x) for x in v]
        return v
    with open(args.json, "w") as f:
        json.dump(clean(obj), f, indent=1, default=str, allow_nan=False)
    print(f"# wrote {args.json}")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description="PyTorch MoE dispatch/combine baseline "
                                "(DeepEP/MORI accounting) for bench_dispatch_combine")
    p.add_argument("--mode", choices=("single", "nccl"), default="single")
    p.add_argument("--world", type=int, default=8,
                   help="logical ranks on one GPU (single mode; nccl uses WORLD_SIZE)")
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--hidden", type=int, default=7168)
    p.add_argument("--experts", type=int, default=256)
    p.add_argument("--topk", type=int, default=8)
    p.add_argument("--dtype", choices=("bf16", "fp8"), default="bf16")
    p.add_argument("--shapes", action="store_true",
                   help="DeepSeek-V3 (T=4096) and decode (T=128), H=7168 E=256 K=8, "
                   "bf16 and fp8")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-check", action="store_true", help="skip the correctness check")
    p.add_argument("--json", metavar="FILE", help="write all figures to FILE")
    # hidden: testing on a machine without a GPU, and -1 entries in the routing
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help=argparse.SUPPRESS)
    p.add_argument("--masked-frac", type=float, default=0.0, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.iters < 1 or a.warmup < 0:
        p.error("--iters must be >= 1 and --warmup >= 0")
    if a.world < 1:
        p.error("--world must be >= 1")
    for T, H, E, K, dt in shape_list(a):
        if T < 0 or H <= 0 or E <= 0 or not (1 <= K <= E):
            p.error(f"bad shape T={T} H={H} E={E} K={K}")
    return a


def main(argv=None):
    args = parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        die("no CUDA device: this script runs on the GPU machine")
    if any(s[4] == "fp8" for s in shape_list(args)) and FP8 is None:
        die("this torch has no torch.float8_e4m3fn")
    if args.mode == "single":
        device = torch.device(args.device)
        if args.device == "cuda":
            device = torch.device("cuda", torch.cuda.current_device())
        main_single(args, device)
    else:
        main_nccl(args, args.device)


if __name__ == "__main__":
    main()
