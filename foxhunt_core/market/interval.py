"""The bar interval of a market and how many bars make a year: what annualizes every figure.

:func:`detect_interval` reads it from the bar timestamps:

* ``seconds`` — the median gap between consecutive timestamps (weekend and overnight gaps are
  the minority of gaps on intraday and daily data, so the median is the bar);
* ``bars_per_year`` — when the data span at least :data:`MIN_SPAN_DAYS` calendar days, the
  observed density ``(T - 1) / span in years`` (so sessions, weekends and holidays count as they
  occur in the file: about 252 for daily equity bars, about 6 200 for hourly bars of a market
  open 24 hours on weekdays); for a shorter span, the median number of bars per calendar day
  with bars times 252 trading days when the file has no weekend bars, 365 when it has.

A user can set either (``market.bar_seconds``, ``market.bars_per_year``); the synthetic
market states its own (:data:`foxhunt_core.market.synthetic.BAR`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

NS_PER_DAY = 86_400 * 10**9
DAYS_PER_YEAR = 365.25
MIN_SPAN_DAYS = 60.0
TRADING_DAYS = 252


@dataclass(frozen=True)
class BarInterval:
    """A bar length, the bars in a year, and where the figures came from."""

    seconds: float
    bars_per_year: float
    source: str
    """``detected``, ``set`` (by the user) or ``synthetic`` (stated by the market model)."""

    @property
    def label(self) -> str:
        """A short human form of the bar length: ``1min``, ``5min``, ``1h``, ``1d``, ``90s``."""
        return format_seconds(self.seconds)

    def describe(self) -> str:
        return f"{self.label} bars, {self.bars_per_year:,.0f} a year ({self.source})"

    def to_dict(self) -> dict[str, object]:
        return {**asdict(self), "label": self.label}


def format_seconds(seconds: float) -> str:
    """``86400 -> '1d'``, ``3600 -> '1h'``, ``300 -> '5min'``, ``45 -> '45s'``."""
    s = float(seconds)
    for unit, size in (("d", 86_400.0), ("h", 3_600.0), ("min", 60.0)):
        if s >= size and abs(s / size - round(s / size)) < 1e-6:
            return f"{round(s / size)}{unit}"
    return f"{s:g}s"


def detect_interval(timestamps: np.ndarray, *, bar_seconds: float | None = None,
                    bars_per_year: float | None = None) -> BarInterval:
    """The interval of bars at ``timestamps`` (int64 ns, increasing), with optional overrides.

    Raises ``ValueError`` for fewer than two bars (no interval can be read) unless both figures
    are given.
    """
    ts = np.asarray(timestamps, dtype=np.int64)
    overridden = bar_seconds is not None or bars_per_year is not None
    if bar_seconds is not None and bars_per_year is not None:
        return BarInterval(float(bar_seconds), float(bars_per_year), "set")
    if ts.shape[0] < 2:
        raise ValueError("the bar interval cannot be detected from fewer than two bars: set market.bar_seconds "
                         "and market.bars_per_year")
    gaps = np.diff(ts)
    seconds = float(bar_seconds) if bar_seconds is not None else float(np.median(gaps)) / 1e9
    if bars_per_year is None:
        span_days = float(ts[-1] - ts[0]) / NS_PER_DAY
        if span_days >= MIN_SPAN_DAYS:
            bars_per_year = (ts.shape[0] - 1) / (span_days / DAYS_PER_YEAR)
        else:
            days = ts // NS_PER_DAY
            per_day = float(np.median(np.unique(days, return_counts=True)[1]))
            weekday = (days + 3) % 7  # 1970-01-01 was a Thursday: 0 is Monday
            calendar = DAYS_PER_YEAR if np.any(weekday >= 5) else TRADING_DAYS
            bars_per_year = per_day * calendar
    return BarInterval(seconds, float(bars_per_year), "set" if overridden else "detected")
