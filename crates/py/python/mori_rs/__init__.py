"""mori_rs: MORI in Rust for Python.

- ``mori_rs.io``: the MORI-IO transfer engine, with the names and argument orders of MORI's
  ``mori.io`` (``IOEngine``, ``IOEngineConfig``, ``BackendType``, ``MemoryDesc``, ...), plus
  notifications (``notif_msg``, ``get_new_notifs``, ``wait_notif``) and typed exceptions.
- ``mori_rs.ops``: MORI-EP dispatch/combine (``EpDispatchCombineConfig``,
  ``EpDispatchCombineOp``) on CUDA GPUs.

``import mori_rs.io`` needs neither torch nor a GPU.
"""

from . import io  # noqa: F401

__all__ = ["io"]
