"""mori_rs.io on GPU memory from Python, two processes on one GPU (torch CUDA tensors), and
NIXL driven by the same harness.

    python3 io_gpu.py check                 # vLLM READ flow + SGLang multi-pair WRITE flow, bytes checked
    python3 io_gpu.py bench --impl mori_rs  # batch-1 sweep and batch-128 points, write and read
    python3 io_gpu.py bench --impl nixl     # the same through nixl_agent (UCX backend, defaults)
    python3 io_gpu.py copy                  # the same shapes as bare device copies (torch), this process

Each prints one line per point and, with --json PATH, writes the rows. Latency per transfer
is the whole timed loop / (iterations x batch) as bench_engine reports it (nixlbench's
formula); GB/s = bytes moved / loop time (GB = 1e9). Every stop-and-wait iteration posts,
then waits (mori_rs: TransferStatus.Wait(); NIXL: check_xfer_state until DONE).
"""

import argparse
import json
import os
import subprocess
import sys
import time
from multiprocessing.connection import Client, Listener

import numpy as np
import torch

AUTH = b"mori-rs-io-gpu"
LAYERS, BLOCKS, BLOCK = 4, 256, 32 << 10
BUF = 160 << 20
SIZES = [8, 64, 512, 4096, 32768, 262144, 1 << 20, 4 << 20, 16 << 20, 64 << 20]
BATCH_POINTS = [(128, 4096), (128, 65536), (128, 1 << 20)]


def fill(t, seed):
    g = torch.Generator(device=t.device)
    g.manual_seed(seed)
    t.copy_(torch.randint(0, 256, t.shape, dtype=torch.uint8, device=t.device, generator=g))


def timed(run, budget_s=0.2):
    """Warms up, picks an iteration count filling about `budget_s` (5..2000), warms up again
    (a tenth of it, at most 100: bench_engine's --warmup-iters of the overhead runs), times it."""
    t0 = time.perf_counter()
    run(5)
    per = (time.perf_counter() - t0) / 5
    it = int(max(5, min(2000, budget_s / max(per, 1e-9))))
    run(min(it // 10 + 1, 100))
    t0 = time.perf_counter()
    run(it)
    return it, time.perf_counter() - t0


# ---------------------------------------------------------------- target process


def target_main(impl, port, mode):
    torch.cuda.set_device(0)
    conn = Client(("127.0.0.1", port), authkey=AUTH)
    if mode == "check":
        import mori_rs.io as mio

        eng = mio.IOEngine("prefill-gpu", mio.IOEngineConfig("127.0.0.1", 0))
        eng.create_backend(mio.BackendType.XGMI)
        layers = []
        for i in range(2 * LAYERS):
            t = torch.empty(BLOCKS * BLOCK, dtype=torch.uint8, device="cuda")
            fill(t, 100 + i)
            layers.append(t)
        sink = [torch.zeros(BLOCKS * BLOCK, dtype=torch.uint8, device="cuda") for _ in range(2 * LAYERS)]
        torch.cuda.synchronize()
        descs = [eng.register_torch_tensor(t) for t in layers + sink]
        conn.send({"engine": eng.get_engine_desc().pack(), "mems": [d.pack() for d in descs]})
        eng.register_remote_engine(mio.EngineDesc.unpack(conn.recv()))
        # READ flow: one message per layer once the reader has it.
        got = sorted(eng.wait_notif(30_000)[1] for _ in range(2 * LAYERS))
        conn.send(got)
        # WRITE flow: the sender's message, then the bytes are checked here.
        key, msg = eng.wait_notif(30_000)
        want = conn.recv()  # [(sink index, dst block, src layer, src block)]
        bad = 0
        for si, db, sl, sb in want:
            exp = layers_src(sl)[sb * BLOCK:(sb + 1) * BLOCK]
            if not torch.equal(sink[si][db * BLOCK:(db + 1) * BLOCK], exp):
                bad += 1
        conn.send({"notif": (key, msg), "bad": bad, "checked": len(want)})
        conn.recv()
        for d in descs:
            eng.deregister_memory(d)
        return
    dst = torch.empty(BUF, dtype=torch.uint8, device="cuda")
    fill(dst, 7)
    torch.cuda.synchronize()
    if impl == "mori_rs":
        import mori_rs.io as mio

        eng = mio.IOEngine("target", mio.IOEngineConfig("127.0.0.1", 0))
        eng.create_backend(mio.BackendType.XGMI)
        d = eng.register_torch_tensor(dst)
        conn.send({"engine": eng.get_engine_desc().pack(), "mem": d.pack()})
    else:
        agent, _ = nixl_agent("target")
        reg = agent.register_memory(dst)  # noqa: F841 (kept registered while serving)
        conn.send({"md": agent.get_agent_metadata(), "addr": dst.data_ptr(), "len": dst.numel()})
    msg = conn.recv()  # "checksum" request after the write sweep, then "bye"
    while msg != "bye":
        n = msg
        torch.cuda.synchronize()
        conn.send(int(dst[:n].to(torch.int64).sum().item()))
        msg = conn.recv()


def layers_src(i):
    t = torch.empty(BLOCKS * BLOCK, dtype=torch.uint8, device="cuda")
    fill(t, 100 + i)
    return t


def nixl_agent(name):
    try:
        from nixl._api import nixl_agent as agent_cls, nixl_agent_config
    except ImportError:
        from nixl_cu13._api import nixl_agent as agent_cls, nixl_agent_config
    return agent_cls(name, nixl_agent_config(backends=["UCX"])), None


def spawn_target(impl, mode):
    lis = Listener(("127.0.0.1", 0), authkey=AUTH)
    p = subprocess.Popen([sys.executable, os.path.abspath(__file__), "target", "--impl", impl, "--port", str(lis.address[1]), "--mode", mode])
    return p, lis.accept(), lis


# ---------------------------------------------------------------- correctness


def check():
    import mori_rs.io as mio

    torch.cuda.set_device(0)
    p, conn, lis = spawn_target("mori_rs", "check")
    hello = conn.recv()
    eng = mio.IOEngine("decode-gpu", mio.IOEngineConfig("127.0.0.1", 0))
    eng.create_backend(mio.BackendType.XGMI)
    peer = mio.EngineDesc.unpack(hello["engine"])
    eng.register_remote_engine(peer)
    conn.send(eng.get_engine_desc().pack())
    mems = [mio.MemoryDesc.unpack(b) for b in hello["mems"]]
    src_layers, sinks = mems[: 2 * LAYERS], mems[2 * LAYERS:]
    local = [torch.zeros(BLOCKS * BLOCK, dtype=torch.uint8, device="cuda") for _ in range(2 * LAYERS)]
    ldescs = [eng.register_torch_tensor(t) for t in local]
    # (a) vLLM's READ flow: one session per layer, batch_read of block offsets, polling.
    sessions = [eng.create_session(ldescs[i], src_layers[i]) for i in range(2 * LAYERS)]
    assert all(s.backend() == mio.BackendType.XGMI for s in sessions)
    rng = np.random.default_rng(5)
    rb, lb = rng.permutation(BLOCKS)[:200], rng.permutation(BLOCKS)[:200]
    lo, ro = lb.astype(np.int64) * BLOCK, rb.astype(np.int64) * BLOCK
    sz = np.full(len(lo), BLOCK, dtype=np.int64)
    sts = [s.batch_read(lo, ro, sz, eng.allocate_transfer_uid(), notif_msg=f"req-9:{i}".encode()) for i, s in enumerate(sessions)]
    deadline = time.time() + 30
    while not all(s.Succeeded() for s in sts):
        assert not any(s.Failed() for s in sts), [s.Message() for s in sts]
        assert time.time() < deadline, "reads not done within 30 s"
        time.sleep(0.001)
    torch.cuda.synchronize()
    bad = 0
    for i in range(2 * LAYERS):
        src = layers_src(i)
        for a, b in zip(lb, rb):
            bad += not torch.equal(local[i][a * BLOCK:(a + 1) * BLOCK], src[b * BLOCK:(b + 1) * BLOCK])
        untouched = sorted(set(range(BLOCKS)) - set(lb.tolist()))
        bad += sum(bool(local[i][u * BLOCK:(u + 1) * BLOCK].any()) for u in untouched)
    notifs = conn.recv()
    print(f"check read flow: {2 * LAYERS} layers x {len(lb)} blocks of {BLOCK} B over {sessions[0].backend()}, bad blocks {bad}, notifications {len(notifs)}")
    assert bad == 0 and notifs == sorted(f"req-9:{i}".encode() for i in range(2 * LAYERS))
    # (b) SGLang's multi-pair batch_write + wait_all loop into the target's sinks.
    los, ros, szs, want = [], [], [], []
    for i in range(2 * LAYERS):
        pick = rng.permutation(len(lb))[:64]
        d_blocks = rng.permutation(BLOCKS)[:64]
        los.append([int(lb[k]) * BLOCK for k in pick])
        ros.append([int(b) * BLOCK for b in d_blocks])
        szs.append([BLOCK] * 64)
        want += [(i, int(db), i, int(rb[k])) for k, db in zip(pick, d_blocks)]
    uids = [eng.allocate_transfer_uid() for _ in range(2 * LAYERS)]
    sts = eng.batch_write(ldescs, los, sinks, ros, szs, uids)
    while (rc := eng.wait_all(sts, timeout_ms=5)) == mio.StatusCode.IN_PROGRESS:
        assert time.time() < deadline + 30
    assert rc == mio.StatusCode.SUCCESS, [s.Message() for s in sts]
    eng.send_notif(peer.key, b"written").wait(10_000)
    conn.send(want)
    rep = conn.recv()
    print(f"check write flow: {len(sts)} pairs in one multi-pair batch_write, {rep['checked']} blocks checked at the target, bad {rep['bad']}, notif {rep['notif']}")
    assert rep["bad"] == 0 and rep["notif"] == ("decode-gpu", b"written")
    conn.send("bye")
    p.wait(60)
    for d in ldescs:
        eng.deregister_memory(d)
    print("check: OK")


# ---------------------------------------------------------------- timing


def points(sizes=None, batches=True):
    for op in ("write", "read"):
        for size in sizes or SIZES:
            yield op, 1, size
        if batches:
            for b, size in BATCH_POINTS:
                yield op, b, size


def bench(impl, json_path, variant="single", sizes=None):
    torch.cuda.set_device(0)
    p, conn, lis = spawn_target(impl, "bench")
    hello = conn.recv()
    src = torch.empty(BUF, dtype=torch.uint8, device="cuda")
    fill(src, 3)
    back = torch.zeros(BUF, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    rows = []
    if impl == "mori_rs":
        import mori_rs.io as mio

        eng = mio.IOEngine("initiator", mio.IOEngineConfig("127.0.0.1", 0))
        eng.create_backend(mio.BackendType.XGMI)
        eng.register_remote_engine(mio.EngineDesc.unpack(hello["engine"]))
        remote = mio.MemoryDesc.unpack(hello["mem"])
        ls, lb = eng.register_torch_tensor(src), eng.register_torch_tensor(back)
        sess = {"write": eng.create_session(ls, remote), "read": eng.create_session(lb, remote)}

        def run(op, batch, size, it):
            s = sess[op]
            if batch == 1 and variant == "waitfor":
                post = s.write if op == "write" else s.read
                for _ in range(it):
                    post(0, 0, size, eng.allocate_transfer_uid()).WaitFor(-1)
            elif batch == 1 and variant == "single":
                post = s.write if op == "write" else s.read
                for _ in range(it):
                    post(0, 0, size, eng.allocate_transfer_uid()).Wait()
            else:
                offs = np.arange(batch, dtype=np.int64) * size
                sizes = np.full(batch, size, dtype=np.int64)
                post = s.batch_write if op == "write" else s.batch_read
                for _ in range(it):
                    post(offs, offs, sizes, eng.allocate_transfer_uid()).Wait()

    else:
        agent, _ = nixl_agent("initiator")
        regs = [agent.register_memory(src)]
        regs.append(agent.register_memory(back))
        peer = agent.add_remote_agent(hello["md"])
        raddr = hello["addr"]
        handles = {}

        def handle(op, batch, size):
            key = (op, batch, size)
            if key not in handles:
                base = src.data_ptr() if op == "write" else back.data_ptr()
                loc = agent.get_xfer_descs([(base + i * size, size, 0) for i in range(batch)], "VRAM")
                rem = agent.get_xfer_descs([(raddr + i * size, size, 0) for i in range(batch)], "VRAM")
                handles[key] = agent.initialize_xfer(op.upper(), loc, rem, peer)
            return handles[key]

        def run(op, batch, size, it):
            h = handle(op, batch, size)
            for _ in range(it):
                state = agent.transfer(h)
                while state == "PROC":
                    state = agent.check_xfer_state(h)
                if state != "DONE":
                    raise RuntimeError(f"nixl {op} {batch}x{size}: {state}")

    for op, batch, size in points(sizes, batches=sizes is None):
        it, dt = timed(lambda n: run(op, batch, size, n))
        row = {"impl": impl, "variant": variant, "op": op, "batch": batch, "msg_size": size, "iters": it,
               "avg_lat_us": dt * 1e6 / (it * batch), "avg_bw_gbps": size * batch * it / dt / 1e9}
        rows.append(row)
        print(f"{impl:8s} {variant:7s} {op:5s} batch {batch:4d} size {size:9d}: {row['avg_lat_us']:10.2f} us/transfer {row['avg_bw_gbps']:9.2f} GB/s ({it} iters)", flush=True)
    # Validation: what the write sweep left at the target, and what reads brought back.
    n = max(size * batch for _, batch, size in points(sizes, batches=sizes is None))
    conn.send(n)
    remote_sum = conn.recv()
    torch.cuda.synchronize()
    ok_write = remote_sum == int(src[:n].to(torch.int64).sum().item())
    # Reads ran after every write: the target's first n bytes are src's.
    ok_read = torch.equal(back[:n], src[:n])
    print(f"{impl} validation: target bytes after writes {'OK' if ok_write else 'MISMATCH'}, bytes read back {'OK' if ok_read else 'MISMATCH'}")
    conn.send("bye")
    p.wait(60)
    if json_path:
        with open(json_path, "w") as f:
            json.dump({"rows": rows, "validation": {"write": ok_write, "read": ok_read}}, f, indent=1)
    return 0 if ok_write and ok_read else 1


def copy(json_path):
    torch.cuda.set_device(0)
    a = torch.empty(BUF, dtype=torch.uint8, device="cuda")
    b = torch.empty(BUF, dtype=torch.uint8, device="cuda")
    rows = []
    for op, batch, size in points():
        if op == "read":
            continue
        def run(n):
            for _ in range(n):
                for i in range(batch):
                    b[i * size:(i + 1) * size].copy_(a[i * size:(i + 1) * size])
                torch.cuda.synchronize()

        it, dt = timed(run)
        row = {"impl": "copy", "op": "copy", "batch": batch, "msg_size": size, "iters": it,
               "avg_lat_us": dt * 1e6 / (it * batch), "avg_bw_gbps": size * batch * it / dt / 1e9}
        rows.append(row)
        print(f"copy     copy  batch {batch:4d} size {size:9d}: {row['avg_lat_us']:10.2f} us/transfer {row['avg_bw_gbps']:9.2f} GB/s ({it} iters)", flush=True)
    if json_path:
        with open(json_path, "w") as f:
            json.dump({"rows": rows}, f, indent=1)
    return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("cmd", choices=["check", "bench", "copy", "target"])
    ap.add_argument("--impl", default="mori_rs", choices=["mori_rs", "nixl"])
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--mode", default="bench")
    ap.add_argument("--json")
    ap.add_argument("--variant", default="single", choices=["single", "batch1", "waitfor"],
                    help="mori_rs batch-1 call: sess.write/read + Wait() (single), sess.batch_* of one entry (batch1), or + WaitFor(-1)")
    ap.add_argument("--sizes", help="comma-separated batch-1 sizes only (no batch points)")
    a = ap.parse_args()
    if a.cmd == "target":
        return target_main(a.impl, a.port, a.mode)
    if a.cmd == "check":
        return check()
    if a.cmd == "copy":
        return copy(a.json)
    sizes = [int(x) for x in a.sizes.split(",")] if a.sizes else None
    return bench(a.impl, a.json, a.variant, sizes)


if __name__ == "__main__":
    sys.exit(main() or 0)
