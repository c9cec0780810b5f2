"""The bar-level market record every part of foxhunt reads: :class:`MarketData`.

A :class:`MarketData` holds ``T`` bars of a single instrument as parallel 1-D arrays (the L1
book at each bar's close and the trades inside the bar) plus the ``[T, 50]`` feature matrix of
the named schema (:mod:`foxhunt_core.market.schema`). The synthetic market, the CSV/Parquet
loaders and the time splits all produce it; the trading environment consumes it.

Field conventions:

* ``timestamp`` is int64 nanoseconds since the Unix epoch, strictly increasing; it is the
  time at which the bar's values are known (its close).
* ``mid``, ``bid``, ``ask`` are prices at the bar's close; ``bid <= mid <= ask``.
* ``bid_size``, ``ask_size`` are the L1 queue sizes at the close (shares).
* ``trade_volume`` (shares), ``trade_count`` (trades) and ``signed_volume`` (buyer- minus
  seller-initiated shares) are summed over the bar.
* ``ofi`` is the order-flow imbalance over the bar in shares (Cont, Kukanov and Stoikov 2014:
  bid-queue inflow minus ask-queue inflow).
* ``regime`` is the latent regime of the synthetic market, or ``-1`` for real data.
* ``features`` are float32 ``[T, 50]``; the account block (38..41) is zero here and written by
  the environment. Features are raw as computed by :mod:`foxhunt_core.market.features`
  until :func:`foxhunt_core.market.splits.split_by_time` scales them (``scaled`` says which).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from foxhunt_core.market.schema import STATE_DIM

_FLOAT_FIELDS: tuple[str, ...] = (
    "mid", "bid", "ask", "bid_size", "ask_size",
    "trade_volume", "trade_count", "signed_volume", "ofi",
)
ARRAY_FIELDS: tuple[str, ...] = ("timestamp", *_FLOAT_FIELDS, "regime")


@dataclass
class MarketData:
    """``T`` bars of L1 book, trades and features of one instrument (see module docstring)."""

    timestamp: np.ndarray
    mid: np.ndarray
    bid: np.ndarray
    ask: np.ndarray
    bid_size: np.ndarray
    ask_size: np.ndarray
    trade_volume: np.ndarray
    trade_count: np.ndarray
    signed_volume: np.ndarray
    ofi: np.ndarray
    regime: np.ndarray
    features: np.ndarray
    tick_size: float
    source: str
    scaled: bool = False

    def __post_init__(self) -> None:
        ts = np.asarray(self.timestamp)
        if ts.ndim != 1:
            raise ValueError(f"MarketData.timestamp must be 1-D, got shape {ts.shape}")
        n = ts.shape[0]
        self.timestamp = ts.astype(np.int64, copy=False)
        for name in _FLOAT_FIELDS:
            arr = np.asarray(getattr(self, name))
            if arr.shape != (n,):
                raise ValueError(
                    f"MarketData.{name} has shape {arr.shape}; expected ({n},) like timestamp"
                )
            setattr(self, name, arr.astype(np.float64, copy=False))
        reg = np.asarray(self.regime)
        if reg.shape != (n,):
            raise ValueError(f"MarketData.regime has shape {reg.shape}; expected ({n},)")
        self.regime = reg.astype(np.int8, copy=False)
        feats = np.asarray(self.features)
        if feats.shape != (n, STATE_DIM):
            raise ValueError(
                f"MarketData.features has shape {feats.shape}; expected ({n}, {STATE_DIM})"
            )
        self.features = feats.astype(np.float32, copy=False)
        if not (np.isfinite(self.tick_size) and self.tick_size > 0):
            raise ValueError(f"MarketData.tick_size must be positive, got {self.tick_size}")
        self.tick_size = float(self.tick_size)

    def __len__(self) -> int:
        return int(self.timestamp.shape[0])

    def slice(self, start: int, stop: int) -> MarketData:
        """Bars ``start:stop`` as a new record whose arrays are views of this one's."""
        n = len(self)
        if not 0 <= start <= stop <= n:
            raise ValueError(f"slice({start}, {stop}) is outside 0..{n}")
        arrays = {name: getattr(self, name)[start:stop] for name in ARRAY_FIELDS}
        return MarketData(
            **arrays,
            features=self.features[start:stop],
            tick_size=self.tick_size,
            source=self.source,
            scaled=self.scaled,
        )

    def replace(self, **changes: object) -> MarketData:
        """A copy of the record with the named fields replaced (arrays are shared otherwise)."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        unknown = set(changes) - set(values)
        if unknown:
            raise ValueError(f"MarketData has no field(s) {sorted(unknown)}")
        values.update(changes)
        return MarketData(**values)  # type: ignore[arg-type]
