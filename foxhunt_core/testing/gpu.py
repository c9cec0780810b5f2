"""Helpers of the GPU parity tests, shared by the core's and the plugins' suites.

Nothing here imports CuPy: a device array is recognized by its ``get`` method, so the helpers can
be imported at collection time on a machine without a GPU.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def fresh_rng(request: Any) -> np.random.Generator:
    """A generator with a fresh seed for this test; the seed is printed (pytest shows it when the
    test fails) and recorded in the test's ``user_properties``, so a failure can be replayed."""
    seed = int(np.random.SeedSequence().entropy % 2**63)
    request.node.user_properties.append(("seed", seed))
    print(f"random seed: {seed}")
    return np.random.default_rng(seed)


def host_relative_error(out: Any, ref: Any) -> float:
    """``||out - ref|| / ||ref||`` in float64 on the host, ``out`` a CuPy or NumPy array of
    ``ref``'s shape (a NaN left in ``out`` makes it NaN, which fails any ``<`` tolerance)."""
    o = np.asarray(out.get() if hasattr(out, "get") else out, np.float64)
    r = np.asarray(ref, np.float64)
    assert o.shape == r.shape, (o.shape, r.shape)
    return float(np.linalg.norm(o - r) / max(np.linalg.norm(r), 1e-30))
