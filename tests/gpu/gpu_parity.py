"""Helpers of the kernel parity tests: NaN-poisoned outputs, float64 copies, relative errors."""

from __future__ import annotations

from typing import Any

import numpy as np


def nan_like(cp: Any, shape: tuple[int, ...], dtype: Any = np.float32) -> Any:
    """A device array filled with NaN, so that an element the kernel does not write fails the test."""
    return cp.full(shape, np.nan, dtype=dtype)


def host64(a: Any) -> np.ndarray:
    """A float64 NumPy copy of a NumPy or CuPy array."""
    return np.asarray(a.get() if hasattr(a, "get") else a, dtype=np.float64)


def rel_err(out: Any, ref: Any) -> float:
    """``||out - ref|| / ||ref||`` in float64 (NaN in ``out`` gives NaN, which fails any ``<``)."""
    o, r = host64(out), host64(ref)
    assert o.shape == r.shape, f"shape {o.shape} != {r.shape}"
    den = np.linalg.norm(r)
    return float(np.linalg.norm(o - r) / (den if den > 0 else 1.0))


def assert_close(name: str, out: Any, ref: Any, tol: float) -> None:
    err = rel_err(out, ref)
    assert err < tol, f"{name}: relative error {err:.3g} >= {tol:g}"


def to_dev(cp: Any, a: np.ndarray, dtype: Any = np.float32) -> Any:
    return cp.asarray(np.ascontiguousarray(a, dtype=dtype))


def tf32_truncated(a: Any) -> np.ndarray:
    """``a`` as float32 with the low 13 mantissa bits cleared: TF32 values (which a kernel's
    rounding to nearest leaves as they are), and what a TF32 tensor core reads of ``a``."""
    return (np.ascontiguousarray(a, dtype=np.float32).view(np.uint32) & np.uint32(0xFFFFE000)).view(np.float32)


def skip_without_wgmma() -> None:
    """Skip the test unless the device runs the wgmma kernels (compute capability 9.0)."""
    import pytest

    from foxhunt_core.gpu import kernels as K

    if not K.glu_gemm_supported():
        pytest.skip("the tensor-core GEMM kernels need a compute capability 9.0 GPU")


def check_c51_indexed(got: Any, p_next: np.ndarray, logp: Any, reward: Any, discount: Any, z: Any,
                      a_next: np.ndarray, a_taken: np.ndarray, num_actions: int, tol: float) -> np.ndarray:
    """The C51 loss kernel's indexed form (``got`` = its (m, dlogits over all actions, loss,
    entropy)) against the NumPy projection and loss on the gathered rows: ``p_next`` the target's
    [B, A, N] probabilities, ``logp`` the online log-probabilities. Returns the reference m
    (``got``'s m may be None: E[m] checked by the caller)."""
    from foxhunt_core.gpu import reference as R

    rm, rdl, rloss, rent = R.c51_target_loss(
        R.gather_actions(host64(p_next), a_next), host64(reward), host64(discount),
        R.gather_actions(host64(logp), a_taken), host64(z), 0.01)
    if got[0] is not None:
        assert_close("m", got[0], rm, tol)
    assert_close("dlogits", got[1], R.scatter_actions(rdl, a_taken, num_actions), tol)
    assert_close("loss", got[2], rloss, tol)
    assert_close("entropy", got[3], rent, tol)
    return rm


def check_three_segments(outs: dict, zwide: Any, ref: tuple, rows: int, n_dir: int, tol: float) -> None:
    """The dueling forward over the update's three segments of ``rows`` rows (online s: every
    output; online s': E[Q]; target s': probabilities) against the NumPy forward ``ref``, with the
    direction Q (times 0.25) in columns 5.. of ``zwide`` and NaN left elsewhere."""
    S = rows
    assert_close("log_probs", outs["log_probs"], ref[0][:S], tol)
    assert_close("var", outs["var"], ref[3][:S], tol)
    assert_close("q", outs["q"], ref[2], tol)
    probs = host64(outs["probs"])
    assert_close("probs s", probs[:S], ref[1][:S], tol)
    assert_close("probs target", probs[2 * S :], ref[1][2 * S :], tol)
    assert np.isnan(probs[S : 2 * S]).all()  # the middle segment wants E[Q] only
    zq = host64(zwide)
    assert_close("zq", zq[:, 5 : 5 + n_dir], 0.25 * ref[2][:, :n_dir], tol)
    assert np.isnan(zq[:, :5]).all() and np.isnan(zq[:, 5 + n_dir :]).all()
