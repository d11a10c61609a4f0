"""mori_rs.ops on the GPU machine: WORLD ranks (processes) sharing GPU 0, joined by a gloo
torch.distributed group, dispatch and combine checked against a reference computed from every
rank's inputs; then one CUDA-graph capture of dispatch+combine replayed REPLAYS times with new
token values, each replay checked.

    python3 ops_gpu.py [--world 8] [--tokens 32] [--hidden 256] [--replays 10] [--bootstrap torch|socket]

Tokens are integer-valued f32, so every sum is exact and the checks compare bit for bit.
Prints one line per rank and "ops_gpu: OK" when every rank passed.
"""

import argparse
import os
import socket
import sys
import time
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def routing(rank, a):
    """This rank's inputs: integer-valued x, top-k expert ids (some -1), f32 weights."""
    g = torch.Generator().manual_seed(1234 + rank)
    e = a.world * a.experts
    x = torch.randint(-64, 64, (a.tokens, a.hidden), generator=g).float()
    idx = torch.stack([torch.randperm(e, generator=g)[: a.topk] for _ in range(a.tokens)]).to(torch.int32)
    idx[torch.rand(a.tokens, a.topk, generator=g) < 0.1] = -1
    w = torch.rand(a.tokens, a.topk, generator=g)
    return x, idx, w


def dest_ranks(idx_row, experts):
    return sorted({int(v) // experts for v in idx_row.tolist() if v >= 0})


def check_dispatch(rank, a, n, out, ow, oidx, everyone):
    """The rows this rank received equal, as a multiset, the reference's (each (source, token)
    once, with its ids and weights)."""
    want = []
    for src, (x, idx, w) in enumerate(everyone):
        for t in range(a.tokens):
            if rank in dest_ranks(idx[t], a.experts):
                want.append((tuple(x[t].tolist()), tuple(idx[t].tolist()), tuple(w[t].tolist())))
    got = [(tuple(out[i].tolist()), tuple(oidx[i].tolist()), tuple(ow[i].tolist())) for i in range(n)]
    return n == len(want) and sorted(got) == sorted(want), f"received {n}, reference {len(want)}"


def expected_combine(x, idx, a):
    k = torch.tensor([len(dest_ranks(idx[t], a.experts)) for t in range(a.tokens)], dtype=torch.float32)
    return x * k[:, None]


def worker(rank, a, port, results):
    ok, msg = False, ""
    try:
        os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=a.world)
        torch.cuda.set_device(0)
        from mori_rs.ops import EpDispatchCombineConfig, EpDispatchCombineOp

        cfg = EpDispatchCombineConfig(
            data_type=torch.float32, rank=rank, world_size=a.world, hidden_dim=a.hidden, scale_dim=0, scale_type_size=0,
            max_token_type_size=4, max_num_inp_token_per_rank=a.tokens, num_experts_per_rank=a.experts,
            num_experts_per_token=a.topk, warp_num_per_block=8, block_num=a.blocks,
        )
        if a.bootstrap == "socket":
            os.environ.update(MORI_RANK=str(rank), MORI_WORLD_SIZE=str(a.world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(a.socket_port))
        op = EpDispatchCombineOp(cfg, timeout_ms=60_000, bootstrap=a.bootstrap)
        x, idx, w = routing(rank, a)
        everyone = [None] * a.world
        dist.all_gather_object(everyone, (x, idx, w))
        xd, idxd, wd = x.cuda(), idx.cuda(), w.cuda()
        dist.barrier()
        t0 = time.perf_counter()
        out, ow, _, oidx, total = op.dispatch(xd, wd, None, idxd)
        n = op.sync_status()
        t_disp = time.perf_counter() - t0
        assert int(total.item()) == n, (int(total.item()), n)
        good, why = check_dispatch(rank, a, n, out.cpu(), ow.cpu(), oidx.cpu(), everyone)
        assert good, f"dispatch: {why}"
        dist.barrier()
        y, yw = op.combine(out, ow, idxd)
        torch.cuda.synchronize()
        assert torch.equal(y.cpu(), expected_combine(x, idx, a)), "combine: sums differ from the reference"
        kk = torch.tensor([len(dest_ranks(idx[t], a.experts)) for t in range(a.tokens)], dtype=torch.float32)
        assert torch.allclose(yw.cpu(), w * kk[:, None], rtol=1e-6), "combine weights differ"
        # CUDA graph: warm up on a side stream, capture dispatch + combine, replay with new x.
        sx = xd.clone()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        dist.barrier()
        with torch.cuda.stream(s):
            o = op.dispatch(sx, wd, None, idxd)
            op.combine(o[0], o[1], idxd)
        torch.cuda.current_stream().wait_stream(s)
        torch.cuda.synchronize()
        snaps = op.argument_snapshots()
        dist.barrier()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            o = op.dispatch(sx, wd, None, idxd)
            gy, _ = op.combine(o[0], o[1], idxd)
        assert op.argument_snapshots() == snaps, "capture made new argument snapshots"
        torch.cuda.synchronize()
        g = torch.Generator().manual_seed(99 + rank)
        t_rep = []
        for i in range(a.replays):
            nx = torch.randint(-64, 64, (a.tokens, a.hidden), generator=g).float()
            sx.copy_(nx.cuda())
            torch.cuda.synchronize()
            dist.barrier()
            t0 = time.perf_counter()
            graph.replay()
            torch.cuda.synchronize()
            t_rep.append(time.perf_counter() - t0)
            assert torch.equal(gy.cpu(), expected_combine(nx, idx, a)), f"replay {i}: combine differs"
            assert int(o[4].item()) == n, f"replay {i}: received {int(o[4].item())}, want {n}"
            dist.barrier()
        ok = True
        msg = (f"rank {rank} ({a.bootstrap} bootstrap): dispatch received {n} rows (reference equal), combine exact, graph captured, "
               f"{a.replays} replays exact; eager dispatch {t_disp * 1e3:.1f} ms, replay median {sorted(t_rep)[len(t_rep) // 2] * 1e3:.1f} ms")
        dist.barrier()
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001
        msg = f"rank {rank}: FAILED\n{traceback.format_exc()}"
    results.put((rank, ok, msg))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--world", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--experts", type=int, default=4, help="experts per rank")
    ap.add_argument("--topk", type=int, default=4)
    ap.add_argument("--blocks", type=int, default=4)
    ap.add_argument("--replays", type=int, default=10)
    ap.add_argument("--bootstrap", default="torch", choices=["torch", "socket"], help="how the op's ranks exchange heap handles")
    a = ap.parse_args()
    a.socket_port = free_port()
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=worker, args=(r, a, port, q)) for r in range(a.world)]
    for p in procs:
        p.start()
    res = {}
    deadline = time.time() + 300
    while len(res) < a.world and time.time() < deadline:
        try:
            r, ok, msg = q.get(timeout=5)
            res[r] = (ok, msg)
            print(msg, flush=True)
        except Exception:  # noqa: BLE001
            if all(not p.is_alive() for p in procs) and q.empty():
                break
    for p in procs:
        p.join(10)
        if p.is_alive():
            p.kill()
    good = len(res) == a.world and all(ok for ok, _ in res.values())
    print("ops_gpu:", "OK" if good else f"FAILED ({sum(ok for ok, _ in res.values())}/{a.world} ranks passed)")
    return 0 if good else 1


if __name__ == "__main__":
    sys.exit(main())
