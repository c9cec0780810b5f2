"""The 50 named features of a bar, computed causally from raw bars, and their scaler.

:func:`compute_features` maps raw bar arrays (any object with the :class:`MarketData` array
fields) to a float32 ``[T, 50]`` matrix in the order of :mod:`foxhunt_core.market.schema`.
Every column is looked up by name in ``schema.INDEX``.

Guarantees:

* **causal** — the row of bar ``t`` is a function of bars ``0..t`` only: rolling windows look
  back, EMAs run forward, and the warm-up uses partial windows (or the first bar as a fill);
  no statistic of the whole series is used (``tests/market/test_splits.py`` perturbs the
  future and checks the past bit for bit);
* **finite** — zero denominators map to 0 (a flat window has no z-score);
* **raw** — values are in natural units (volatility units, ticks, logs); the
  :class:`FeatureScaler` fitted on the training split brings them to O(1) and clips to ±5.

Notation: ``m`` the log mid, ``r_t = m_t - m_{t-1}`` (``r_0 = 0``), ``sigma_t`` the long-run
per-bar volatility, ``sqrt(EMA_{1/1024}(r^2))`` with bias correction, ``depth_t`` the mean L1
size ``(bid_size + ask_size) / 2`` and ``n_t = ofi_t / depth_t`` the depth-normalized
order-flow imbalance. The account block (38..41) is left at zero for the environment.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from foxhunt_core.market.schema import ACCOUNT_BLOCK, FEATURE_NAMES, INDEX, STATE_DIM

EPS_VOL = 1e-6  # log-return units (0.01 bp): the floor of every volatility in a denominator
LONG_ALPHA = 1.0 / 1024.0  # EMA weight of the long-run volatility and depth
RATE_ALPHA = 1.0 / 256.0  # EMA weight of the normal trade arrival rate
OFI_FAST, OFI_SLOW = 0.5, 0.1  # EMA weights of ofi_ema_fast / ofi_ema_slow
RSI_ALPHA = 1.0 / 14.0  # Wilder smoothing of the 14-bar RSI
SKEW_CLIP = 10.0


class RawBars(Protocol):
    """The array fields :func:`compute_features` reads (a :class:`MarketData` has them)."""

    mid: np.ndarray
    bid: np.ndarray
    ask: np.ndarray
    bid_size: np.ndarray
    ask_size: np.ndarray
    trade_volume: np.ndarray
    trade_count: np.ndarray
    signed_volume: np.ndarray
    ofi: np.ndarray
    tick_size: float


# ---------------------------------------------------------------- causal rolling primitives
def _lag(x: np.ndarray, k: int) -> np.ndarray:
    """``x[t - k]``, with ``x[0]`` for ``t < k``."""
    out = np.empty_like(x)
    out[k:] = x[:-k]
    out[:k] = x[0]
    return out


def _rsum(x: np.ndarray, w: int) -> np.ndarray:
    """Sum of the last ``w`` values (fewer during warm-up)."""
    c = np.cumsum(x)
    out = c.copy()
    out[w:] = c[w:] - c[:-w]
    return out


def _rmean(x: np.ndarray, w: int) -> np.ndarray:
    count = np.minimum(np.arange(1, x.shape[0] + 1), w)
    return _rsum(x, w) / count


def _rstd(x: np.ndarray, w: int) -> np.ndarray:
    """Rolling population std; the series is centred on its first value (a causal constant)
    so that the running sums stay small."""
    y = x - x[0]
    mean = _rmean(y, w)
    return np.sqrt(np.maximum(_rmean(y * y, w) - mean * mean, 0.0))


def _windowed(x: np.ndarray, w: int) -> np.ndarray:
    padded = np.concatenate([np.full(w - 1, x[0]), x])
    return sliding_window_view(padded, w)


def _rmax(x: np.ndarray, w: int) -> np.ndarray:
    return _windowed(x, w).max(axis=1)


def _rmin(x: np.ndarray, w: int) -> np.ndarray:
    return _windowed(x, w).min(axis=1)


def ema(x: np.ndarray, alpha: float, init: float = 0.0) -> np.ndarray:
    """``y_t = (1 - alpha) * y_{t-1} + alpha * x_t`` with ``y_{-1} = init``."""
    b = 1.0 - alpha
    y = init
    out = []
    append = out.append
    for v in x.tolist():
        y = b * y + alpha * v
        append(y)
    return np.asarray(out, dtype=np.float64)


def _ema_debiased(x: np.ndarray, alpha: float) -> np.ndarray:
    """EMA started from zero and divided by its weight sum (a causal warm-up)."""
    weight = 1.0 - (1.0 - alpha) ** np.arange(1, x.shape[0] + 1)
    return ema(x, alpha) / weight


def _safe_div(num: np.ndarray, den: np.ndarray, tiny: float = 1e-12) -> np.ndarray:
    ok = np.abs(den) > tiny
    return np.where(ok, num / np.where(ok, den, 1.0), 0.0)


# ---------------------------------------------------------------- the schema
def compute_features(
    raw: RawBars, *, high: np.ndarray | None = None, low: np.ndarray | None = None
) -> np.ndarray:
    """Raw (unscaled) features ``float32[T, 50]`` of the bars in ``raw``.

    Args:
        raw: bar arrays (``MarketData`` or any object with its array fields and ``tick_size``).
        high, low: per-bar high and low prices when known (OHLCV bars); otherwise the mid
            stands in for both in ``range_pos_32`` and ``hl_range_8``.

    Returns:
        float32 ``[T, 50]``; row ``t`` depends only on bars ``0..t``; account block zero.
    """
    mid = np.asarray(raw.mid, dtype=np.float64)
    t_len = mid.shape[0]
    out = np.zeros((t_len, STATE_DIM), dtype=np.float64)
    if t_len == 0:
        return out.astype(np.float32)
    tick = float(raw.tick_size)
    hi = mid if high is None else np.asarray(high, dtype=np.float64)
    lo = mid if low is None else np.asarray(low, dtype=np.float64)
    bid = np.asarray(raw.bid, dtype=np.float64)
    ask = np.asarray(raw.ask, dtype=np.float64)
    bsz = np.asarray(raw.bid_size, dtype=np.float64)
    asz = np.asarray(raw.ask_size, dtype=np.float64)
    vol = np.asarray(raw.trade_volume, dtype=np.float64)
    cnt = np.asarray(raw.trade_count, dtype=np.float64)
    sv = np.asarray(raw.signed_volume, dtype=np.float64)
    ofi = np.asarray(raw.ofi, dtype=np.float64)

    def put(name: str, values: np.ndarray) -> None:
        out[:, INDEX[name]] = values

    m = np.log(mid)
    r = np.zeros(t_len)
    r[1:] = np.diff(m)
    sigma_raw = np.sqrt(_ema_debiased(r * r, LONG_ALPHA))
    sigma = np.maximum(sigma_raw, EPS_VOL)

    # 0..6 returns over k bars in volatility units
    for k in (1, 2, 4, 8, 16, 32, 64):
        put(f"ret_{k}", (m - _lag(m, k)) / (sigma * np.sqrt(k)))
    # 7..10 realized volatility relative to the long-run level (logs)
    std = {w: _rstd(r, w) for w in (8, 32, 128)}
    for w in (8, 32, 128):
        put(f"vol_{w}", np.log((std[w] + EPS_VOL) / (sigma_raw + EPS_VOL)))
    put("vol_ratio_8_128", np.log((std[8] + EPS_VOL) / (std[128] + EPS_VOL)))
    # 11..14 distance from moving averages of the log mid
    sma = {w: _rmean(m - m[0], w) + m[0] for w in (8, 32, 64, 128)}
    for w in (8, 32, 128):
        put(f"ma_dev_{w}", (m - sma[w]) / (sigma * np.sqrt(w)))
    put("ma_cross_8_32", (sma[8] - sma[32]) / (sigma * np.sqrt(32)))
    # 15..17 oscillators
    gain = ema(np.maximum(r, 0.0), RSI_ALPHA)
    loss = ema(np.maximum(-r, 0.0), RSI_ALPHA)
    put("rsi_14", _safe_div(gain - loss, gain + loss, 1e-15))  # (RSI - 50) / 50
    hi32, lo32 = _rmax(hi, 32), _rmin(lo, 32)
    put("range_pos_32", _safe_div(2.0 * (mid - lo32), hi32 - lo32) - (hi32 > lo32))
    put("zscore_64", _safe_div(m - sma[64], _rstd(m, 64), 1e-12))
    # 18..21 volume
    put("volume_z_32", _safe_div(vol - _rmean(vol, 32), _rstd(vol, 32), 1e-9))
    put("volume_ratio_8_32", np.log((_rmean(vol, 8) + 1e-9) / (_rmean(vol, 32) + 1e-9)))
    vsum8 = _rsum(vol, 8)
    put("signed_volume_8", _safe_div(_rsum(sv, 8), vsum8, 1e-9))
    vsum32 = _rsum(vol, 32)
    vwap = np.where(vsum32 > 1e-9, _safe_div(_rsum(vol * mid, 32), vsum32, 1e-9), mid)
    put("vwap_dev_32", (m - np.log(vwap)) / (sigma * np.sqrt(32)))
    # 22..27 order-flow imbalance history (depth-normalized)
    depth = np.maximum(0.5 * (bsz + asz), 1e-9)
    n = ofi / depth
    for k in (4, 16, 64):
        put(f"ofi_sum_{k}", _rsum(n, k) / np.sqrt(k))
    fast, slow = ema(n, OFI_FAST), ema(n, OFI_SLOW)
    put("ofi_ema_fast", fast)
    put("ofi_ema_slow", slow)
    put("ofi_trend", fast - slow)
    # 28..31 trade flow and book averages
    put("trade_sign_imb_16", _rmean(np.sign(sv), 16))
    put("trade_count_z_32", _safe_div(cnt - _rmean(cnt, 32), _rstd(cnt, 32), 1e-9))
    spread = (ask - bid) / tick
    put("spread_mean_32", _rmean(spread, 32))
    put("depth_mean_32", np.log(_rmean(depth, 32) / _ema_debiased(depth, LONG_ALPHA)))
    # 32..37 shape of the recent path
    put("drawdown_64", (m - _rmax(m, 64)) / (sigma * 8.0))
    put("runup_64", (m - _rmin(m, 64)) / (sigma * 8.0))
    put("upside_vol_32", np.sqrt(_rmean(np.maximum(r, 0.0) ** 2, 32)) / sigma)
    put("downside_vol_32", np.sqrt(_rmean(np.minimum(r, 0.0) ** 2, 32)) / sigma)
    m1, m2, m3 = _rmean(r, 64), _rmean(r**2, 64), _rmean(r**3, 64)
    var = np.maximum(m2 - m1 * m1, 0.0)
    skew = _safe_div(m3 - 3.0 * m1 * m2 + 2.0 * m1**3, var**1.5, 1e-30)
    put("ret_skew_64", np.where(var > EPS_VOL**2, np.clip(skew, -SKEW_CLIP, SKEW_CLIP), 0.0))
    put("hl_range_8", np.log(_rmax(hi, 8) / _rmin(lo, 8)) / (sigma * np.sqrt(8)))
    # 42..49 microstructure block
    put("bid_ask_spread", spread)
    put("l1_depth_imbalance", _safe_div(bsz - asz, bsz + asz, 1e-9))
    put("queue_pressure", np.log1p(vol / depth))
    put("spread_velocity", spread - _lag(spread, 1))
    put("depth_change_rate", np.log((depth + 1.0) / (_lag(depth, 1) + 1.0)))
    put("trade_arrival_rate", np.log((cnt + 1.0) / (_ema_debiased(cnt, RATE_ALPHA) + 1.0)))
    put("ofi", n)
    micro = np.where(bsz + asz > 0, _safe_div(bid * asz + ask * bsz, bsz + asz, 1e-9), mid)
    put("microprice_dev", (micro - mid) / tick)

    bad = ~np.isfinite(out).all(axis=0)
    if bad.any():
        names = [FEATURE_NAMES[i] for i in np.flatnonzero(bad)]
        raise ValueError(f"non-finite feature values in {names}: check the raw bars")
    return out.astype(np.float32)


@dataclass
class FeatureScaler:
    """Per-feature standardization ``clip((x - mean) / std, -clip, clip)``.

    Fitted on the training split only. Constant columns get ``std = 1``; the account block
    keeps ``mean = 0, std = 1`` so the environment's values pass through unchanged.
    """

    mean: np.ndarray
    std: np.ndarray
    clip: float = 5.0

    @classmethod
    def fit(cls, features: np.ndarray, clip: float = 5.0) -> FeatureScaler:
        x = np.asarray(features, dtype=np.float64)
        if x.ndim != 2 or x.shape[1] != STATE_DIM or x.shape[0] == 0:
            raise ValueError(f"FeatureScaler.fit needs a non-empty [T, {STATE_DIM}] array")
        mean = x.mean(axis=0)
        std = x.std(axis=0)
        std = np.where(std > 1e-8, std, 1.0)
        a, b = ACCOUNT_BLOCK
        mean[a:b], std[a:b] = 0.0, 1.0
        return cls(mean=mean, std=std, clip=float(clip))

    def transform(self, features: np.ndarray) -> np.ndarray:
        """Scaled float32 copy of ``features`` (account block untouched)."""
        x = (np.asarray(features, dtype=np.float64) - self.mean) / self.std
        x = np.clip(x, -self.clip, self.clip)
        a, b = ACCOUNT_BLOCK
        x[:, a:b] = np.asarray(features, dtype=np.float64)[:, a:b]
        return x.astype(np.float32)

    def to_dict(self) -> dict[str, object]:
        """JSON-able form (for checkpoints and run records)."""
        return {"mean": self.mean.tolist(), "std": self.std.tolist(), "clip": self.clip}

    @classmethod
    def from_dict(cls, d: dict[str, object]) -> FeatureScaler:
        return cls(
            mean=np.asarray(d["mean"], dtype=np.float64),
            std=np.asarray(d["std"], dtype=np.float64),
            clip=float(d["clip"]),  # type: ignore[arg-type]
        )
