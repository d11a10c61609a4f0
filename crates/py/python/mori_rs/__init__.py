"""mori_rs: MORI in Rust for Python.

- ``mori_rs.io``: the MORI-IO transfer engine, with the names and argument orders of MORI's
  ``mori.io`` (``IOEngine``, ``IOEngineConfig``, ``BackendType``, ``MemoryDesc``, ...), plus
  notifications (``notif_msg``, ``get_new_notifs``, ``wait_notif``) and typed exceptions.
- ``mori_rs.ops``: MORI-EP dispatch/combine (``EpDispatchCombineConfig``,
  ``EpDispatchCombineOp``) on CUDA GPUs.

``import mori_rs.io`` needs neither torch nor a GPU.
"""

# The exception classes live here too (their __module__ is "mori_rs"), so that tracebacks
# name them, `mori_rs.Timeout` works and pickling (multiprocessing) finds them.
from ._native import (  # noqa: F401
    BadState,
    GpuError,
    InvalidArgument,
    MoriError,
    NotFound,
    NotSupported,
    Refused,
    RemoteDisconnect,
    Timeout,
    TransportError,
)
from . import io  # noqa: F401,E402

__all__ = [
    "io",
    "MoriError",
    "InvalidArgument",
    "NotFound",
    "BadState",
    "TransportError",
    "GpuError",
    "Timeout",
    "RemoteDisconnect",
    "NotSupported",
    "Refused",
]
