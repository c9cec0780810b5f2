"""Opening a CUDA library (libcublas, libcublasLt) for a ctypes binding: the one CuPy loaded."""

from __future__ import annotations

import ctypes
import ctypes.util
from typing import Any


def open_library(stem: str, error: type[Exception]) -> Any:
    """``ctypes.CDLL`` of ``lib<stem>.so`` (CUDA 13's, then 12's, then any); raises ``error``.

    Call after importing CuPy, so that the process already holds the library CuPy uses.
    """
    names = [f"lib{stem}.so.13", f"lib{stem}.so.12", f"lib{stem}.so"]
    found = ctypes.util.find_library(stem)
    if found:
        names.append(found)
    last: Exception | None = None
    for name in names:
        try:
            return ctypes.CDLL(name)
        except OSError as exc:
            last = exc
    raise error(f"cannot load lib{stem} ({last})")
