"""The market: synthetic L1 order-book simulation, real-data loaders, features and splits.

* :mod:`~foxhunt_core.market.schema` — the named 50-feature layout;
* :mod:`~foxhunt_core.market.data` — :class:`MarketData`, the bar record;
* :mod:`~foxhunt_core.market.synthetic` — :func:`simulate`, the seeded synthetic market;
* :mod:`~foxhunt_core.market.features` — :func:`compute_features`, :class:`FeatureScaler`;
* :mod:`~foxhunt_core.market.loaders` — :func:`load_ohlcv`, :func:`load_l1`, :class:`DataError`;
* :mod:`~foxhunt_core.market.splits` — :func:`split_by_time`, :class:`Splits`.
"""

from __future__ import annotations

from pathlib import Path

from foxhunt_core.config import MarketSettings
from foxhunt_core.market import schema
from foxhunt_core.market.data import MarketData
from foxhunt_core.market.features import FeatureScaler, compute_features
from foxhunt_core.market.loaders import DataError, load_l1, load_ohlcv
from foxhunt_core.market.splits import Splits, split_by_time, synthetic_splits
from foxhunt_core.market.synthetic import simulate


def load_bars_for_eval(path: str | Path, settings: MarketSettings, split: str = "test") -> Splits:
    """An OHLCV bar file split like the synthetic market (the scaler fitted on its own
    training block), for evaluating a trained policy on real bars; a file too short for the
    evaluated ``split`` to hold :data:`~foxhunt_core.validation.MIN_EVAL_BARS` bars is refused."""
    from foxhunt_core.validation import split_problem

    data = load_ohlcv(path)
    why = split_problem(len(data), settings.train_fraction, settings.val_fraction, None, split)
    if why is not None:
        raise DataError(f"{path}: {why}")
    return split_by_time(data, settings.train_fraction, settings.val_fraction)


__all__ = [
    "DataError",
    "FeatureScaler",
    "MarketData",
    "Splits",
    "compute_features",
    "load_bars_for_eval",
    "load_l1",
    "load_ohlcv",
    "schema",
    "simulate",
    "split_by_time",
    "synthetic_splits",
]
