"""Bar interval detection: the bar from the timestamps, bars a year from their density."""

import numpy as np
import pytest

from foxhunt_core.market.interval import BarInterval, detect_interval, format_seconds

NS = 10**9
DAY = 86_400 * NS


def _weekdays(n_days, start="2020-01-06"):  # a Monday
    days = np.arange(np.datetime64(start), np.datetime64(start) + n_days * 7 // 5 + 7)
    keep = np.is_busday(days)
    return days[keep][:n_days].astype("datetime64[ns]").astype(np.int64)


def test_daily_bars_of_trading_days():
    ts = _weekdays(1000) + 21 * 3600 * NS  # closes at 21:00 UTC, weekends skipped
    got = detect_interval(ts)
    assert got.seconds == 86_400 and got.label == "1d" and got.source == "detected"
    assert got.bars_per_year == pytest.approx(365.25 * 5 / 7, rel=0.01)  # ~261 weekdays (no holidays here)


def test_hourly_bars_of_a_weekday_market():
    days = _weekdays(300)
    ts = (days[:, None] + np.arange(1, 25)[None, :] * 3600 * NS).ravel()
    got = detect_interval(ts)
    assert got.label == "1h"
    assert got.bars_per_year == pytest.approx(24 * 365.25 * 5 / 7, rel=0.01)


def test_short_span_uses_bars_a_day_and_the_calendar():
    # one trading day of minute bars (390): no weekend in the file, so 252 sessions a year
    ts = np.datetime64("2024-03-05T14:31").astype("datetime64[ns]").astype(np.int64) + np.arange(390) * 60 * NS
    got = detect_interval(ts)
    assert got.label == "1min" and got.bars_per_year == 390 * 252
    # the same across a weekend day: a market open every day
    sat = np.datetime64("2024-03-09T00:00").astype("datetime64[ns]").astype(np.int64) + np.arange(1440) * 60 * NS
    assert detect_interval(sat).bars_per_year == pytest.approx(1440 * 365.25)


def test_overrides_and_errors():
    ts = np.arange(10) * 300 * NS
    assert detect_interval(ts, bar_seconds=60).seconds == 60
    assert detect_interval(ts, bar_seconds=60).source == "set"
    assert detect_interval(ts, bars_per_year=1000).bars_per_year == 1000
    assert detect_interval(ts[:1], bar_seconds=60, bars_per_year=5) == BarInterval(60.0, 5.0, "set")
    with pytest.raises(ValueError, match="fewer than two bars"):
        detect_interval(ts[:1])
    assert [format_seconds(s) for s in (86_400, 3_600, 300, 60, 45, 5400)] == ["1d", "1h", "5min", "1min", "45s",
                                                                                 "90min"]
