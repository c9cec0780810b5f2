"""The market: synthetic L1 order-book simulation, real-data loaders, features and splits.

* :mod:`~foxhunt_core.market.schema` — the named 50-feature layout;
* :mod:`~foxhunt_core.market.data` — :class:`MarketData`, the bar record;
* :mod:`~foxhunt_core.market.synthetic` — :func:`simulate`, the seeded synthetic market;
* :mod:`~foxhunt_core.market.features` — :func:`compute_features`, :class:`FeatureScaler`;
* :mod:`~foxhunt_core.market.loaders` — :func:`load_ohlcv`, :func:`load_l1`, :class:`DataError`;
* :mod:`~foxhunt_core.market.splits` — :func:`split_by_time`, :class:`Splits`;
* :mod:`~foxhunt_core.market.interval` — :func:`detect_interval`, the bar interval;
* :mod:`~foxhunt_core.market.costs` — spreads and fees, with the user's overrides;
* :mod:`~foxhunt_core.market.source` — :func:`load_market`, a run's market from its settings.
"""

from __future__ import annotations

from foxhunt_core.market import schema
from foxhunt_core.market.data import MarketData
from foxhunt_core.market.features import FeatureScaler, compute_features
from foxhunt_core.market.loaders import DataError, load_l1, load_ohlcv
from foxhunt_core.market.splits import Splits, split_by_time, synthetic_splits
from foxhunt_core.market.synthetic import simulate

__all__ = [
    "DataError",
    "FeatureScaler",
    "MarketData",
    "Splits",
    "compute_features",
    "load_l1",
    "load_ohlcv",
    "schema",
    "simulate",
    "split_by_time",
    "synthetic_splits",
]
