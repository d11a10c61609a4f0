"""mori_rs.io in one process: names and values as MORI's, descriptors, transfers, errors,
notifications, numpy offsets, threads and the GIL."""

import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import mori_rs.io as mio
from conftest import HostBuffer, make_engine


NO_TORCH = """
import ctypes, sys
import mori_rs.io as mio, mori_rs.cpp
a = mio.IOEngine("nt-a", mio.IOEngineConfig("127.0.0.1", 0))
b = mio.IOEngine("nt-b", mio.IOEngineConfig("127.0.0.1", 0))
for e in (a, b):
    e.create_backend(mio.BackendType.TCP)
src, dst = (ctypes.c_ubyte * 4096)(*(list(range(256)) * 16)), (ctypes.c_ubyte * 4096)()
ma = a.register_memory(ctypes.addressof(src), 4096, -1, mio.MemoryLocationType.CPU)
mb = b.register_memory(ctypes.addressof(dst), 4096, -1, mio.MemoryLocationType.CPU)
a.register_remote_engine(b.get_engine_desc())
a.batch_write(ma, [0, 1000], mb, [0, 1000], [1000, 3096], a.allocate_transfer_uid()).wait(10000)
assert bytes(dst) == bytes(src)
assert "torch" not in sys.modules and "numpy" not in sys.modules, sorted(m for m in sys.modules if m in ("torch", "numpy"))
print("ok")
"""


def test_import_and_transfer_need_no_torch_and_no_numpy():
    out = subprocess.run([sys.executable, "-c", NO_TORCH], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_enum_values_are_upstreams():
    assert [int(x) for x in (mio.BackendType.XGMI, mio.BackendType.RDMA, mio.BackendType.TCP, mio.BackendType.FABRIC)] == [1, 2, 3, 4]
    assert (int(mio.MemoryLocationType.CPU), int(mio.MemoryLocationType.GPU)) == (1, 2)
    s = mio.StatusCode
    assert [int(x) for x in (s.SUCCESS, s.INIT, s.IN_PROGRESS, s.ERR_INVALID_ARGS, s.ERR_NOT_FOUND, s.ERR_RDMA_OP, s.ERR_BAD_STATE, s.ERR_GPU_OP)] == [0, 1, 2, 11, 12, 13, 14, 15]
    assert str(s.ERR_INVALID_ARGS) == "ERR_INVALID_ARGS"
    from mori_rs.cpp import TransferStatus

    assert TransferStatus is mio.TransferStatus
    # MORI's positional forms.
    c = mio.RdmaBackendConfig(2, -1, 1, mio.PollCqMode.POLLING, False)
    assert (c.qp_per_transfer, c.num_worker_threads, c.enable_notification) == (2, 1, False)
    assert mio.IOEngineConfig("10.0.0.1", 5).port == 5


def test_descriptors_round_trip_and_bad_bytes_raise(pair):
    a, b, ba, bb, ma, mb = pair
    d = a.get_engine_desc()
    d2 = mio.EngineDesc.unpack(d.pack())
    assert d2 == d and (d2.key, d2.host, d2.port) == ("py-init", "127.0.0.1", d.port) and d.port > 0
    m2 = mio.MemoryDesc.unpack(ma.pack())
    assert m2 == ma and m2.size == 4 << 20 and m2.data == ba.data_ptr() and m2.loc == mio.MemoryLocationType.CPU and m2.device_id == -1
    with pytest.raises(mio.InvalidArgument) as e:
        mio.MemoryDesc.unpack(b"\x00garbage")
    assert e.value.code == int(mio.StatusCode.ERR_INVALID_ARGS)
    with pytest.raises(mio.MoriError):
        mio.EngineDesc.unpack(b"")


def test_write_read_and_out_of_range(pair):
    a, b, ba, bb, ma, mb = pair
    uid = a.allocate_transfer_uid()
    st = a.write(ma, 0, mb, 4096, 65536, uid)
    assert st.WaitFor(30_000) == mio.StatusCode.SUCCESS and st.Succeeded() and not st.Failed()
    assert np.array_equal(bb.arr[4096:4096 + 65536], ba.arr[:65536])
    # The target learns of the write (MORI's pop_inbound_transfer_status).
    deadline = time.time() + 10
    inbound = None
    while inbound is None and time.time() < deadline:
        inbound = b.pop_inbound_transfer_status("py-init", uid)
    assert inbound is not None and inbound.Succeeded()
    st = a.read(ma, 1 << 20, mb, 0, 1000, a.allocate_transfer_uid())
    st.wait(30_000)
    assert np.array_equal(ba.arr[1 << 20:(1 << 20) + 1000], bb.arr[:1000])
    # Out of range: the status fails with ERR_INVALID_ARGS (as MORI), wait() raises.
    st = a.write(ma, 0, mb, (4 << 20) - 8, 16, a.allocate_transfer_uid())
    assert st.Failed() and st.Code() == mio.StatusCode.ERR_INVALID_ARGS
    assert "exceeds" in st.Message() or "outside" in st.Message(), st.Message()
    with pytest.raises(mio.InvalidArgument):
        st.wait(1000)
    with pytest.raises(mio.InvalidArgument):
        a.batch_write(ma, [0, 8], mb, [0, (4 << 20)], [8, 8], a.allocate_transfer_uid()).wait(1000)


def test_batches_with_lists_numpy_and_multi_pair(pair):
    a, b, ba, bb, ma, mb = pair
    n = 1000
    lo = np.arange(n, dtype=np.int64) * 4096
    ro = (np.arange(n, dtype=np.int64)[::-1] * 4096).copy()
    sz = np.full(n, 512, dtype=np.int64)
    a.batch_write(ma, lo, mb, ro, sz, a.allocate_transfer_uid()).wait(30_000)
    for i in range(n):
        assert np.array_equal(bb.arr[ro[i]:ro[i] + 512], ba.arr[lo[i]:lo[i] + 512]), i
    # uint64 and non-contiguous int64 arrays, and plain lists, through a session.
    sess = a.create_session(ma, mb)
    assert sess.alive() and sess.backend() == mio.BackendType.TCP
    sess.batch_read(np.array([3 << 20], dtype=np.uint64), lo[::2][:1], [100], sess.allocate_transfer_uid()).wait(30_000)
    assert np.array_equal(ba.arr[3 << 20:(3 << 20) + 100], bb.arr[:100])
    # The multi-pair form: lists per pair, one status each.
    sts = a.batch_write([ma, ma], [[0], [8192]], [mb, mb], [[1 << 21], [(1 << 21) + 8192]], [[64], [64]], [a.allocate_transfer_uid(), a.allocate_transfer_uid()])
    assert len(sts) == 2 and a.wait_all(sts, 30_000) == mio.StatusCode.SUCCESS
    assert np.array_equal(bb.arr[1 << 21:(1 << 21) + 64], ba.arr[:64])
    # Bad arguments name themselves.
    with pytest.raises(mio.InvalidArgument, match=r"sizes\[1\] = -5 is negative"):
        sess.batch_write([0, 0], [0, 0], np.array([1, -5]), 7)
    with pytest.raises(mio.InvalidArgument, match="1-D of integers, this one is 1-D float32"):
        sess.batch_write(np.zeros(2, dtype=np.float32), [0, 0], [1, 1], 7)
    with pytest.raises(mio.InvalidArgument, match="sizes has 1 entries, local has 2"):
        a.batch_write([ma, ma], [[0], [0]], [mb, mb], [[0], [0]], [[1]], [1, 2])


def test_notifications(pair):
    a, b, ba, bb, ma, mb = pair
    # A write carrying a message: when the target has the message the bytes are there.
    a.batch_write(ma, [0], mb, [8192], [300_000], a.allocate_transfer_uid(), notif_msg=b"req-7:1")
    key, msg = b.wait_notif(10_000)
    assert (key, msg) == ("py-init", b"req-7:1")
    assert np.array_equal(bb.arr[8192:8192 + 300_000], ba.arr[:300_000])
    # A read carrying one, a message alone, and NIXL's get_new_notifs shape.
    a.read(ma, 0, mb, 0, 64, a.allocate_transfer_uid(), notif_msg="read-done").wait(10_000)
    a.send_notif("py-target", b"HB:1").wait(10_000)
    assert b.get_new_notifs() == {"py-init": [b"read-done", b"HB:1"]}
    assert b.get_new_notifs() == {}
    with pytest.raises(mio.Timeout):
        b.wait_notif(50)
    st = a.write(ma, 0, mb, 0, 8, a.allocate_transfer_uid(), notif_msg=b"x" * (mio.MAX_NOTIF_LEN + 1))
    assert st.Code() == mio.StatusCode.ERR_INVALID_ARGS and str(mio.MAX_NOTIF_LEN) in st.Message()


def test_eight_threads_share_one_engine(pair):
    a, b, ba, bb, ma, mb = pair
    sess = a.create_session(ma, mb)
    errors = []

    def worker(t):
        try:
            base = t * (256 << 10)
            for i in range(100):
                off = base + (i % 64) * 4096
                if i % 2:
                    sess.write(off, off, 4096, a.allocate_transfer_uid()).wait(30_000)
                    assert np.array_equal(bb.arr[off:off + 4096], ba.arr[off:off + 4096])
                else:
                    a.batch_read(ma, [off + (2 << 20)], mb, [off], [4096], a.allocate_transfer_uid()).wait(30_000)
                    assert np.array_equal(ba.arr[off + (2 << 20):off + (2 << 20) + 4096], bb.arr[off:off + 4096])
        except Exception as e:  # noqa: BLE001
            errors.append((t, repr(e)))

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    assert not any(th.is_alive() for th in threads)
    assert errors == []


def test_waits_release_the_gil():
    """A probe thread keeps counting while wait_all and wait_notif block."""
    a, b = make_engine("gil-a"), make_engine("gil-b")
    big = HostBuffer(64 << 20, 3)
    dst = HostBuffer(64 << 20, 4)
    ma, mb = a.register_torch_tensor(big), b.register_torch_tensor(dst)
    a.register_remote_engine(b.get_engine_desc())
    count = [0]
    stop = threading.Event()

    def probe():
        while not stop.is_set():
            count[0] += 1

    th = threading.Thread(target=probe)
    th.start()
    try:
        sts = [a.write(ma, 0, mb, 0, 64 << 20, a.allocate_transfer_uid()) for _ in range(4)]
        c0, t0 = count[0], time.perf_counter()
        assert a.wait_all(sts, 60_000) == mio.StatusCode.SUCCESS
        c1, t1 = count[0], time.perf_counter()
        c2 = count[0]
        with pytest.raises(mio.Timeout):
            b.wait_notif(300)
        c3 = count[0]
    finally:
        stop.set()
        th.join()
    print(f"GIL probe: {c1 - c0} counts in {t1 - t0:.3f} s of wait_all, {c3 - c2} in 300 ms of wait_notif")
    assert t1 - t0 > 0.005, "the writes took no time: nothing to measure"
    assert c1 - c0 > 1000, f"probe counted {c1 - c0} during a {t1 - t0:.3f} s wait_all"
    assert c3 - c2 > 1000, f"probe counted {c3 - c2} during a 300 ms wait_notif"
    assert np.array_equal(big.arr, dst.arr)
    a.deregister_memory(ma)
    b.deregister_memory(mb)


def test_wait_all_times_out_in_progress_and_reports_failure_first(pair):
    a, b, ba, bb, ma, mb = pair
    ok = a.write(ma, 0, mb, 0, 8, a.allocate_transfer_uid())
    bad = a.write(ma, 0, mb, 1 << 40, 8, a.allocate_transfer_uid())
    assert mio.wait_all([ok, bad], 10_000) == mio.StatusCode.ERR_INVALID_ARGS
    assert mio.wait_all([], 0) == mio.StatusCode.SUCCESS


def test_register_errors():
    e = make_engine("reg")
    with pytest.raises(mio.InvalidArgument, match="size is 0"):
        e.register_memory(4096, 0, -1, mio.MemoryLocationType.CPU)
    with pytest.raises(mio.NotSupported, match="needs a GPU backend"):
        e.register_memory(4096, 8, 0, mio.MemoryLocationType.GPU)

    class Strided(HostBuffer):
        def is_contiguous(self):
            return False

    with pytest.raises(mio.InvalidArgument, match="not contiguous"):
        e.register_torch_tensor(Strided(64, 0))
    with pytest.raises(mio.InvalidArgument, match="config must be a TcpBackendConfig"):
        e.create_backend(mio.BackendType.TCP, mio.XgmiBackendConfig())
    other = make_engine("other")
    foreign = other.register_torch_tensor(HostBuffer(8, 0))
    with pytest.raises(mio.InvalidArgument, match="belongs to engine"):
        e.deregister_memory(foreign)
    other.deregister_memory(foreign)
    with pytest.raises(mio.NotFound):
        other.deregister_memory(foreign)
