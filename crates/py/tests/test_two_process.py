"""Two processes on loopback replaying how inference servers drive the engine: vLLM's
MoRIIO READ flow (one session per layer, batch_read of block offsets, status polling against a
deadline), SGLang's multi-pair batch_write + wait_all loop, and a peer killed mid-transfer."""

import os
import signal
import subprocess
import sys
import time
from multiprocessing.connection import Listener

import numpy as np
import pytest

import mori_rs.io as mio
from peer import AUTH, BLOCK_LEN, BLOCKS, LAYERS, pattern

HERE = os.path.dirname(os.path.abspath(__file__))


class Peer:
    """The child process of `peer.py MODE`, with the socket to it."""

    def __init__(self, mode):
        self.listener = Listener(("127.0.0.1", 0), authkey=AUTH)
        port = self.listener.address[1]
        self.proc = subprocess.Popen([sys.executable, os.path.join(HERE, "peer.py"), mode, str(port)])
        self.conn = self.listener.accept()
        hello = self.conn.recv()
        self.engine = mio.EngineDesc.unpack(hello["engine"])
        self.layers = [mio.MemoryDesc.unpack(b) for b in hello["layers"]]

    def close(self):
        try:
            self.conn.send("bye")
        except OSError:
            pass
        try:
            self.proc.wait(30)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
            self.listener.close()


def decode_engine(key):
    eng = mio.IOEngine(key, mio.IOEngineConfig("127.0.0.1", 0))
    eng.create_backend(mio.BackendType.TCP)
    return eng


def poll_until(statuses, deadline_s):
    """vLLM's loop: Succeeded / Failed per status, 1 ms sleeps, a deadline."""
    end = time.time() + deadline_s
    pending = list(statuses)
    while pending:
        still = []
        for st in pending:
            if st.Succeeded():
                continue
            if st.Failed():
                raise RuntimeError(f"transfer failed: {st.Code()} {st.Message()}")
            still.append(st)
        pending = still
        if pending:
            if time.time() > end:
                raise TimeoutError(f"{len(pending)} transfers still running")
            time.sleep(0.001)


def test_vllm_style_read_flow():
    p = Peer("read-source")
    try:
        eng = decode_engine("decode-0")
        eng.register_remote_engine(p.engine)
        p.conn.send(eng.get_engine_desc().pack())
        local = [np.zeros(BLOCKS * BLOCK_LEN, dtype=np.uint8) for _ in range(2 * LAYERS)]
        ldescs = [eng.register_memory(b.ctypes.data, b.nbytes, -1, mio.MemoryLocationType.CPU) for b in local]
        sessions = [eng.create_session(ldescs[i], p.layers[i]) for i in range(2 * LAYERS)]
        rng = np.random.default_rng(7)
        remote_blocks = rng.permutation(BLOCKS)[:40]
        local_blocks = rng.permutation(BLOCKS)[:40]
        lo = local_blocks.astype(np.int64) * BLOCK_LEN
        ro = remote_blocks.astype(np.int64) * BLOCK_LEN
        sz = np.full(len(lo), BLOCK_LEN, dtype=np.int64)
        statuses = []
        for i, s in enumerate(sessions):
            uid = eng.allocate_transfer_uid()
            statuses.append(s.batch_read(lo, ro, sz, uid, notif_msg=f"req-1:{i}".encode()))
        poll_until(statuses, 30)
        for i in range(2 * LAYERS):
            src = pattern(i // 2, i % 2)
            for lb, rb in zip(local_blocks, remote_blocks):
                assert np.array_equal(local[i][lb * BLOCK_LEN:(lb + 1) * BLOCK_LEN], src[rb * BLOCK_LEN:(rb + 1) * BLOCK_LEN]), (i, lb, rb)
            untouched = sorted(set(range(BLOCKS)) - set(local_blocks.tolist()))
            assert all(not local[i][b * BLOCK_LEN:(b + 1) * BLOCK_LEN].any() for b in untouched)
        assert p.conn.recv() == sorted(f"req-1:{i}".encode() for i in range(2 * LAYERS))
        for d in ldescs:
            eng.deregister_memory(d)
    finally:
        p.close()
    assert p.proc.returncode == 0


def test_sglang_style_multi_pair_write_and_wait_all():
    p = Peer("write-target")
    try:
        eng = decode_engine("prefill-sender")
        eng.register_remote_engine(p.engine)
        p.conn.send(eng.get_engine_desc().pack())
        # Source: one buffer per (layer, half), each block filled from its own seed.
        src = []
        for i in range(2 * LAYERS):
            b = np.concatenate([np.random.default_rng(10_000 * (i + 1) + blk).integers(0, 256, BLOCK_LEN, dtype=np.uint8) for blk in range(BLOCKS)])
            src.append(b)
        sdescs = [eng.register_memory(b.ctypes.data, b.nbytes, -1, mio.MemoryLocationType.CPU) for b in src]
        rng = np.random.default_rng(11)
        want = {}
        lo_l, ro_l, sz_l = [], [], []
        for i in range(2 * LAYERS):
            sblocks = rng.permutation(BLOCKS)[:24]
            dblocks = rng.permutation(BLOCKS)[:24]
            lo_l.append([int(b) * BLOCK_LEN for b in sblocks])
            ro_l.append([int(b) * BLOCK_LEN for b in dblocks])
            sz_l.append([BLOCK_LEN] * len(sblocks))
            want[(i // 2, i % 2)] = [(int(d), 10_000 * (i + 1) + int(s)) for s, d in zip(sblocks, dblocks)]
        uids = [eng.allocate_transfer_uid() for _ in range(2 * LAYERS)]
        statuses = eng.batch_write(sdescs, lo_l, p.layers, ro_l, sz_l, uids)
        assert len(statuses) == 2 * LAYERS
        deadline = time.time() + 30
        while True:
            rc = eng.wait_all(statuses, timeout_ms=5)
            if rc != mio.StatusCode.IN_PROGRESS:
                break
            assert time.time() < deadline
        assert rc == mio.StatusCode.SUCCESS, [s.Message() for s in statuses]
        eng.send_notif(p.engine.key, b"done").wait(10_000)
        p.conn.send(want)
        report = p.conn.recv()
        assert report["notif"] == ("prefill-sender", b"done")
        assert report["bad"] == []
        for d in sdescs:
            eng.deregister_memory(d)
    finally:
        p.close()
    assert p.proc.returncode == 0


def test_killed_peer_fails_within_its_deadline():
    p = Peer("victim")
    try:
        eng = decode_engine("survivor")
        eng.register_remote_engine(p.engine)
        p.conn.send(eng.get_engine_desc().pack())
        buf = np.ones(BLOCKS * BLOCK_LEN, dtype=np.uint8)
        d = eng.register_memory(buf.ctypes.data, buf.nbytes, -1, mio.MemoryLocationType.CPU)
        eng.write(d, 0, p.layers[0], 0, BLOCK_LEN, eng.allocate_transfer_uid()).wait(10_000)
        # Many writes in flight, then SIGKILL.
        sess = eng.create_session(d, p.layers[0])
        sts = [sess.write(0, 0, BLOCKS * BLOCK_LEN, eng.allocate_transfer_uid()) for _ in range(200)]
        os.kill(p.proc.pid, signal.SIGKILL)
        p.proc.wait(10)
        t0 = time.time()
        rc = eng.wait_all(sts, 20_000)
        later = sess.write(0, 0, 8, eng.allocate_transfer_uid())
        with pytest.raises((mio.RemoteDisconnect, mio.TransportError, mio.Timeout)) as e:
            later.wait(20_000)
        took = time.time() - t0
        print(f"killed peer: wait_all -> {rc}, later write -> {type(e.value).__name__}: {e.value}, {took:.3f} s")
        assert rc != mio.StatusCode.IN_PROGRESS, "wait_all still waiting after 20 s"
        assert took < 15, f"failing took {took:.1f} s"
        assert "prefill-0" in str(e.value) or "peer" in str(e.value) or "engine" in str(e.value), str(e.value)
        with pytest.raises(mio.MoriError):
            eng.create_session(d, p.layers[1])
        eng.deregister_memory(d)
    finally:
        p.close()
