"""Statistics across seeds, from scipy.stats: paired one-sided tests and a bootstrap interval.

The tests take per-seed values ``x_s`` oriented so that *worse is negative* (stage minus good
stage for a ``min`` bound; the gate flips the sign for a ``max`` bound) and return the one-sided
p-value of "the stage is worse":

* :func:`sign_test_less` — the exact sign test, ``scipy.stats.binomtest`` of the number of
  negative differences among the non-zero ones (``P(negative) = 1/2``, alternative ``greater``);
* :func:`wilcoxon_less` — the Wilcoxon signed-rank test, ``scipy.stats.wilcoxon`` with
  alternative ``less`` (zeros dropped); its null distribution is enumerated exactly over all
  ``2**n`` sign patterns (tied ranks averaged) up to 16 non-zero differences, the normal
  approximation above.

With n seeds the smallest attainable p-value is ``2**-n`` for both (0.125 with 3 seeds, 0.031
with 5): a gate with ``alpha: 0.05`` needs at least five seeds to block at all.

:func:`bootstrap_interval` is the percentile bootstrap interval (``scipy.stats.bootstrap``) of
the mean or median of the per-seed values — for a comparison, of the paired difference (or
ratio) itself. Resampling uses a fixed seed, so the same values always give the same interval
and two rollouts of one plan record the same intervals. With 3 to 5 seeds there are only 10 to
126 distinct resamples: the interval is coarse and, being a percentile interval, somewhat narrow
for so few values; that is why an interval that straddles a bound makes a stage *inconclusive*
rather than failed.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence

import numpy as np
from scipy import stats

EXACT_UP_TO = 16
BOOTSTRAP_RESAMPLES = 9999
BOOTSTRAP_SEED = 20160920
STATISTICS = {"mean": np.mean, "median": np.median}


def _nonzero(x: Sequence[float]) -> np.ndarray:
    a = np.asarray(list(x), dtype=np.float64)
    return a[a != 0]


def sign_test_less(x: Sequence[float]) -> float:
    """Exact sign test: P(at least k negatives among n non-zero differences | P(negative) = 1/2)."""
    nz = _nonzero(x)
    if nz.size == 0:
        return 1.0
    k = int(np.count_nonzero(nz < 0))
    return float(stats.binomtest(k, int(nz.size), 0.5, alternative="greater").pvalue)


def wilcoxon_less(x: Sequence[float], exact_up_to: int = EXACT_UP_TO) -> float:
    """Wilcoxon signed-rank test that the differences are centred below zero (zeros dropped).

    Exact (every sign pattern enumerated, tied ranks averaged) up to ``exact_up_to`` non-zero
    differences, the normal approximation above.
    """
    nz = _nonzero(x)
    if nz.size == 0:
        return 1.0
    method: object = stats.PermutationMethod(n_resamples=np.inf) if nz.size <= exact_up_to else "approx"
    return float(stats.wilcoxon(nz, alternative="less", zero_method="wilcox", method=method).pvalue)


TESTS = {"sign": sign_test_less, "wilcoxon": wilcoxon_less}


def bootstrap_interval(x: Sequence[float], statistic: str = "mean", confidence: float = 0.9
                       ) -> tuple[float, float] | None:
    """Two-sided percentile bootstrap interval of ``statistic`` (mean or median) of ``x``.

    ``None`` for fewer than two values (nothing to resample). Identical values give the
    degenerate interval ``(v, v)``.
    """
    a = np.asarray(list(x), dtype=np.float64)
    if a.size < 2:
        return None
    if np.all(a == a[0]):
        return float(a[0]), float(a[0])
    fn = STATISTICS[statistic]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # scipy warns about small or degenerate samples; the docstring says why
        res = stats.bootstrap((a,), fn, n_resamples=BOOTSTRAP_RESAMPLES, confidence_level=confidence,
                              method="percentile", vectorized=True, rng=np.random.default_rng(BOOTSTRAP_SEED))
    lo, hi = float(res.confidence_interval.low), float(res.confidence_interval.high)
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return None
    return lo, hi
