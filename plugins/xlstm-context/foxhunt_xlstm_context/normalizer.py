"""Online normalization of the Q-statistics the cell reads.

Each reading ``x`` (clipped to ``+-input_clip``) updates an exponentially weighted mean and
variance with rate ``a_t = max(1/t, rate)``::

    delta = x - mean
    mean <- mean + a_t * delta
    var  <- (1 - a_t) * (var + a_t * delta^2)

For ``t <= 1/rate`` this is the plain running mean and (population) variance of the readings so
far; after that, an exponential average over about ``1/rate`` readings, so the scale follows the
run as Q-values grow. The cell sees ``z = clip((x - mean) / sqrt(var + VAR_FLOOR), +-z_clip)``,
with the reading itself already in the statistics; the first reading, and any statistic that has
been constant so far, gives ``z = 0``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

VAR_FLOOR = 1e-10
"""Added to the variance: a statistic that moves by less than ~1e-5 reads as constant."""


class OnlineNormalizer:
    """Running mean and variance of ``width`` statistics, and the normalized reading."""

    def __init__(self, width: int, rate: float, input_clip: float, z_clip: float) -> None:
        self.rate, self.input_clip, self.z_clip = rate, input_clip, z_clip
        self.count = 0
        self.mean = np.zeros(width)
        self.var = np.zeros(width)
        self.clipped = 0

    def update(self, x: np.ndarray) -> np.ndarray:
        """Take a finite reading into the statistics; return it normalized."""
        xc = np.clip(x, -self.input_clip, self.input_clip)
        self.clipped += int(np.count_nonzero(xc != x))
        self.count += 1
        a = max(1.0 / self.count, self.rate)
        delta = xc - self.mean
        self.mean = self.mean + a * delta
        self.var = (1.0 - a) * (self.var + a * delta * delta)
        return np.clip((xc - self.mean) / np.sqrt(self.var + VAR_FLOOR), -self.z_clip, self.z_clip)

    def state(self) -> dict[str, Any]:
        return {"count": self.count, "mean": self.mean.tolist(), "var": self.var.tolist(), "clipped": self.clipped}

    def load(self, s: dict[str, Any]) -> None:
        self.count, self.clipped = int(s["count"]), int(s["clipped"])
        self.mean = np.asarray(s["mean"], dtype=np.float64)
        self.var = np.asarray(s["var"], dtype=np.float64)
