"""Central finite-difference gradient checks in float64.

``check_tree_gradients`` perturbs a sample of entries of every parameter in a tree
(``{owner: {name: array}}``) and compares ``(f(x+h) - f(x-h)) / 2h`` with the analytic gradient.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np


def relative_error(a: np.ndarray, b: np.ndarray) -> float:
    """``|a - b| / max(|a| + |b|, tiny)``, elementwise max."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    denom = np.maximum(np.abs(a) + np.abs(b), 1e-10)
    return float(np.max(np.abs(a - b) / denom)) if a.size else 0.0


def numeric_gradient(
    f: Callable[[], float], x: np.ndarray, idx: tuple[int, ...], h: float = 1e-6
) -> float:
    """Central difference of ``f`` w.r.t. ``x[idx]`` (``x`` is perturbed in place and restored)."""
    old = x[idx]
    x[idx] = old + h
    fp = f()
    x[idx] = old - h
    fm = f()
    x[idx] = old
    return (fp - fm) / (2 * h)


def check_tree_gradients(
    loss: Callable[[], float],
    params: dict[str, dict[str, np.ndarray]],
    grads: dict[str, dict[str, Any]],
    rng: np.random.Generator,
    samples_per_tensor: int = 6,
    h: float = 1e-6,
    atol: float = 1e-8,
    rtol: float = 1e-5,
) -> list[str]:
    """Compare analytic ``grads`` with central differences of ``loss``; return the failures.

    A failure is reported when ``|analytic - numeric| > atol + rtol * max(|analytic|, |numeric|)``.
    Every tensor of ``params`` must have a gradient in ``grads`` of the same shape.
    """
    failures: list[str] = []
    for owner, sub in params.items():
        for name, x in sub.items():
            if x.dtype != np.float64:
                raise TypeError(f"gradient checks need float64 parameters, {owner}/{name} is {x.dtype}")
            g = grads.get(owner, {}).get(name)
            if g is None or np.shape(g) != x.shape:
                failures.append(f"{owner}/{name}: missing or misshapen gradient")
                continue
            flat_n = x.size
            picks = rng.choice(flat_n, size=min(samples_per_tensor, flat_n), replace=False)
            for flat in picks:
                idx = np.unravel_index(int(flat), x.shape)
                num = numeric_gradient(loss, x, idx, h)
                ana = float(np.asarray(g)[idx])
                if abs(ana - num) > atol + rtol * max(abs(ana), abs(num)):
                    failures.append(f"{owner}/{name}{[int(i) for i in idx]}: analytic {ana:.8g} numeric {num:.8g}")
    return failures
