"""Loaders of real market data (CSV or Parquet) into :class:`MarketData` bars.

* :func:`load_ohlcv` reads bars with columns ``timestamp, open, high, low, close, volume``
  (optionally ``trades`` / ``trade_count`` / ``count``).
* :func:`load_l1` reads L1 quotes (``timestamp, bid, ask, bid_size, ask_size``) and trades
  (``timestamp, price, size``, optional ``side``) and resamples them to fixed bars.

Files ending in ``.parquet`` or ``.pq`` are read with pyarrow; anything else as CSV with a
header row. Column names are matched case-insensitively. Timestamps are ISO 8601 strings (UTC)
or epoch numbers whose unit is inferred from their magnitude (below 1e11: seconds, below 1e14:
milliseconds, below 1e17: microseconds, else nanoseconds). Bad input raises :class:`DataError`
with a one-line message naming the file, the row (data rows count from 1; for CSV the line is
given too) and column, and the problem.

Proxies for what OHLCV bars cannot show
---------------------------------------
* **mid** = close.
* **spread**: the Corwin and Schultz (2012) high-low estimator from bars ``t-1, t``::

      beta = ln(H_t/L_t)^2 + ln(H_{t-1}/L_{t-1})^2,  gamma = ln(max(H)/min(L))^2 over both bars
      alpha = (sqrt(2 beta) - sqrt(beta)) / (3 - 2 sqrt 2) - sqrt(gamma / (3 - 2 sqrt 2))
      S = 2 (e^alpha - 1) / (1 + e^alpha)   (relative spread)

  averaged over the last ``SPREAD_WINDOW`` bars (causal) *with* its negative two-bar estimates,
  then floored at zero, times the close, floored at one tick (no overnight adjustment);
  ``bid/ask = close -/+ spread / 2``. Setting each negative two-bar estimate to zero before
  averaging (the paper's other option) biases the estimate up wherever the high-low range is
  mostly volatility: on the S&P 500's daily bars 1999-2018 it gives a 14 bp half spread, far
  wider than the index's traded instruments quote; averaging first gives 1.2 bp on average
  (0 in three windows of four). Both are estimates from bars alone: a user who knows the
  instrument's spread sets ``market.half_spread_bps`` (:mod:`foxhunt_core.market.costs`).
* **signed volume and OFI**: the close-location value
  ``CLV = ((close - low) - (high - close)) / (high - low)`` (0 when ``high == low``) times the
  volume stands for both the signed trade volume and the order-flow imbalance.
* **L1 depth**: ``bid_size = ask_size`` = a causal EMA of volume (weight ``1/DEPTH_SPAN``,
  bias-corrected), so the depth imbalance and the microprice deviation are 0 for bars.
* **trade count**: the ``trades`` column if present, else the volume itself (its features are
  relative rates and z-scores, so the unit does not matter).
* **tick size**: when not given, the smallest positive difference between distinct prices in
  the file (rounded to 1e-10).

L1 resampling
-------------
Bars of ``bar_seconds`` are aligned to multiples of the bar length from the first quote's bar
to the last quote's bar; a bar's timestamp is its end. The book at a bar is the last quote at
or before its end (empty bars carry the previous quote forward). OFI sums the Cont, Kukanov and
Stoikov (2014) event contributions
``e_n = q^b_n 1{b_n >= b_{n-1}} - q^b_{n-1} 1{b_n <= b_{n-1}} - q^a_n 1{a_n <= a_{n-1}}
+ q^a_{n-1} 1{a_n >= a_{n-1}}`` of the quotes in the bar. Trades outside the quoted bars are
dropped. A trade's sign is its ``side`` when given (``b``/``buy``/``1`` or ``s``/``sell``/
``-1``; empty or ``0`` means unknown), else the Lee and Ready (1991) rule: above the prevailing
mid a buy, below a sell, at the mid the sign of the last price change (tick test).
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from foxhunt_core.market.data import MarketData
from foxhunt_core.market.features import compute_features, ema
from foxhunt_core.safeio import FileProblem, check_regular

SPREAD_WINDOW = 20
DEPTH_SPAN = 32
_BUY = {"b", "buy", "1", "+1", "1.0"}
_SELL = {"s", "sell", "-1", "-1.0"}
_UNKNOWN = {"", "0", "0.0", "n", "none", "unknown", "nan"}


class DataError(ValueError):
    """Malformed market data; the message is one line: file, row/column, problem."""


def _error(path: Path, problem: str, row: int | None = None, column: str | None = None,
           line: int | None = None) -> DataError:
    parts = [str(path)]
    if row is not None:
        parts.append(f"row {row}" + (f" (line {line})" if line is not None else ""))
    if column is not None:
        parts.append(f"column {column!r}")
    problem = " ".join(str(problem).split())
    return DataError(f"{', '.join(parts)}: {problem}")


class _Table:
    """Named columns of one file, each a list of raw values, with row-precise errors."""

    def __init__(self, path: str | Path, required: tuple[str, ...], optional: tuple[str, ...]):
        self.path = Path(path)
        self.lines: list[int] | None = None  # file line of each data row (CSV only)
        try:
            check_regular(self.path)  # a FIFO would block the reader forever, /dev/zero never end
        except FileProblem as exc:
            raise _error(self.path, str(exc)) from None
        csv_file = self.path.suffix.lower() not in (".parquet", ".pq")
        raw = self._read_csv() if csv_file else self._read_parquet()
        missing = [c for c in required if c not in raw]
        if missing:
            found = ", ".join(raw) or "none"
            raise _error(self.path, f"missing column {missing[0]!r} (found: {found})")
        self.columns = {c: raw[c] for c in (*required, *optional) if c in raw}
        self.rows = len(next(iter(self.columns.values()))) if self.columns else 0
        if self.rows == 0:
            raise _error(self.path, "no data rows")

    def error(self, problem: str, row: int | None = None, column: str | None = None) -> DataError:
        line = self.lines[row - 1] if self.lines is not None and row is not None else None
        return _error(self.path, problem, row, column, line)

    def _read_csv(self) -> dict[str, list]:
        try:
            with self.path.open(newline="", encoding="utf-8-sig") as fh:  # -sig: spreadsheets' BOM
                rows = list(csv.reader(fh))
        except (OSError, UnicodeDecodeError, csv.Error) as exc:
            raise _error(self.path, f"cannot read file: {exc}") from None
        numbered = [(i, r) for i, r in enumerate(rows, start=1) if any(c.strip() for c in r)]
        if not numbered:
            raise _error(self.path, "empty file (no header)")
        header = [h.strip().lower() for h in numbered[0][1]]
        body = numbered[1:]
        self.lines = [i for i, _ in body]
        for row, (line, r) in enumerate(body, start=1):
            if len(r) != len(header):
                raise _error(
                    self.path, f"expected {len(header)} fields, found {len(r)}", row, line=line
                )
        return {h: [r[k].strip() for _, r in body] for k, h in enumerate(header)}

    def _read_parquet(self) -> dict[str, list]:
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise _error(self.path, "reading Parquet needs pyarrow (pip install pyarrow)") from None
        try:
            table = pq.read_table(self.path)
        except Exception as exc:  # pyarrow raises several unrelated types for unreadable files
            raise _error(self.path, f"cannot read file: {exc}") from None
        out: dict[str, list] = {}
        import pyarrow as pa

        for name in table.column_names:
            col = table.column(name)
            if pa.types.is_nested(col.type) or pa.types.is_binary(col.type) or pa.types.is_large_binary(col.type):
                raise _error(self.path, f"has Parquet type {col.type}; expected one number (or timestamp) per row",
                             column=name.strip().lower())
            if pa.types.is_timestamp(col.type):
                col = col.cast(pa.timestamp("ns")).cast(pa.int64())
            out[name.strip().lower()] = col.to_pylist()
        return out

    def floats(self, column: str) -> np.ndarray:
        values = self.columns[column]
        try:
            arr = np.array([np.nan if v is None else v for v in values], dtype=np.float64)
        except (ValueError, TypeError):
            arr = None
        if arr is None:
            for i, v in enumerate(values, start=1):
                try:
                    float(v)
                except (ValueError, TypeError):
                    what = "missing value" if v in ("", None) else f"not a number: {v!r}"
                    raise self.error(what, i, column) from None
            arr = np.array([float(v) for v in values], dtype=np.float64)
        bad = np.flatnonzero(~np.isfinite(arr))
        if bad.size:
            raise self.error("missing or non-finite value (NaN/inf)", int(bad[0]) + 1, column)
        return arr

    def positive(self, column: str) -> np.ndarray:
        arr = self.floats(column)
        bad = np.flatnonzero(arr <= 0)
        if bad.size:
            raise self.error(f"non-positive price {float(arr[bad[0]])!r}", int(bad[0]) + 1, column)
        return arr

    def non_negative(self, column: str) -> np.ndarray:
        arr = self.floats(column)
        bad = np.flatnonzero(arr < 0)
        if bad.size:
            raise self.error(f"negative value {float(arr[bad[0]])!r}", int(bad[0]) + 1, column)
        return arr

    @staticmethod
    def _epoch(values: list) -> np.ndarray | None:
        """Epoch numbers to int64 ns (unit from the magnitude), or None if any is not one."""
        try:
            ints = np.array([int(v) for v in values], dtype=np.int64)
            top = float(np.abs(ints).max())
            scale = 10**9 if top < 1e11 else 10**6 if top < 1e14 else 10**3 if top < 1e17 else 1
            return ints * scale
        except (ValueError, TypeError, OverflowError):
            pass
        try:
            nums = np.array([float(v) for v in values], dtype=np.float64)
        except (ValueError, TypeError):
            return None
        if not np.isfinite(nums).all():
            return None
        top = float(np.abs(nums).max())
        scale = 1e9 if top < 1e11 else 1e6 if top < 1e14 else 1e3 if top < 1e17 else 1.0
        return np.rint(nums * scale).astype(np.int64)

    def timestamps(self, strict: bool) -> np.ndarray:
        column = "timestamp"
        values = self.columns[column]
        missing = next((i for i, v in enumerate(values, start=1) if v is None or v == ""), None)
        if missing is not None:  # before guessing the format: one gap is not "dates among numbers"
            raise self.error("missing timestamp", missing, column)
        ts = self._epoch(values)
        if ts is None:
            ts = np.empty(len(values), dtype=np.int64)
            for i, v in enumerate(values, start=1):
                if v in ("", None):
                    raise self.error("missing timestamp", i, column) from None
                text = str(v).strip().rstrip("Zz").replace("+00:00", "")
                if text.lstrip("-").replace(".", "", 1).isdigit():
                    raise self.error("epoch number among date strings", i, column)
                try:
                    ts[i - 1] = np.datetime64(text, "ns").astype(np.int64)
                except ValueError:
                    raise self.error(f"unreadable timestamp {v!r}", i, column) from None
        step = np.diff(ts)
        bad = np.flatnonzero(step <= 0 if strict else step < 0)
        if bad.size:
            row = int(bad[0]) + 2
            order = "after" if strict else "at or after"
            raise self.error(
                f"non-monotonic timestamps: not {order} the previous row", row, column
            )
        return ts


def _infer_tick(prices: np.ndarray) -> float:
    u = np.unique(np.round(prices, 10))
    d = np.diff(u)
    d = d[d > 1e-10]
    if d.size == 0:
        return float(1e-4 * np.median(prices))
    return float(np.round(d.min(), 10))


def _corwin_schultz(high: np.ndarray, low: np.ndarray) -> np.ndarray:
    """Relative spread estimate per bar from bars ``t-1, t`` (0 for the first bar; negative
    estimates are kept, for the window average of the module docstring)."""
    hl = np.log(high / low) ** 2
    beta = hl.copy()
    beta[1:] += hl[:-1]
    h2 = np.maximum(high, np.concatenate([[high[0]], high[:-1]]))
    l2 = np.minimum(low, np.concatenate([[low[0]], low[:-1]]))
    gamma = np.log(h2 / l2) ** 2
    k = 3.0 - 2.0 * np.sqrt(2.0)
    alpha = (np.sqrt(2.0 * beta) - np.sqrt(beta)) / k - np.sqrt(gamma / k)
    s = 2.0 * np.expm1(alpha) / (1.0 + np.exp(alpha))
    s[0] = 0.0
    return s


def load_ohlcv(path: str | Path, *, tick_size: float | None = None) -> MarketData:
    """Bars from an OHLCV CSV/Parquet file, with the proxies of the module docstring."""
    tab = _Table(path, ("timestamp", "open", "high", "low", "close", "volume"),
                 ("trades", "trade_count", "count"))
    ts = tab.timestamps(strict=True)
    o, h, lo, c = (tab.positive(x) for x in ("open", "high", "low", "close"))
    vol = tab.non_negative("volume")
    bad = np.flatnonzero((h < np.maximum(o, c)) | (lo > np.minimum(o, c)) | (h < lo))
    if bad.size:
        raise tab.error("high/low do not bracket open and close", int(bad[0]) + 1, "high")
    count_col = next((x for x in ("trades", "trade_count", "count") if x in tab.columns), None)
    count = tab.non_negative(count_col) if count_col else vol.copy()
    tick = float(tick_size) if tick_size else _infer_tick(np.concatenate([o, h, lo, c]))

    csum = np.cumsum(_corwin_schultz(h, lo))
    rsum = csum.copy()
    rsum[SPREAD_WINDOW:] -= csum[:-SPREAD_WINDOW]
    window = np.minimum(np.arange(1, len(c) + 1), SPREAD_WINDOW)
    spread = np.maximum(np.maximum(rsum / window, 0.0) * c, tick)
    rng_hl = h - lo
    clv = np.where(rng_hl > 0, ((c - lo) - (h - c)) / np.where(rng_hl > 0, rng_hl, 1.0), 0.0)
    signed = clv * vol
    alpha = 1.0 / DEPTH_SPAN
    depth = ema(vol, alpha) / (1.0 - (1.0 - alpha) ** np.arange(1, len(c) + 1))
    depth = np.maximum(depth, 1e-9)
    data = MarketData(
        timestamp=ts, mid=c, bid=c - spread / 2, ask=c + spread / 2,
        bid_size=depth, ask_size=depth.copy(), trade_volume=vol, trade_count=count,
        signed_volume=signed, ofi=signed.copy(), regime=np.full(len(c), -1, dtype=np.int8),
        features=np.zeros((len(c), 50), dtype=np.float32), tick_size=tick,
        source=f"ohlcv:{Path(path).name}",
    )
    data.features = compute_features(data, high=h, low=lo)
    return data


def _trade_signs(tab: _Table, price: np.ndarray, ts: np.ndarray,
                 q_ts: np.ndarray, q_mid: np.ndarray) -> np.ndarray:
    sign = np.zeros(len(price))
    if "side" in tab.columns:
        for i, v in enumerate(tab.columns["side"], start=1):
            s = "" if v is None else str(v).strip().lower()
            if s in _BUY:
                sign[i - 1] = 1.0
            elif s in _SELL:
                sign[i - 1] = -1.0
            elif s not in _UNKNOWN:
                raise tab.error(f"unknown trade side {v!r} (use buy/sell/b/s/1/-1)", i, "side")
    q_idx = np.searchsorted(q_ts, ts, side="right") - 1
    prevailing = np.where(q_idx >= 0, q_mid[np.maximum(q_idx, 0)], np.nan)
    with np.errstate(invalid="ignore"):
        quote_rule = np.where(np.isnan(prevailing), 0.0, np.sign(price - prevailing))
    tick_move = np.sign(np.diff(price, prepend=price[0]))
    last = np.maximum.accumulate(np.where(tick_move != 0, np.arange(len(price)), 0))
    tick_rule = np.where(tick_move[last] != 0, tick_move[last], 0.0)
    inferred = np.where(quote_rule != 0, quote_rule, tick_rule)
    return np.where(sign != 0, sign, inferred)


def load_l1(
    quotes_path: str | Path,
    trades_path: str | Path,
    *,
    bar_seconds: float = 60.0,
    tick_size: float | None = None,
) -> MarketData:
    """Bars of ``bar_seconds`` from L1 quotes and trades (module docstring: resampling)."""
    qt = _Table(quotes_path, ("timestamp", "bid", "ask", "bid_size", "ask_size"), ())
    q_ts = qt.timestamps(strict=False)
    bid, ask = qt.positive("bid"), qt.positive("ask")
    bad = np.flatnonzero(ask < bid)
    if bad.size:
        raise qt.error("crossed quote (ask below bid)", int(bad[0]) + 1, "ask")
    bsz, asz = qt.non_negative("bid_size"), qt.non_negative("ask_size")
    tr = _Table(trades_path, ("timestamp", "price", "size"), ("side",))
    t_ts = tr.timestamps(strict=False)
    price, size = tr.positive("price"), tr.non_negative("size")
    bar_ns = int(round(bar_seconds * 1e9))
    if bar_ns <= 0:
        raise ValueError("bar_seconds must be positive")

    origin = (q_ts[0] // bar_ns) * bar_ns
    q_bar = (q_ts - origin) // bar_ns
    n_bars = int(q_bar[-1]) + 1
    last = np.searchsorted(q_bar, np.arange(n_bars), side="right") - 1
    # Cont-Kukanov-Stoikov event contributions (the first quote has no predecessor)
    e = np.zeros(len(q_ts))
    pb, pa = bid[:-1], ask[:-1]
    e[1:] = (
        bsz[1:] * (bid[1:] >= pb) - bsz[:-1] * (bid[1:] <= pb)
        - asz[1:] * (ask[1:] <= pa) + asz[:-1] * (ask[1:] >= pa)
    )
    ofi = np.bincount(q_bar, weights=e, minlength=n_bars)

    sign = _trade_signs(tr, price, t_ts, q_ts, 0.5 * (bid + ask))
    t_bar = (t_ts - origin) // bar_ns
    keep = (t_bar >= 0) & (t_bar < n_bars)
    t_bar, size_k, sign_k = t_bar[keep], size[keep], sign[keep]
    volume = np.bincount(t_bar, weights=size_k, minlength=n_bars)
    count = np.bincount(t_bar, minlength=n_bars).astype(np.float64)
    signed = np.bincount(t_bar, weights=size_k * sign_k, minlength=n_bars)

    b, a = bid[last], ask[last]
    tick = float(tick_size) if tick_size else _infer_tick(np.concatenate([bid, ask]))
    data = MarketData(
        timestamp=origin + bar_ns * np.arange(1, n_bars + 1, dtype=np.int64),
        mid=0.5 * (b + a), bid=b, ask=a, bid_size=bsz[last], ask_size=asz[last],
        trade_volume=volume, trade_count=count, signed_volume=signed, ofi=ofi,
        regime=np.full(n_bars, -1, dtype=np.int8),
        features=np.zeros((n_bars, 50), dtype=np.float32), tick_size=tick,
        source=f"l1:{Path(quotes_path).name}+{Path(trades_path).name}",
    )
    data.features = compute_features(data)
    return data
