"""The plan's versions of the KAN gate's math (Task 1, kan_gate_combine / kan_gate_backward), as
NumPy models, so that each defect test can show that its check catches the plan's defect.

They model what the plan's kernels compute; they are not used by the plugin.
"""

from __future__ import annotations

import numpy as np

LO, STEP, BASES = -4.0, 1.0, 8  # the plan: 8 bases on unit-spaced knots -4, -3, ..., 4


def plan_locate(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The plan clamps to [-4, 4 - 0.001] and takes span in 0..7 with local t."""
    xc = np.clip(x, LO, LO + BASES * STEP - 0.001)
    u = (xc - LO) / STEP
    span = np.clip(np.floor(u), 0, BASES - 1).astype(int)
    return span, u - span


def plan_basis(x: np.ndarray) -> np.ndarray:
    """Dense [.., 8] basis as the plan evaluates it: bases span-1 .. span+2, the ones outside 0..7 dropped."""
    span, t = plan_locate(x)
    vals = ((1 - t) ** 3 / 6, (3 * t**3 - 6 * t**2 + 4) / 6, (-3 * t**3 + 3 * t**2 + 3 * t + 1) / 6, t**3 / 6)
    out = np.zeros(x.shape + (BASES,))
    for j, v in enumerate(vals):
        for k in range(BASES):  # a basis index outside 0..7 matches no column: dropped
            out[..., k] += np.where(span - 1 + j == k, v, 0)
    return out


def plan_piece_slopes(t: np.ndarray) -> tuple[np.ndarray, ...]:
    """The plan's slopes of the four pieces: the third is written -3t^2 + 2t + 0.5 (defect 2)."""
    return -(1 - t) ** 2 / 2, (3 * t**2 - 4 * t) / 2, -3 * t**2 + 2 * t + 0.5, t**2 / 2


def plan_spline_slope(x: np.ndarray, coeff: np.ndarray) -> np.ndarray:
    """The plan's d spline / dx of one unit (coefficients [8]): the slope at the *clamped* input,
    also where the input was clamped (defect 3), with its slopes and dropped bases."""
    span, t = plan_locate(x)
    out = np.zeros_like(x)
    for j, s in enumerate(plan_piece_slopes(t)):
        k = span - 1 + j
        ok = (k >= 0) & (k < BASES)
        out += np.where(ok, coeff[np.clip(k, 0, BASES - 1)] * s, 0)
    return out / STEP


def plan_residual_gradient(width: int) -> np.ndarray:
    """What the plan's ``atomicAdd(&d_residual_w + neuron, ...)`` leaves in the residual gradient:
    ``&d_residual_w`` is the address of the pointer argument, so the sums go to memory beyond it
    and the gradient buffer keeps its initial zeros."""
    return np.zeros(width)


PLAN_SIGMOID_COEFFS = np.array([0.03, 0.07, 0.18, 0.38, 0.62, 0.82, 0.93, 0.97])
"""The plan's typed initial coefficients ("sigmoid at the grid midpoints")."""
