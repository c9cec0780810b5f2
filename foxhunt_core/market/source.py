"""The market a run trains and evaluates on, from its settings: the synthetic one or a user's file.

:func:`load_market` returns a :class:`Market`: the bars, their train / validation / test splits
(the scaler fitted on the training block only, :func:`~foxhunt_core.market.splits.split_by_time`),
the bar interval that annualizes every figure (:mod:`foxhunt_core.market.interval`), the
environment settings with the market's costs applied (:mod:`foxhunt_core.market.costs`) and a
fingerprint of the data file(s), which a checkpoint records so that ``resume`` and ``eval`` refuse
a file that changed under the run.

``market.source: file`` reads ``market.path`` as OHLCV bars (``format: ohlcv``) or as L1 quotes
with ``market.trades_path`` the trades (``format: l1``, resampled to ``market.bar_seconds``,
default 60 s). A relative path in a flag file is relative to the flag file
(:func:`resolve_paths`, called by :func:`foxhunt_core.flags.load_flags`).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from foxhunt_core.config import EnvSettings, MarketSettings, RunSettings
from foxhunt_core.market.costs import apply_costs
from foxhunt_core.market.data import MarketData
from foxhunt_core.market.interval import BarInterval, detect_interval
from foxhunt_core.market.loaders import DataError, load_l1, load_ohlcv
from foxhunt_core.market.splits import Splits, split_by_time

DEFAULT_L1_BAR_SECONDS = 60.0


@dataclass
class Market:
    """A run's market: bars, splits, interval, costs, where it came from."""

    data: MarketData
    splits: Splits
    interval: BarInterval
    env: EnvSettings
    """``settings.env`` with the market's fee override (if any) applied."""
    costs: str
    """How spreads and fees were obtained, in words (shown with the evaluation)."""
    fingerprint: dict[str, Any]

    def describe(self) -> str:
        return f"{self.data.source}, {len(self.data)} bars, {self.interval.describe()}"


def _read(m: MarketSettings) -> MarketData:
    if m.source == "synthetic":
        from foxhunt_core.market.synthetic import simulate

        return simulate(m)
    if m.format == "ohlcv":
        return load_ohlcv(m.path)  # type: ignore[arg-type]
    bar = m.bar_seconds if m.bar_seconds is not None else DEFAULT_L1_BAR_SECONDS
    return load_l1(m.path, m.trades_path, bar_seconds=bar)  # type: ignore[arg-type]


def _interval(m: MarketSettings, data: MarketData) -> BarInterval:
    if m.source == "synthetic":
        from foxhunt_core.market.synthetic import BAR

        if m.bar_seconds is None and m.bars_per_year is None:
            return BAR
        return BarInterval(m.bar_seconds or BAR.seconds, m.bars_per_year or BAR.bars_per_year, "set")
    try:
        return detect_interval(data.timestamp, bar_seconds=m.bar_seconds, bars_per_year=m.bars_per_year)
    except ValueError as exc:
        raise DataError(f"{m.path}: {exc}") from None


def bar_volatility_bps(split: MarketData) -> float:
    """Standard deviation of the split's bar-to-bar mid returns in bps (1 when they are flat)."""
    r = split.mid[1:] / split.mid[:-1] - 1.0
    vol = float(np.std(r)) * 1e4 if r.size else 0.0
    return vol if vol > 1e-6 else 1.0


def fingerprint(m: MarketSettings) -> dict[str, Any]:
    """sha256 of each data file of a file market (empty for the synthetic one, which is seeded)."""
    if m.source != "file":
        return {}
    out = {}
    for key in ("path", "trades_path"):
        name = getattr(m, key)
        if name is None or (key == "trades_path" and m.format != "l1"):
            continue
        try:
            out[key] = hashlib.sha256(Path(name).read_bytes()).hexdigest()
        except OSError as exc:
            raise DataError(f"{name}: cannot read file ({exc.strerror})") from None
    return out


def load_market(settings: RunSettings, for_training: bool = True) -> Market:
    """The market of ``settings`` (see the module docstring); bad data raise :class:`DataError`.
    ``for_training``: the training split must hold an episode (evaluation alone does not need it)."""
    m = settings.market
    data = _read(m)  # first: the loaders read regular files only (never a FIFO's endless stream)
    fp = fingerprint(m)
    data, env, costs = apply_costs(data, m, settings.env)
    try:
        splits = split_by_time(data, m.train_fraction, m.val_fraction)
    except ValueError as exc:
        raise DataError(f"{m.path or 'synthetic market'}: {exc}") from None
    if env.reward_scale_bps is None:
        env = env.model_copy(update={"reward_scale_bps": bar_volatility_bps(splits.train)})
    short = min(len(splits.train), len(splits.test))
    if for_training and m.source == "file" and len(splits.train) < settings.env.episode_len + 1:
        need = settings.env.episode_len + 1
        raise DataError(f"{m.path}: the training split has {len(splits.train)} bars, fewer than "
                        f"env.episode_len + 1 = {need}: lower env.episode_len or give more bars")
    if short < 2:
        raise DataError(f"{m.path}: the train or test split has fewer than 2 bars")
    return Market(data=data, splits=splits, interval=_interval(m, data), env=env, costs=costs, fingerprint=fp)


def check_fingerprint(saved: dict[str, Any] | None, settings: RunSettings, where: str) -> None:
    """Raise ``ValueError`` when a checkpoint's data fingerprint differs from the files now."""
    if not saved:
        return
    now = fingerprint(settings.market)
    for key, digest in saved.items():
        if now.get(key) != digest:
            name = getattr(settings.market, key)
            raise ValueError(f"{where}: the data file {name} changed since the run was trained "
                             f"(sha256 {digest[:12]}, now {str(now.get(key))[:12]})")


def resolve_paths(run: dict[str, Any], base: Path) -> dict[str, Any]:
    """A ``run:`` mapping whose relative market paths are made absolute against ``base``."""
    market = run.get("market") if isinstance(run, dict) else None
    if not isinstance(market, dict):
        return run
    fixed = dict(market)
    for key in ("path", "trades_path"):
        value = fixed.get(key)
        if isinstance(value, str) and value and not Path(value).expanduser().is_absolute():
            fixed[key] = str((base / value).resolve())
        elif isinstance(value, str) and value:
            fixed[key] = str(Path(value).expanduser())
    return {**run, "market": fixed}


def file_market(path: str | Path, fmt: str = "ohlcv", trades: str | Path | None = None) -> dict[str, Any]:
    """The ``market`` settings of ``--data FILE`` (absolute paths)."""
    # absolute, not resolved: messages name the file as the user did (a link by its own name)
    out: dict[str, Any] = {"source": "file", "path": str(Path(path).absolute()), "format": fmt}
    if trades is not None:
        out["trades_path"] = str(Path(trades).absolute())
    return out
