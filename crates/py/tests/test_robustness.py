"""What a careless or hostile caller can do: drop an engine while peers write into it, press
Ctrl-C in a wait, pass odd numpy arrays and out-of-range ints."""

import gc
import subprocess
import sys
import time

import numpy as np
import pytest

import mori_rs.io as mio
from conftest import HostBuffer, make_engine


def test_dropping_an_engine_waits_for_inbound_transfers_before_releasing_memory():
    n = 64 << 20
    src = np.full(n, 7, dtype=np.uint8)
    for trial in range(4):
        a, b = make_engine(f"drop-a{trial}"), make_engine(f"drop-b{trial}")
        a.register_remote_engine(b.get_engine_desc())
        ma = a.register_memory(src.ctypes.data, n, -1, mio.MemoryLocationType.CPU)
        target = HostBuffer(n, trial)
        target.arr[:] = 0
        mb = b.register_torch_tensor(target)
        st = a.write(ma, 0, mb, 0, n, a.allocate_transfer_uid())
        time.sleep(0.002 * trial)
        del b, mb
        gc.collect()
        # The engine is gone: nothing may land in its memory from now on.
        snap = target.arr.copy()
        time.sleep(0.3)
        assert np.array_equal(target.arr, snap), f"trial {trial}: bytes landed after the engine was dropped"
        code = st.WaitFor(30_000)
        assert code != mio.StatusCode.IN_PROGRESS
        a.deregister_memory(ma)


INTERRUPT = """
import os, signal, threading, time, mori_rs.io as mio
signal.signal(signal.SIGINT, signal.default_int_handler)
e = mio.IOEngine("sig", mio.IOEngineConfig("127.0.0.1", 0))
threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
t0 = time.time()
try:
    e.wait_notif(-1)
except KeyboardInterrupt:
    print(f"interrupted after {time.time() - t0:.2f} s")
"""


def test_ctrl_c_interrupts_a_wait_without_deadline():
    out = subprocess.run([sys.executable, "-c", INTERRUPT], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    took = float(out.stdout.split()[2])
    assert 0.25 < took < 2.0, out.stdout


def test_strided_misaligned_and_int32_numpy_offsets_are_converted(pair):
    a, b, ba, bb, ma, mb = pair
    m = np.arange(12, dtype=np.int64).reshape(4, 3) * 4096
    strided = m[:, 0]  # 0, 3, 6, 9 blocks, stride 24 bytes
    backwards = (np.arange(4, dtype=np.int64) * 4096)[::-1]
    misaligned = np.frombuffer(bytearray(8 * 4 + 1), dtype=np.int64, count=4, offset=1)
    misaligned_vals = np.array([1, 2, 3, 4], dtype=np.int64) * 65536
    misaligned[:] = misaligned_vals
    sizes32 = np.full(4, 100, dtype=np.int32)
    a.batch_write(ma, strided, mb, backwards, sizes32, a.allocate_transfer_uid()).wait(10_000)
    for lo, ro in zip(strided, backwards):
        assert np.array_equal(bb.arr[ro:ro + 100], ba.arr[lo:lo + 100])
    a.batch_read(ma, misaligned, mb, misaligned, np.full(4, 64, dtype=np.uint32), a.allocate_transfer_uid()).wait(10_000)
    for o in misaligned_vals:
        assert np.array_equal(ba.arr[o:o + 64], bb.arr[o:o + 64])
    with pytest.raises(mio.InvalidArgument, match=r"local_offsets\[1\] = -4096 is negative"):
        a.batch_write(ma, np.array([0, -4096], dtype=np.int32), mb, [0, 0], [1, 1], 9)
    with pytest.raises(mio.InvalidArgument, match="1-D of integers"):
        a.batch_write(ma, np.array([True]), mb, [0], [1], 9)


def test_out_of_range_ints_raise_invalid_argument_naming_them(pair):
    a, b, ba, bb, ma, mb = pair
    with pytest.raises(mio.InvalidArgument, match=r"local_offset = -1 is outside 0..2\^64") as e:
        a.read(ma, -1, mb, 0, 1, 1)
    assert e.value.code == int(mio.StatusCode.ERR_INVALID_ARGS)
    with pytest.raises(mio.InvalidArgument, match=r"transfer_uid = -1"):
        a.batch_read(ma, [0], mb, [0], [1], -1)
    with pytest.raises(mio.InvalidArgument, match=r"transfer_uid\[1\] = -3"):
        a.batch_read([ma, ma], [[0], [0]], [mb, mb], [[0], [0]], [[1], [1]], [1, -3])
    with pytest.raises(mio.InvalidArgument, match="notif_msg is None"):
        a.send_notif("py-target", None)
    with pytest.raises(mio.Timeout) as t:
        b.wait_notif(10)
    assert t.value.code == int(mio.StatusCode.ERR_TIMEOUT)
    with pytest.raises(mio.InvalidArgument, match="at most 1024"):
        mio.IOEngine("k" * 2000, mio.IOEngineConfig("127.0.0.1", 0))


def test_exceptions_are_reachable_from_the_package_pickle_and_carry_their_code():
    import pickle

    import mori_rs

    assert mori_rs.Timeout is mio.Timeout and issubclass(mori_rs.NotSupported, mori_rs.MoriError)
    e = pickle.loads(pickle.dumps(mio.Timeout("late")))
    assert isinstance(e, mio.Timeout) and str(e) == "late" and e.code == int(mio.StatusCode.ERR_TIMEOUT)
    assert mio.NotSupported("x").code == int(mio.StatusCode.ERR_NOT_SUPPORTED)
