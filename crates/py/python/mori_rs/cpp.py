"""Where MORI's users import ``TransferStatus`` from (``from mori.cpp import TransferStatus``)."""

from ._native import StatusCode, TransferStatus  # noqa: F401

__all__ = ["StatusCode", "TransferStatus"]
