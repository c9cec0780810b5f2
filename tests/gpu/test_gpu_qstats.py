"""Parity of qstats.cu (all Q-statistics in one multi-block reduction) with qpipe.q_statistics.

Tolerance: ``||out - ref|| / ||ref|| < 1e-6`` over the whole record and 1e-5 relative (1e-7
absolute) per entry: the kernel accumulates in float64 from float32 inputs.
"""

from __future__ import annotations

import numpy as np
import pytest
from gpu_parity import assert_close, host64, to_dev

from foxhunt_core.gpu import kernels as K
from foxhunt_core.gpu import reference as R
from foxhunt_core.gpu.qkernels import q_stats_record
from foxhunt_core.net import layers as L

pytestmark = pytest.mark.gpu


def _inputs(rng, B, A, N):
    # Per-row temperatures: some rows nearly uniform, some peaked (atoms below the threshold).
    temp = rng.uniform(0.2, 4.0, (B, A, 1))
    probs = L.softmax(rng.normal(0, 1.0, (B, A, N)) * temp).astype(np.float32)
    q_coord = rng.normal(0.3, 2.0, (B, A)).astype(np.float32)
    q_raw = rng.normal(-0.2, 1.0, (B, A)).astype(np.float32)
    return q_coord, q_raw, probs


@pytest.mark.parametrize(
    "B,N,offsets,threshold",
    [(999, 51, (0, 3, 6, 9, 12), 0.1), (70000, 51, (0, 3, 6, 9, 12), 0.5), (64, 21, (0, 2, 5, 7), 0.3)],
)
def test_q_stats_reduce_matches_q_statistics(cp, rng, B, N, offsets, threshold):
    q_coord, q_raw, probs = _inputs(rng, B, offsets[-1], N)
    D = len(offsets) - 1
    out = cp.full(8 + D, np.nan, cp.float64)
    K.q_stats_reduce(to_dev(cp, q_coord), to_dev(cp, q_raw), to_dev(cp, probs), offsets, threshold, out=out)
    ref = R.q_stats(host64(q_coord), host64(q_raw), host64(probs), offsets, threshold)
    assert_close("record", out, ref, 1e-6)
    np.testing.assert_allclose(host64(out), ref, rtol=1e-5, atol=1e-7)


def test_q_stats_ties_give_zero_gap_and_record_names(cp):
    B, N, offsets = 40, 51, (0, 3, 6, 9, 12)
    q = np.ones((B, 12), np.float32)
    q[:, 3] = 2.0  # branch 1: a clear best ...
    q[:, 4] = 0.5  # ... whose gap to the second best is 1
    probs = np.full((B, 12, N), 1.0 / N, np.float32)
    out = K.q_stats_reduce(to_dev(cp, q), to_dev(cp, q), to_dev(cp, probs), offsets, 0.1)
    rec = q_stats_record(out, 4)
    assert list(rec)[:3] == ["q_min", "q_max", "q_mean"] and list(rec)[-1] == "avg_max_q"
    assert rec["q_gap_0"] == 0.0 and rec["q_gap_1"] == pytest.approx(1.0)
    assert rec["atom_utilization"] == pytest.approx(1.0) and rec["atom_entropy"] == pytest.approx(1.0, abs=1e-6)


def test_q_stats_reduce_is_deterministic(cp, rng):
    q_coord, q_raw, probs = (to_dev(cp, a) for a in _inputs(rng, 50000, 12, 51))
    a = K.q_stats_reduce(q_coord, q_raw, probs, (0, 3, 6, 9, 12), 0.1).get()
    b = K.q_stats_reduce(q_coord, q_raw, probs, (0, 3, 6, 9, 12), 0.1).get()
    assert np.array_equal(a, b)


def test_q_stats_reduce_needs_two_actions_per_branch(cp):
    z = cp.zeros((4, 12), cp.float32)
    with pytest.raises(ValueError, match="q_stats_reduce: offsets"):
        K.q_stats_reduce(z, z, cp.zeros((4, 12, 51), cp.float32), (0, 1, 6, 9, 12), 0.1)
