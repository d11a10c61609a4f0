"""The other process of the two-process tests: a prefill (or target) engine that registers
2*L layer buffers and hands their packed descriptors over a socket.

Usage: python peer.py MODE PORT  (MODE: read-source | write-target | victim)
"""

import sys
from multiprocessing.connection import Client

import numpy as np

import mori_rs.io as mio

LAYERS = 4
BLOCKS = 64
BLOCK_LEN = 8192
AUTH = b"mori-rs-tests"


def pattern(layer, half):
    """The bytes of layer `layer`'s K (half 0) or V (half 1) buffer on the prefill side."""
    return np.random.default_rng(1000 + 2 * layer + half).integers(0, 256, BLOCKS * BLOCK_LEN, dtype=np.uint8)


def main():
    mode, port = sys.argv[1], int(sys.argv[2])
    conn = Client(("127.0.0.1", port), authkey=AUTH)
    eng = mio.IOEngine("prefill-0", mio.IOEngineConfig("127.0.0.1", 0))
    eng.create_backend(mio.BackendType.TCP)
    bufs, descs = [], []
    for layer in range(LAYERS):
        for half in range(2):
            b = pattern(layer, half) if mode != "write-target" else np.zeros(BLOCKS * BLOCK_LEN, dtype=np.uint8)
            bufs.append(b)
            descs.append(eng.register_memory(b.ctypes.data, b.nbytes, -1, mio.MemoryLocationType.CPU))
    conn.send({"engine": eng.get_engine_desc().pack(), "layers": [d.pack() for d in descs]})
    peer = mio.EngineDesc.unpack(conn.recv())
    eng.register_remote_engine(peer)
    if mode == "read-source":
        # NIXL-style: the reader's last read of each layer carries "req-1:<layer>"; blocks are
        # released once every layer's message came.
        got = set()
        while len(got) < 2 * LAYERS:
            key, msg = eng.wait_notif(30_000)
            assert key == peer.key, key
            got.add(msg)
        conn.send(sorted(got))
    elif mode == "write-target":
        key, msg = eng.wait_notif(30_000)
        want = conn.recv()  # {(layer, half): [(block, src_layer, src_half, src_block)]}
        bad = []
        for (layer, half), moves in want.items():
            b = bufs[2 * layer + half]
            moved = set()
            for block, src in moves:
                exp = np.random.default_rng(src).integers(0, 256, BLOCK_LEN, dtype=np.uint8)
                if not np.array_equal(b[block * BLOCK_LEN:(block + 1) * BLOCK_LEN], exp):
                    bad.append((layer, half, block))
                moved.add(block)
            for block in set(range(BLOCKS)) - moved:
                if b[block * BLOCK_LEN:(block + 1) * BLOCK_LEN].any():
                    bad.append(("untouched", layer, half, block))
        conn.send({"notif": (key, msg), "bad": bad})
    elif mode == "victim":
        conn.recv()  # never answered: the test kills this process
    conn.recv()  # "bye"
    for d in descs:
        eng.deregister_memory(d)


if __name__ == "__main__":
    main()
