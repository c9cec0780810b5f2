"""Whether a validation edge is real: a block-bootstrap lower bound on a return difference.

Model selection (:mod:`foxhunt_core.selection`) keeps the parameters with the highest validation
return; whether they are deployed depends on this test. For each reference policy ``r`` (flat,
buy-and-hold, the linear forecast, momentum: ``select.edge_over``) the per-bar PnL difference
``d_t = pnl_t(policy) - pnl_t(r)`` on the validation split is resampled with the circular
moving-block bootstrap (Kunsch 1989; Politis and Romano 1992): ``ceil(n / b)`` blocks of ``b``
consecutive bars (wrapping around the end) drawn with replacement, cut to ``n`` bars, summed.
The ``1 - confidence`` quantile of the :data:`RESAMPLES` resampled totals is the lower bound of
the policy's return over ``r`` (the percentile interval, one-sided). The edge is real when the
bound is above zero for every reference.

Blocks keep the serial dependence of the PnL (a position held for many bars, volatility that
clusters) in the resamples; an iid bootstrap (``b = 1``) would understate the spread of a
persistent series. The default block is ``round(n ** (1/3))`` bars (Hall, Horowitz and Jing
1995), at least 1. The draws come from a fixed seed, so the bound is a function of the PnL
series alone (a resumed run reproduces it).

The test never sees the test split. It judges the parameters that won the selection, so their
validation return is the largest of several; the bound is therefore optimistic by that
selection, which a confidence of 0.95 leaves a margin for.
"""

from __future__ import annotations

import math

import numpy as np

RESAMPLES = 2000
SEED = 20_260_101  # the bootstrap's own seed (independent of the run's)


def default_block(n: int) -> int:
    """``round(n ** (1/3))``, at least 1."""
    return max(1, int(round(n ** (1.0 / 3.0)))) if n > 0 else 1


def bootstrap_totals(diff: np.ndarray, block: int, resamples: int = RESAMPLES,
                     seed: int = SEED) -> np.ndarray:
    """Totals of ``resamples`` circular moving-block resamples of ``diff`` (module docstring)."""
    x = np.asarray(diff, dtype=np.float64)
    n = x.shape[0]
    if n == 0:
        return np.zeros(resamples)
    b = min(max(int(block), 1), n)
    blocks = math.ceil(n / b)
    rng = np.random.default_rng(seed)
    # Sum of a block from each start (circular), then the sum of the blocks drawn; the last
    # block is cut so that every resample has exactly n bars.
    wrapped = np.concatenate([x, x[: b - 1]])
    csum = np.concatenate([[0.0], np.cumsum(wrapped)])
    full = csum[b: b + n] - csum[:n]  # [n] sum of the block of b bars starting at each bar
    tail = n - (blocks - 1) * b  # bars taken from the last block (1..b)
    part = csum[tail: tail + n] - csum[:n]
    starts = rng.integers(0, n, size=(resamples, blocks))
    return full[starts[:, :-1]].sum(axis=1) + part[starts[:, -1]]


def lower_bound(diff: np.ndarray, confidence: float, block: int | None = None,
                resamples: int = RESAMPLES) -> float:
    """The one-sided ``confidence`` lower bound of the total of ``diff`` (module docstring)."""
    x = np.asarray(diff, dtype=np.float64)
    b = default_block(x.shape[0]) if block is None else int(block)
    totals = bootstrap_totals(x, b, resamples)
    return float(np.quantile(totals, 1.0 - confidence))


def edge_bounds(pnl: np.ndarray, references: dict[str, np.ndarray], confidence: float,
                block: int | None = None) -> dict[str, float]:
    """The lower bound of ``pnl``'s total over each reference's per-bar PnL (same bars)."""
    pnl = np.asarray(pnl, dtype=np.float64)
    out = {}
    for name, ref in references.items():
        ref = np.asarray(ref, dtype=np.float64)
        if ref.shape != pnl.shape:
            raise ValueError(f"reference {name!r} has {ref.shape[0]} bars, the policy {pnl.shape[0]}")
        out[name] = lower_bound(pnl - ref, confidence, block)
    return out
