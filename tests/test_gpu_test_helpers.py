"""The GPU parity tests' shared helpers, on NumPy arrays (they must work without CuPy)."""

import math

import numpy as np

from foxhunt_core.testing.gpu import fresh_rng, host_relative_error


def test_fresh_rng_records_its_seed_and_replays(request):
    g = fresh_rng(request)
    name, seed = request.node.user_properties[-1]
    assert name == "seed"
    np.testing.assert_array_equal(g.normal(size=5), np.random.default_rng(seed).normal(size=5))


def test_host_relative_error_is_the_norm_ratio_and_fails_on_nan():
    ref = np.array([3.0, 4.0])
    assert host_relative_error(ref, ref) == 0.0
    assert math.isclose(host_relative_error(ref + np.array([0.0, 0.5]), ref), 0.1)
    assert not host_relative_error(np.array([np.nan, 4.0]), ref) < 1.0
