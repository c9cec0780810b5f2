"""Loaders: OHLCV and L1 files (CSV and Parquet), documented proxies, one-line DataErrors."""

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from foxhunt_core.market.loaders import DataError, _corwin_schultz, load_l1, load_ohlcv
from foxhunt_core.market.schema import INDEX

T0 = 1_704_187_800  # 2024-01-02T09:30:00Z, seconds


def _ohlcv_rows(n=60, seed=0):
    rng = np.random.default_rng(seed)
    close = 50.0 + np.round(np.cumsum(rng.normal(0, 0.05, n)), 2)
    open_ = np.concatenate([[close[0]], close[:-1]])
    high = np.maximum(open_, close) + np.round(rng.uniform(0, 0.05, n), 2)
    low = np.minimum(open_, close) - np.round(rng.uniform(0, 0.05, n), 2)
    vol = rng.integers(100, 1000, n)
    return [(T0 + 60 * i, open_[i], high[i], low[i], close[i], vol[i]) for i in range(n)]


def _write_csv(path, header, rows):
    lines = [",".join(header)] + [",".join(str(v) for v in r) for r in rows]
    path.write_text("\n".join(lines) + "\n")
    return path


OHLCV = ["timestamp", "open", "high", "low", "close", "volume"]


def test_ohlcv_csv_and_parquet_agree(tmp_path):
    rows = _ohlcv_rows()
    d = load_ohlcv(_write_csv(tmp_path / "bars.csv", OHLCV, rows))
    cols = list(zip(*rows, strict=True))
    table = pa.table({name: list(col) for name, col in zip(OHLCV, cols, strict=True)})
    pq.write_table(table, tmp_path / "bars.parquet")
    p = load_ohlcv(tmp_path / "bars.parquet")
    assert len(d) == 60 and d.source == "ohlcv:bars.csv"
    np.testing.assert_array_equal(d.features, p.features)
    np.testing.assert_array_equal(d.mid, np.array(cols[4]))
    assert d.timestamp[0] == T0 * 10**9 and (d.regime == -1).all()
    assert d.tick_size == pytest.approx(0.01)
    assert (d.ask - d.bid >= d.tick_size - 1e-12).all()
    assert np.isfinite(d.features).all()
    # proxies: depth from volume (no imbalance), CLV-signed volume as OFI
    assert not d.features[:, INDEX["l1_depth_imbalance"]].any()
    _, o, h, lo, c, v = rows[5]
    clv = ((c - lo) - (h - c)) / (h - lo)
    assert d.signed_volume[5] == pytest.approx(clv * v) and d.ofi[5] == d.signed_volume[5]


def test_ohlcv_timestamps_iso_and_milliseconds(tmp_path):
    rows = _ohlcv_rows(5)
    iso = [(f"2024-01-02T09:{30 + i:02d}:00Z", *r[1:]) for i, r in enumerate(rows)]
    ms = [(r[0] * 1000, *r[1:]) for r in rows]
    sec = [(f"{r[0]}.0", *r[1:]) for r in rows]
    a = load_ohlcv(_write_csv(tmp_path / "iso.csv", OHLCV, iso))
    b = load_ohlcv(_write_csv(tmp_path / "ms.csv", OHLCV, ms))
    c = load_ohlcv(_write_csv(tmp_path / "sec.csv", OHLCV, sec))
    np.testing.assert_array_equal(a.timestamp, b.timestamp)
    np.testing.assert_array_equal(a.timestamp, c.timestamp)
    assert a.timestamp[1] - a.timestamp[0] == 60 * 10**9
    bad = [(r[0] if i != 3 else "soon", *r[1:]) for i, r in enumerate(rows)]
    with pytest.raises(DataError) as err:
        load_ohlcv(_write_csv(tmp_path / "when.csv", OHLCV, bad))
    _assert_one_line(err, "when.csv", "row 1", "'timestamp'", "epoch number among date strings")
    bad = [(iso[i][0] if i != 3 else "soon", *r[1:]) for i, r in enumerate(rows)]
    with pytest.raises(DataError) as err:
        load_ohlcv(_write_csv(tmp_path / "when.csv", OHLCV, bad))
    _assert_one_line(err, "when.csv", "row 4", "'timestamp'", "unreadable timestamp 'soon'")


def test_corwin_schultz_spread():
    # two bars with the same range and no drift: beta = 2 ln(H/L)^2, gamma = ln(H/L)^2
    high, low = np.array([101.0, 101.0]), np.array([99.0, 99.0])
    s = _corwin_schultz(high, low)
    k = 3 - 2 * np.sqrt(2)
    hl = np.log(101 / 99)
    alpha = (np.sqrt(4 * hl**2) - np.sqrt(2 * hl**2)) / k - np.sqrt(hl**2 / k)
    assert s[0] == 0.0
    assert s[1] == pytest.approx(2 * (np.exp(alpha) - 1) / (1 + np.exp(alpha)))
    # a steady trend: gamma (the two-bar range) dominates, the two-bar estimates are negative and
    # are kept for the window average (setting them to 0 first would bias the spread up)
    trend = _corwin_schultz(np.array([10.0, 11, 12]), np.array([9.0, 10, 11]))
    assert (trend[1:] < 0).all()


def test_ohlcv_spread_is_the_floored_window_average(tmp_path):
    # a trend (negative estimates) then wide flat bars (positive ones): the average of both
    rows = [(1_700_000_000 + 60 * i, 100 + i, 100.5 + i, 99.5 + i, 100 + i, 10) for i in range(6)]
    rows += [(1_700_000_000 + 60 * (6 + i), 106.0, 107.0, 105.0, 106.0, 10) for i in range(6)]
    d = load_ohlcv(_write_csv(tmp_path / "bars.csv", OHLCV, rows))
    h = np.array([r[2] for r in rows])
    lo = np.array([r[3] for r in rows])
    c = np.array([r[4] for r in rows])
    cs = _corwin_schultz(h, lo)
    window = np.minimum(np.arange(1, len(rows) + 1), 20)
    expect = np.maximum(np.maximum(np.cumsum(cs) / window, 0.0) * c, d.tick_size)
    np.testing.assert_allclose(d.ask - d.bid, expect, rtol=1e-12)
    assert (cs[1:6] < 0).all() and d.ask[5] - d.bid[5] == pytest.approx(d.tick_size)


def _assert_one_line(err, *parts):
    msg = str(err.value)
    assert "\n" not in msg
    for p in parts:
        assert p in msg, (p, msg)


@pytest.mark.parametrize(
    "edit, parts",
    [
        (lambda h, r: (["timestamp", "open", "high", "low", "volume"], [x[:4] + x[5:] for x in r]),
         ["missing column 'close'"]),
        (lambda h, r: (h, r[:3] + [r[1]] + r[4:]), ["row 4 (line 5)", "'timestamp'", "monotonic"]),
        (lambda h, r: (h, r[:2] + [(*r[2][:4], "nan", r[2][5])] + r[3:]),
         ["row 3", "'close'", "NaN"]),
        (lambda h, r: (h, r[:6] + [(r[6][0], -1.0, *r[6][2:])] + r[7:]),
         ["row 7", "'open'", "non-positive price"]),
        (lambda h, r: (h, r[:1] + [(*r[1][:5], "lots")] + r[2:]),
         ["row 2", "'volume'", "not a number: 'lots'"]),
        (lambda h, r: (h, r[:1] + [(*r[1][:5], "")] + r[2:]), ["row 2", "'volume'", "missing"]),
        (lambda h, r: (h, []), ["no data rows"]),
        (lambda h, r: (h, r[:2] + [r[2][:3]] + r[3:]), ["row 3", "expected 6 fields, found 3"]),
    ],
    ids=["missing-column", "non-monotonic", "nan", "non-positive", "not-a-number", "empty-cell",
         "header-only", "ragged"],
)
def test_malformed_ohlcv_csv(tmp_path, edit, parts):
    header, rows = edit(OHLCV, _ohlcv_rows(10))
    path = _write_csv(tmp_path / "bad.csv", header, rows)
    with pytest.raises(DataError) as err:
        load_ohlcv(path)
    _assert_one_line(err, "bad.csv", *parts)


def test_empty_and_unreadable_files(tmp_path):
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    with pytest.raises(DataError) as err:
        load_ohlcv(empty)
    _assert_one_line(err, "empty.csv", "empty file")
    with pytest.raises(DataError) as err:
        load_ohlcv(tmp_path / "absent.csv")
    _assert_one_line(err, "absent.csv", "cannot read")
    garbage = tmp_path / "garbage.parquet"
    garbage.write_bytes(b"\x00\x01 not a parquet file")
    with pytest.raises(DataError) as err:
        load_ohlcv(garbage)
    _assert_one_line(err, "garbage.parquet", "cannot read")
    binary = tmp_path / "binary.csv"
    binary.write_bytes(b"\xff\xfe\xfa" * 10)
    with pytest.raises(DataError) as err:
        load_ohlcv(binary)
    _assert_one_line(err, "binary.csv", "cannot read")
    assert isinstance(err.value, ValueError)


def test_parquet_nulls_are_reported(tmp_path):
    rows = _ohlcv_rows(6)
    cols = {name: list(col) for name, col in zip(OHLCV, zip(*rows, strict=True), strict=True)}
    cols["high"][4] = None
    pq.write_table(pa.table(cols), tmp_path / "nulls.parquet")
    with pytest.raises(DataError) as err:
        load_ohlcv(tmp_path / "nulls.parquet")
    _assert_one_line(err, "nulls.parquet", "row 5", "'high'")


QUOTES = ["timestamp", "bid", "ask", "bid_size", "ask_size"]
TRADES = ["timestamp", "price", "size", "side"]
S = 10**9


def test_l1_resampling_ofi_and_trade_signs(tmp_path):
    t = T0 * S
    quotes = [
        (t + 1 * S, 10.00, 10.02, 100, 200),   # bar 0
        (t + 30 * S, 10.01, 10.02, 50, 200),   # bar 0: bid up -> +50
        (t + 61 * S, 10.01, 10.02, 80, 150),   # bar 1: bid same +80-50, ask same -150+200
        (t + 185 * S, 10.00, 10.01, 70, 90),   # bar 3: bid down -80, ask down -90 (bar 2 empty)
    ]
    trades = [
        (t + 10 * S, 10.02, 5, "buy"),
        (t + 40 * S, 10.01, 3, ""),            # at the bid: Lee-Ready sell
        (t + 70 * S, 10.02, 4, ""),            # above mid 10.015: buy
        (t + 75 * S, 10.015, 2, ""),           # at the mid: tick test, price fell -> sell
        (t + 190 * S, 10.0, 7, "S"),
        (t + 400 * S, 10.0, 9, "B"),           # after the last quoted bar: dropped
    ]
    qp = _write_csv(tmp_path / "q.csv", QUOTES, quotes)
    tp = _write_csv(tmp_path / "t.csv", TRADES, trades)
    d = load_l1(qp, tp, bar_seconds=60)
    assert len(d) == 4
    assert d.timestamp[0] == t + 60 * S  # bars end on the minute
    np.testing.assert_allclose(d.bid, [10.01, 10.01, 10.01, 10.00])  # bar 2 carried forward
    np.testing.assert_allclose(d.ask_size, [200, 150, 150, 90])
    np.testing.assert_allclose(d.ofi, [50, (80 - 50) + (200 - 150), 0, -80 - 90])
    np.testing.assert_allclose(d.trade_volume, [8, 6, 0, 7])
    np.testing.assert_allclose(d.trade_count, [2, 2, 0, 1])
    np.testing.assert_allclose(d.signed_volume, [5 - 3, 4 - 2, 0, -7])
    assert d.tick_size == pytest.approx(0.01)
    assert np.isfinite(d.features).all()


def test_malformed_l1(tmp_path):
    t = T0 * S
    good_q = [(t, 10.0, 10.01, 1, 1), (t + S, 10.0, 10.01, 1, 1)]
    tp = _write_csv(tmp_path / "t.csv", TRADES, [(t, 10.0, 1, "")])
    crossed = _write_csv(tmp_path / "crossed.csv", QUOTES, [good_q[0], (t + S, 10.02, 10.01, 1, 1)])
    with pytest.raises(DataError) as err:
        load_l1(crossed, tp)
    _assert_one_line(err, "crossed.csv", "row 2", "'ask'", "crossed")
    back = _write_csv(tmp_path / "back.csv", QUOTES, [good_q[1], good_q[0]])
    with pytest.raises(DataError) as err:
        load_l1(back, tp)
    _assert_one_line(err, "back.csv", "row 2", "monotonic")
    qp = _write_csv(tmp_path / "q.csv", QUOTES, good_q)
    side = _write_csv(tmp_path / "side.csv", TRADES, [(t, 10.0, 1, "maybe")])
    with pytest.raises(DataError) as err:
        load_l1(qp, side)
    _assert_one_line(err, "side.csv", "row 1", "'side'", "maybe")
    no_size = _write_csv(tmp_path / "nosize.csv", ["timestamp", "price"], [(t, 10.0)])
    with pytest.raises(DataError) as err:
        load_l1(qp, no_size)
    _assert_one_line(err, "nosize.csv", "missing column 'size'")
