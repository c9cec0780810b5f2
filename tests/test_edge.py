"""The block-bootstrap edge test (foxhunt_core.edge): exact resample sizes, calibration on series
without edge, power on series with one, and what blocks do for a persistent series."""

import numpy as np
import pytest

from foxhunt_core.edge import bootstrap_totals, default_block, edge_bounds, lower_bound


def _ar1(rng, n, phi, mean=0.0):
    e = rng.standard_normal(n)
    x = np.empty(n)
    v = 0.0
    for i in range(n):
        v = phi * v + e[i]
        x[i] = v
    return x + mean


@pytest.mark.parametrize("n, block", [(10, 3), (11, 4), (500, 8), (7, 7), (5, 9)])
def test_every_resample_has_exactly_n_bars(n, block):
    totals = bootstrap_totals(np.ones(n), block, resamples=50)
    assert totals.shape == (50,) and np.all(totals == n)


def test_one_block_of_the_whole_series_is_a_rotation():
    x = np.random.default_rng(0).standard_normal(40)
    assert np.allclose(bootstrap_totals(x, 40, resamples=20), x.sum())


def test_resamples_are_blocks_of_consecutive_bars():
    """With a series 0, 1, ..., n-1 (mod n wrapping), a two-block resample's total identifies
    its blocks: each is a run of consecutive bars around the circle."""
    n, b = 12, 6
    x = np.arange(n, dtype=float)
    block_sums = {sum(x[(s + i) % n] for i in range(b)) for s in range(n)}
    pair_sums = {a + c for a in block_sums for c in block_sums}
    assert set(bootstrap_totals(x, b, resamples=200)) <= pair_sums


def test_the_bound_is_a_function_of_the_series():
    x = np.random.default_rng(1).standard_normal(300) + 0.1
    assert lower_bound(x, 0.95) == lower_bound(x.copy(), 0.95)
    assert lower_bound(x, 0.99) < lower_bound(x, 0.95) < lower_bound(x, 0.6) < x.sum()


def test_default_block():
    assert [default_block(n) for n in (0, 1, 8, 500, 6000)] == [1, 1, 2, 8, 18]


def test_no_edge_is_found_about_as_often_as_the_confidence_allows():
    """200 series of 500 iid bars with mean 0: the 95 % bound is above 0 in about 5 % of them."""
    rng = np.random.default_rng(2)
    found = np.mean([lower_bound(rng.standard_normal(500), 0.95) > 0 for _ in range(200)])
    assert 0.01 <= found <= 0.10, found


def test_a_real_edge_is_found():
    """Mean 0.2 per bar at unit noise over 500 bars (t about 4.5): found in nearly every series."""
    rng = np.random.default_rng(3)
    found = np.mean([lower_bound(rng.standard_normal(500) + 0.2, 0.95) > 0 for _ in range(50)])
    assert found >= 0.96, found


def test_blocks_widen_the_bound_of_a_persistent_series():
    """AR(1) with phi 0.9 and mean 0: resampling bars one by one (block 1) ignores the dependence
    and finds an edge in a third of the series; the default blocks cut that by half or more."""
    rng = np.random.default_rng(4)
    series = [_ar1(rng, 1000, 0.9) for _ in range(150)]
    iid = np.mean([lower_bound(x, 0.95, block=1) > 0 for x in series])
    blocked = np.mean([lower_bound(x, 0.95) > 0 for x in series])
    assert iid > 0.25 and blocked < 0.6 * iid, (iid, blocked)


def test_edge_bounds_compare_bar_by_bar():
    rng = np.random.default_rng(5)
    ref = rng.standard_normal(400)
    pnl = ref + 0.05 * rng.standard_normal(400) + 0.02  # the reference plus a small, steady edge
    b = edge_bounds(pnl, {"flat": np.zeros(400), "ref": ref}, 0.95)
    assert b["flat"] == lower_bound(pnl, 0.95)
    assert b["ref"] == lower_bound(pnl - ref, 0.95) and b["ref"] > 0 > b["flat"]
    with pytest.raises(ValueError, match="reference 'short' has 3 bars, the policy 400"):
        edge_bounds(pnl, {"short": np.zeros(3)}, 0.95)
