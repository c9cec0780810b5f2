"""Chronological train / validation / test splits of a market, with the feature scaler.

:func:`split_by_time` cuts a :class:`MarketData` into three consecutive, non-overlapping
blocks of bars (train first, test last), fits a :class:`FeatureScaler` on the training bars'
features only and applies it to all three. Features are causal, so the first bars of the
validation and test blocks may look back into the preceding block (as live trading would)
but nothing in one block depends on a later one.
"""

from __future__ import annotations

from dataclasses import dataclass

from foxhunt_core.config import MarketSettings
from foxhunt_core.market.data import MarketData
from foxhunt_core.market.features import FeatureScaler


@dataclass
class Splits:
    """Scaled train, validation and test blocks, the scaler, and their bar ranges."""

    train: MarketData
    val: MarketData
    test: MarketData
    scaler: FeatureScaler
    bounds: tuple[tuple[int, int], tuple[int, int], tuple[int, int]]


def split_by_time(data: MarketData, train_fraction: float, val_fraction: float) -> Splits:
    """Split ``data`` by time into ``train | val | test``; scale with train statistics.

    The training block has ``floor(T * train_fraction)`` bars, validation
    ``floor(T * val_fraction)`` (may be empty), test the rest (must not be empty).
    """
    t_len = len(data)
    if not (0 < train_fraction < 1 and 0 <= val_fraction < 1):
        raise ValueError("train_fraction must be in (0, 1) and val_fraction in [0, 1)")
    n_train = int(t_len * train_fraction)
    n_val = int(t_len * val_fraction)
    if n_train < 2 or n_train + n_val >= t_len:
        raise ValueError(
            f"{t_len} bars split {train_fraction}/{val_fraction} leaves an empty train or test "
            "block"
        )
    bounds = ((0, n_train), (n_train, n_train + n_val), (n_train + n_val, t_len))
    scaler = FeatureScaler.fit(data.features[:n_train])

    def block(start: int, stop: int) -> MarketData:
        part = data.slice(start, stop)
        return part.replace(features=scaler.transform(part.features), scaled=True)

    return Splits(
        train=block(*bounds[0]),
        val=block(*bounds[1]),
        test=block(*bounds[2]),
        scaler=scaler,
        bounds=bounds,
    )


def synthetic_splits(settings: MarketSettings) -> Splits:
    """Simulate the synthetic market of ``settings`` and split it as configured."""
    from foxhunt_core.market.synthetic import simulate

    return split_by_time(simulate(settings), settings.train_fraction, settings.val_fraction)
