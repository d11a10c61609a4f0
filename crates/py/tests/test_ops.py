"""mori_rs.ops on a machine without a GPU (CI): the names and defaults of MORI's mori.ops, and
clean refusals. The GPU checks are crates/py/bench/ops_gpu.py (run on the GPU machine)."""

import pytest

import mori_rs.io as mio
import mori_rs.ops as ops


def args(**kw):
    a = dict(rank=0, world_size=1, hidden=256, scale_dim=0, scale_type_size=0, max_token_type_size=4, max_tokens=16,
             experts_per_rank=4, top_k=2, max_recv_tokens=0, block_num=4, warps_per_block=8, gpus_per_node=8,
             kernel_type=0, device=0, bootstrap=None, timeout_ms=1000)
    a.update(kw)
    return a


def test_names_and_defaults_are_mori_ones():
    k = ops.EpDispatchCombineKernelType
    assert [int(x) for x in (k.IntraNode, k.InterNode, k.InterNodeV1, k.InterNodeV1LL, k.AsyncLL, k.IntraNodeLL)] == [0, 1, 2, 3, 4, 5]
    assert str(k.InterNodeV1) == "InterNodeV1"
    c = ops.EpDispatchCombineConfig(None, 0, 8, 7168, 0, 0, 2, 128, 32, 8)
    assert (c.warp_num_per_block, c.block_num, c.max_total_recv_tokens, c.kernel_type, c.gpu_per_node, c.quant_type) == (8, 80, 0, k.IntraNode, 8, "none")


def test_internode_kernel_types_are_refused_naming_the_type():
    with pytest.raises(mio.NotSupported, match="kernel_type 2: mori_rs.ops runs the IntraNode kernels only"):
        ops._EpOp(**args(kernel_type=2))


def test_bad_configuration_names_the_field():
    with pytest.raises(mio.InvalidArgument, match="rank"):
        ops._EpOp(**args(rank=3))


def test_without_a_gpu_the_op_refuses_cleanly():
    ok, why = ops.gpu_runtime()
    if ok:
        # A GPU machine: the op builds for one rank (the full checks are ops_gpu.py's).
        assert ops._EpOp(**args()).max_recv_tokens == 16
        return
    assert "libcuda" in why or "GPU" in why, why
    with pytest.raises(mio.NotSupported, match="mori_rs.ops needs a GPU"):
        ops._EpOp(**args())
    try:
        import torch  # noqa: F401
    except ImportError:
        cfg = ops.EpDispatchCombineConfig(None, 0, 1, 256, 0, 0, 4, 16, 4, 2)
        with pytest.raises(mio.NotSupported, match="needs torch"):
            ops.EpDispatchCombineOp(cfg)
