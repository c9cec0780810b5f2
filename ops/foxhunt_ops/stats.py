"""Paired one-sided tests across seeds: is a stage worse than the last good one?

Both take the per-seed differences ``x_s`` (stage minus good stage, oriented so that *worse is
negative*) and return the one-sided p-value of "the differences are centred below zero".
Zeros carry no sign and are dropped. With n seeds the smallest attainable p-value is ``2**-n``
for both tests (0.125 with 3 seeds, 0.031 with 5): a gate with ``alpha: 0.05`` needs at least
five seeds to block at all, which is why the default gates report the p-value and decide by the
tolerance.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence


def sign_test_less(x: Sequence[float]) -> float:
    """Exact sign test: P(at least k negatives among n non-zero differences | P(negative) = 1/2)."""
    nz = [v for v in x if v != 0]
    n, k = len(nz), sum(1 for v in nz if v < 0)
    if n == 0:
        return 1.0
    return sum(math.comb(n, i) for i in range(k, n + 1)) / 2**n


def _ranks(a: Sequence[float]) -> list[float]:
    """Ranks 1..n of ``a`` with ties given their average rank."""
    order = sorted(range(len(a)), key=lambda i: a[i])
    ranks = [0.0] * len(a)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and a[order[j + 1]] == a[order[i]]:
            j += 1
        for t in range(i, j + 1):
            ranks[order[t]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def wilcoxon_less(x: Sequence[float], exact_up_to: int = 16) -> float:
    """Wilcoxon signed-rank test: P(W+ <= observed W+) under random signs.

    Exact (all ``2**n`` sign patterns, tied ranks averaged) up to ``exact_up_to`` non-zero
    differences; the normal approximation with a continuity correction above that.
    """
    nz = [v for v in x if v != 0]
    n = len(nz)
    if n == 0:
        return 1.0
    r = _ranks([abs(v) for v in nz])
    w_plus = sum(rk for rk, v in zip(r, nz) if v > 0)
    if n <= exact_up_to:
        hits = sum(1 for signs in itertools.product((0, 1), repeat=n)
                   if sum(rk for rk, s in zip(r, signs) if s) <= w_plus + 1e-9)
        return hits / 2**n
    mean = sum(r) / 2
    sd = math.sqrt(sum(rk * rk for rk in r) / 4)
    z = (w_plus + 0.5 - mean) / sd
    return 0.5 * math.erfc(-z / math.sqrt(2))


TESTS = {"sign": sign_test_less, "wilcoxon": wilcoxon_less}
