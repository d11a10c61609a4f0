"""MORI-EP dispatch/combine on CUDA GPUs with the names of MORI's ``mori.ops``.

One ``EpDispatchCombineOp`` per rank (per process, as MORI), joined through a
``torch.distributed`` process group (gloo or NCCL: used only to exchange the heap's IPC
handles at construction) or through mori's socket bootstrap. ``dispatch`` and ``combine`` queue their kernels on PyTorch's
current stream and return at once: no host synchronisation, no pageable copy, the received
count stays on the device, so both can be captured in a CUDA graph (tensors given to a
captured call must stay the graph's static tensors, as usual).

Outputs of ``dispatch`` are views of the op's symmetric heap, ``[max_recv_tokens, ...]`` rows
of which the first ``total_recv[0]`` are valid; they stay valid until the next dispatch. The
combine output is a buffer of the op, ``[max_num_inp_token_per_rank, hidden]``, valid until the
next combine. Only the IntraNode kernels run (one node, NVLink/XGMI P2P); the other kernel
types are refused with ``NotSupported``.
"""

import dataclasses
import enum

from ._native import InvalidArgument, NotSupported, _EpOp, gpu_runtime  # noqa: F401


class EpDispatchCombineKernelType(enum.IntEnum):
    """Kernel types, upstream's values; only ``IntraNode`` runs here."""

    IntraNode = 0
    InterNode = 1
    InterNodeV1 = 2
    InterNodeV1LL = 3
    AsyncLL = 4
    IntraNodeLL = 5

    def __str__(self):
        return self.name


@dataclasses.dataclass
class EpDispatchCombineConfig:
    """MORI's config, same fields, order and defaults. ``max_total_recv_tokens=0`` means
    ``world_size * max_num_inp_token_per_rank``; ``data_type`` is not used (the dtype of the
    tensors given is)."""

    data_type: object
    rank: int
    world_size: int
    hidden_dim: int
    scale_dim: int
    scale_type_size: int
    max_token_type_size: int
    max_num_inp_token_per_rank: int
    num_experts_per_rank: int
    num_experts_per_token: int
    warp_num_per_block: int = 8
    block_num: int = 80
    max_total_recv_tokens: int = 0
    use_external_inp_buf: bool = True
    kernel_type: EpDispatchCombineKernelType = EpDispatchCombineKernelType.IntraNode
    gpu_per_node: int = 8
    rdma_block_num: int = 0
    num_qp_per_pe: int = 1
    quant_type: str = "none"


class _TorchBootstrap:
    """allgather / barrier over a torch.distributed group (for the heap's handle exchange)."""

    def __init__(self, dist, group):
        self.dist, self.group = dist, group

    def allgather(self, data):
        out = [None] * self.dist.get_world_size(self.group)
        self.dist.all_gather_object(out, bytes(data), group=self.group)
        return out

    def barrier(self):
        self.dist.barrier(group=self.group)


class _DeviceBytes:
    """``nbytes`` of device memory at ``ptr``, for ``torch.as_tensor`` (zero copy)."""

    def __init__(self, ptr, nbytes):
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (ptr, False), "version": 3, "strides": None}


def _torch():
    try:
        import torch
    except ImportError as e:
        raise NotSupported(f"mori_rs.ops works on torch tensors and needs torch: {e}") from None
    return torch


class EpDispatchCombineOp:
    """One rank's dispatch/combine (MORI's ``EpDispatchCombineOp(config)``).

    ``group``: the torch.distributed group of the ``world_size`` ranks (default: the world);
    ``bootstrap``: ``"torch"`` (that group exchanges the heap handles), ``"socket"`` (mori's
    socket bootstrap from the launcher's environment: torchrun, srun, mpirun, or
    ``MORI_RANK``/``MORI_WORLD_SIZE``/``MASTER_ADDR``/``MASTER_PORT``), or ``"auto"`` (torch when
    torch.distributed is initialised, else socket);
    ``timeout_ms``: the deadline of every in-kernel wait (a rank that never calls fails the
    others with ``BadState`` naming it, read with ``sync_status()``).
    Errors: ``NotSupported`` without torch, without a CUDA GPU or for an internode kernel type;
    ``InvalidArgument`` for a configuration the kernels do not take.
    """

    def __init__(self, config, group=None, timeout_ms=10_000, bootstrap="auto"):
        torch = _torch()
        ok, why = gpu_runtime()
        if not ok or not torch.cuda.is_available():
            raise NotSupported(f"mori_rs.ops needs a CUDA GPU: {why or 'torch sees none'}")
        if config.quant_type not in ("none", None):
            raise NotSupported(f"quant_type {config.quant_type!r}: the GPU kernels move tokens in their own dtype only")
        c = config
        self.config = c
        self.device = torch.device("cuda", torch.cuda.current_device())
        boot = None
        if c.world_size > 1 and bootstrap in ("auto", "torch"):
            import torch.distributed as dist

            if dist.is_initialized():
                boot = _TorchBootstrap(dist, group)
            elif bootstrap == "torch":
                raise InvalidArgument(f"bootstrap='torch' but torch.distributed is not initialised (world_size {c.world_size})")
        elif bootstrap not in ("auto", "torch", "socket"):
            raise InvalidArgument(f"bootstrap={bootstrap!r}: one of 'auto', 'torch', 'socket'")
        self._op = _EpOp(
            c.rank, c.world_size, c.hidden_dim, c.scale_dim, c.scale_type_size, c.max_token_type_size,
            c.max_num_inp_token_per_rank, c.num_experts_per_rank, c.num_experts_per_token, c.max_total_recv_tokens,
            c.block_num, c.warp_num_per_block, c.gpu_per_node, int(c.kernel_type), self.device.index, boot, timeout_ms,
        )
        self.max_recv = self._op.max_recv_tokens
        self._views = {}
        self._out = {}
        self._out_w = None
        self._keep = ()
        self._last = None
        cnt = self._bytes(self._op.recv_count_ptr(), 4)
        self._total_recv = cnt.view(torch.int32)

    def _bytes(self, ptr, nbytes):
        torch = _torch()
        return torch.as_tensor(_DeviceBytes(ptr, nbytes), device=self.device)

    def _recv_views(self, dtype, idx_dtype):
        key = (dtype, idx_dtype)
        if key not in self._views:
            torch = _torch()
            es = torch.empty((), dtype=dtype).element_size()
            ids = torch.empty((), dtype=idx_dtype).element_size()
            regions = self._op.recv_regions(es, ids)
            c, n = self.config, self.max_recv
            x = self._bytes(*regions[0]).view(dtype).view(n, c.hidden_dim)
            w = self._bytes(*regions[1]).view(torch.float32).view(n, c.num_experts_per_token)
            idx = self._bytes(*regions[2]).view(idx_dtype).view(n, c.num_experts_per_token)
            sc = None
            if c.scale_dim > 0:
                sc = self._bytes(*regions[3]).view(n, c.scale_dim * c.scale_type_size)
            self._views[key] = (x, w, idx, sc)
        return self._views[key]

    @staticmethod
    def _check(t, name, dims, dtypes=None):
        if t.dim() != len(dims) or any(d is not None and s != d for s, d in zip(t.shape, dims)):
            raise InvalidArgument(f"{name}: shape {tuple(t.shape)}, expected {tuple('*' if d is None else d for d in dims)}")
        if not t.is_contiguous():
            raise InvalidArgument(f"{name} must be contiguous")
        if not t.is_cuda:
            raise InvalidArgument(f"{name} must be a CUDA tensor, it is on {t.device}")
        if dtypes is not None and t.dtype not in dtypes:
            raise InvalidArgument(f"{name}: dtype {t.dtype}, expected one of {[str(d) for d in dtypes]}")

    def _per_call(self, block_num, rdma_block_num, warp_per_block):
        c = self.config
        for name, v, want in (("block_num", block_num, c.block_num), ("warp_per_block", warp_per_block, c.warp_num_per_block)):
            if v not in (-1, want):
                raise InvalidArgument(f"{name}={v} per call: set it in EpDispatchCombineConfig ({want}); the heap and launch are sized for it")
        if rdma_block_num not in (-1, 0):
            raise NotSupported(f"rdma_block_num={rdma_block_num}: the IntraNode kernels use no RDMA blocks")

    def dispatch(self, input, weights, scales, indices, block_num=-1, rdma_block_num=-1, warp_per_block=-1):
        """Sends each token to the ranks holding its experts. ``input [T, hidden]`` (bf16,
        fp16, f32 or fp8), ``weights [T, top_k]`` f32 or None, ``scales [T, scale_dim]`` or
        None, ``indices [T, top_k]`` int32/int64 (-1: none). Returns ``(out, out_weights,
        out_scales, out_indices, total_recv)``: views ``[max_recv_tokens, ...]`` of which the
        first ``total_recv[0]`` rows (an int32 tensor on the device) are this rank's."""
        torch = _torch()
        self._per_call(block_num, rdma_block_num, warp_per_block)
        c = self.config
        self._check(input, "input", (None, c.hidden_dim))
        t = input.shape[0]
        self._check(indices, "indices", (t, c.num_experts_per_token), (torch.int32, torch.int64))
        if weights is not None:
            self._check(weights, "weights", (t, c.num_experts_per_token), (torch.float32,))
        if scales is not None:
            self._check(scales, "scales", (t, c.scale_dim))
        stream = torch.cuda.current_stream(self.device).cuda_stream
        self._op.dispatch(
            input.data_ptr(), input.element_size(), 0 if weights is None else weights.data_ptr(), indices.data_ptr(),
            indices.element_size(), 0 if scales is None else scales.data_ptr(), t, stream,
        )
        # The kernels read these until the combine of this dispatch has run.
        self._keep = (input, weights, scales, indices)
        self._last = (t, indices.element_size())
        x, w, idx, sc = self._recv_views(input.dtype, indices.dtype)
        return x, (w if weights is not None else None), sc, idx, self._total_recv

    def combine(self, input, weights, indices, block_num=-1, rdma_block_num=-1, warp_per_block=-1, use_external_inp_buf=-1, call_reset=False):
        """Sums each token's rows back at its source rank: ``input [N, hidden]`` (bf16 or f32)
        in the order dispatch received them (N <= max_recv_tokens), ``weights [N, top_k]`` f32
        or None, ``indices``: the dispatch's. Returns ``(out [T, hidden], out_weights [T, top_k]
        or None)`` (per slot, the sum of the weights over the ranks that received it)."""
        torch = _torch()
        self._per_call(block_num, rdma_block_num, warp_per_block)
        if self._last is None:
            raise InvalidArgument("combine before dispatch")
        c = self.config
        t, idx_size = self._last
        if indices is not None and indices.data_ptr() != self._keep[3].data_ptr():
            raise InvalidArgument("combine: indices must be the tensor given to the last dispatch")
        self._check(input, "input", (None, c.hidden_dim), (torch.bfloat16, torch.float32))
        n = input.shape[0]
        if n > self.max_recv:
            raise InvalidArgument(f"combine input has {n} rows, max_recv_tokens is {self.max_recv}")
        if weights is not None:
            self._check(weights, "weights", (n, c.num_experts_per_token), (torch.float32,))
        if input.dtype not in self._out:
            self._out[input.dtype] = torch.empty(c.max_num_inp_token_per_rank, c.hidden_dim, dtype=input.dtype, device=self.device)
        out = self._out[input.dtype]
        if weights is not None and self._out_w is None:
            self._out_w = torch.empty(c.max_num_inp_token_per_rank, c.num_experts_per_token, dtype=torch.float32, device=self.device)
        ow = self._out_w if weights is not None else None
        stream = torch.cuda.current_stream(self.device).cuda_stream
        self._op.combine(
            input.data_ptr(), n, input.element_size(), 0 if weights is None else weights.data_ptr(), out.data_ptr(), out.element_size(),
            0 if ow is None else ow.data_ptr(), t, idx_size, stream,
        )
        self._keep = self._keep + (input, weights)
        return out[:t], (ow[:t] if ow is not None else None)

    def sync_status(self):
        """Waits for the device and returns the last dispatch's received count; raises
        ``BadState`` naming the fault a kernel reported (a rank that never called, overflow)."""
        return self._op.sync_status()

    def argument_snapshots(self):
        """Distinct rank-argument sets uploaded so far (one device snapshot each)."""
        return self._op.argument_snapshots()
