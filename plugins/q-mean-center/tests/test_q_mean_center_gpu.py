"""CUDA kernel parity: fresh random inputs, NaN-poisoned outputs, float64 NumPy oracle.

Tolerance: ``||out - ref|| / ||ref|| < 1e-6``. The kernel accumulates in double and rounds
once to float32, so the error is float32 rounding of the centred values (~6e-8 relative).
"""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.gpu
TOL = 1e-6


def _fresh(batch: int, actions: int = 12) -> tuple[np.ndarray, int]:
    seed = int(np.random.SeedSequence().entropy % 2**32)
    rng = np.random.default_rng(seed)
    q = rng.normal(size=(batch, actions)) * rng.uniform(0.1, 3.0) + rng.uniform(-50, 50)
    return q.astype(np.float32), seed


@pytest.mark.parametrize("batch", [1, 3, 128, 4096, 65_536, 262_147])
def test_kernel_matches_float64_reference(batch):
    import cupy
    from foxhunt_q_mean_center.center import center_cuda

    q, seed = _fresh(batch)
    ref = q.astype(np.float64) - q.astype(np.float64).mean()
    dq = cupy.asarray(q)
    out = cupy.full_like(dq, cupy.nan)  # an element the kernel does not write stays NaN
    res = center_cuda(dq, out=out)
    assert res is out
    got = cupy.asnumpy(out).astype(np.float64)
    assert np.isfinite(got).all(), f"unwritten elements (seed {seed})"
    err = np.linalg.norm(got - ref) / np.linalg.norm(ref)
    assert err < TOL, f"relative error {err:.3g} (seed {seed}, batch {batch})"
    assert np.array_equal(cupy.asnumpy(dq), q), "input modified"


def test_kernel_is_deterministic_and_both_stages_centre_as_the_reference():
    """The kernel gives the same bits on every call; the stage on its kernel and the stage on
    CuPy's array operations both give the float64 NumPy reference's centred values (to float32
    rounding), not merely each other's or those of the function they call."""
    import cupy
    from foxhunt_q_mean_center.center import QMeanCenterStage, center_cuda

    q, seed = _fresh(50_000)
    dq = cupy.asarray(q)
    a, b = center_cuda(dq), center_cuda(dq)
    assert cupy.array_equal(a, b), f"not bitwise reproducible (seed {seed})"
    ref = q.astype(np.float64) - q.astype(np.float64).mean()
    for stage in (QMeanCenterStage(), QMeanCenterStage(use_cuda_kernel=False)):
        got = cupy.asnumpy(stage.forward(cupy, dq)).astype(np.float64)
        err = np.linalg.norm(got - ref) / np.linalg.norm(ref)
        assert err < TOL, f"use_cuda_kernel={stage.use_cuda_kernel}: relative error {err:.3g} (seed {seed})"
        assert abs(got.mean()) < 1e-6 * np.abs(ref).max(), f"mean {got.mean():.3g} left (seed {seed})"


def test_launch_wrapper_checks_arguments():
    import cupy
    from foxhunt_q_mean_center.center import center_cuda

    with pytest.raises(TypeError, match="q_mean_center: q must be float32"):
        center_cuda(cupy.zeros((4, 12), dtype=cupy.float64))
    with pytest.raises(ValueError, match="C-contiguous"):
        center_cuda(cupy.zeros((12, 4), dtype=cupy.float32).T)
    q = cupy.zeros((4, 12), dtype=cupy.float32)
    with pytest.raises(ValueError, match="alias"):
        center_cuda(q, out=q)
    with pytest.raises(TypeError, match="CuPy array"):
        center_cuda(np.zeros((4, 12), dtype=np.float32))
