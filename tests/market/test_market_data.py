"""MarketData: shape validation and view-like slicing."""

import numpy as np
import pytest

from foxhunt_core.market.data import ARRAY_FIELDS, MarketData


def _arrays(n: int) -> dict:
    mid = 100.0 + np.arange(n) * 0.01
    return dict(
        timestamp=np.arange(n, dtype=np.int64), mid=mid, bid=mid - 0.005, ask=mid + 0.005,
        bid_size=np.full(n, 10.0), ask_size=np.full(n, 12.0), trade_volume=np.ones(n),
        trade_count=np.ones(n), signed_volume=np.zeros(n), ofi=np.zeros(n),
        regime=np.full(n, -1), features=np.zeros((n, 50)), tick_size=0.01, source="test",
    )


def test_dtypes_are_normalized():
    d = MarketData(**_arrays(5))
    assert d.timestamp.dtype == np.int64 and d.regime.dtype == np.int8
    assert d.features.dtype == np.float32 and d.mid.dtype == np.float64
    assert len(d) == 5 and not d.scaled


@pytest.mark.parametrize("field", ["mid", "ask_size", "ofi", "regime"])
def test_length_mismatch_names_the_field(field):
    kw = _arrays(5)
    kw[field] = kw[field][:4]
    with pytest.raises(ValueError, match=field):
        MarketData(**kw)


def test_features_shape_and_tick_are_checked():
    kw = _arrays(5)
    kw["features"] = np.zeros((5, 49))
    with pytest.raises(ValueError, match="features"):
        MarketData(**kw)
    kw = _arrays(5)
    kw["tick_size"] = 0.0
    with pytest.raises(ValueError, match="tick_size"):
        MarketData(**kw)


def test_slice_is_a_view():
    d = MarketData(**_arrays(10))
    s = d.slice(2, 7)
    assert len(s) == 5 and s.source == "test" and s.tick_size == 0.01
    for name in ARRAY_FIELDS:
        assert np.shares_memory(getattr(s, name), getattr(d, name))
    assert np.shares_memory(s.features, d.features)
    np.testing.assert_array_equal(s.mid, d.mid[2:7])
    with pytest.raises(ValueError):
        d.slice(3, 11)


def test_replace_rejects_unknown_fields():
    d = MarketData(**_arrays(3))
    assert d.replace(source="x").source == "x"
    with pytest.raises(ValueError, match="nope"):
        d.replace(nope=1)
