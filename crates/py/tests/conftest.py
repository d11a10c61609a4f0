"""Shared helpers of the mori_rs tests (no torch, no GPU: host memory from numpy)."""

import numpy as np
import pytest

import mori_rs.io as mio


class HostBuffer:
    """A numpy byte buffer registered with an engine, duck-typed like a torch CPU tensor."""

    def __init__(self, nbytes, seed):
        rng = np.random.default_rng(seed)
        self.arr = rng.integers(0, 256, size=nbytes, dtype=np.uint8)
        self.device = _CpuDevice()

    def data_ptr(self):
        return self.arr.ctypes.data

    def numel(self):
        return self.arr.size

    def element_size(self):
        return 1

    def is_contiguous(self):
        return True


class _CpuDevice:
    type = "cpu"
    index = None


def make_engine(key, lanes=4):
    eng = mio.IOEngine(key, mio.IOEngineConfig("127.0.0.1", 0))
    eng.create_backend(mio.BackendType.TCP, mio.TcpBackendConfig(lanes=lanes, min_lane_bytes=4096))
    return eng


@pytest.fixture
def pair():
    """Two engines that know each other, each with a registered 4 MiB buffer."""
    a, b = make_engine("py-init"), make_engine("py-target")
    ba, bb = HostBuffer(4 << 20, 1), HostBuffer(4 << 20, 2)
    ma, mb = a.register_torch_tensor(ba), b.register_torch_tensor(bb)
    a.register_remote_engine(mio.EngineDesc.unpack(b.get_engine_desc().pack()))
    b.register_remote_engine(mio.EngineDesc.unpack(a.get_engine_desc().pack()))
    yield a, b, ba, bb, ma, mio.MemoryDesc.unpack(mb.pack())
    a.deregister_memory(ma)
    b.deregister_memory(mb)
