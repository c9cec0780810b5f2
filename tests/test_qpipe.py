"""Expected Q from atoms, the Q-statistics record and greedy per-branch selection."""

from __future__ import annotations

import math

import numpy as np
import pytest

from foxhunt_core.qpipe import QOut, branch_argmax, expected_q, q_statistics

OFFSETS = (0, 3, 5, 7, 9)


def test_expected_q_and_variance_match_loop():
    rng = np.random.default_rng(0)
    B, A, N = 3, 4, 7
    probs = rng.random((B, A, N))
    probs /= probs.sum(-1, keepdims=True)
    z = np.linspace(-2.0, 4.0, N)
    q, var = expected_q(probs, z)
    assert q.shape == var.shape == (B, A)
    for b in range(B):
        for a in range(A):
            mean = sum(probs[b, a, j] * z[j] for j in range(N))
            v = sum(probs[b, a, j] * (z[j] - mean) ** 2 for j in range(N))
            assert q[b, a] == pytest.approx(mean, rel=1e-12)
            assert var[b, a] == pytest.approx(v, rel=1e-10)


def test_variance_of_point_mass_is_zero_not_negative():
    z = np.linspace(-10, 10, 51, dtype=np.float32)
    probs = np.zeros((2, 3, 51), np.float32)
    probs[..., 37] = 1.0
    q, var = expected_q(probs, z)
    np.testing.assert_allclose(q, z[37])
    assert (var >= 0).all() and np.abs(var).max() < 1e-3


def _out(q_coord, q_raw=None):
    q_coord = np.asarray(q_coord, dtype=np.float64)
    q_raw = q_coord if q_raw is None else np.asarray(q_raw, dtype=np.float64)
    return QOut(q_raw=q_raw, q_var=np.zeros_like(q_coord), q_coord=q_coord)


QC = np.array(
    [
        # branch 0     | branch 1 | branch 2  | branch 3
        [1.0, 3.0, 2.0, 5.0, 5.0, -1.0, 0.5, 0.0, 4.0],
        [0.0, -2.0, 4.0, 1.0, 0.0, 2.0, 2.0, 7.0, -3.0],
    ]
)


def test_q_statistics_gaps_and_extremes():
    B, A, N = QC.shape[0], QC.shape[1], 5
    probs = np.full((B, A, N), 1.0 / N)
    s = q_statistics(_out(QC, q_raw=QC - 1.0), probs, OFFSETS, 0.1)
    # best - second best per branch, averaged over samples
    assert s["q_gap_0"] == pytest.approx(((3 - 2) + (4 - 0)) / 2)
    assert s["q_gap_1"] == pytest.approx(((5 - 5) + (1 - 0)) / 2)  # a tie gives 0
    assert s["q_gap_2"] == pytest.approx(((0.5 - -1) + (2 - 2)) / 2)
    assert s["q_gap_3"] == pytest.approx(((4 - 0) + (7 - -3)) / 2)
    assert s["avg_max_q"] == pytest.approx((3 + 5 + 0.5 + 4 + 4 + 1 + 2 + 7) / 8)
    assert s["q_min"] == -3.0 and s["q_max"] == 7.0
    assert s["q_mean"] == pytest.approx(QC.mean())
    assert s["q_var"] == pytest.approx(QC.var())
    assert s["raw_q_mean"] == pytest.approx(QC.mean() - 1.0)
    assert all(isinstance(v, float) for v in s.values())


@pytest.mark.parametrize("N", [5, 51])
def test_uniform_distributions_use_every_atom(N):
    probs = np.full((2, 9, N), 1.0 / N)
    s = q_statistics(_out(QC), probs, OFFSETS, 0.1)
    assert s["atom_utilization"] == pytest.approx(1.0)
    assert s["atom_entropy"] == pytest.approx(1.0, rel=1e-9)


@pytest.mark.parametrize("N", [5, 51])
def test_one_hot_distributions_use_one_atom(N):
    rng = np.random.default_rng(N)
    probs = np.zeros((2, 9, N))
    hot = rng.integers(0, N, size=(2, 9))
    np.put_along_axis(probs, hot[..., None], 1.0, axis=-1)
    s = q_statistics(_out(QC), probs, OFFSETS, 0.1)
    assert s["atom_utilization"] == pytest.approx(1.0 / N)
    assert s["atom_entropy"] == pytest.approx(0.0, abs=1e-12)


def test_half_mass_on_two_atoms():
    # p = (0.5, 0.5, 0, 0): utilization 2/4; entropy log 2 / log 4 = 0.5.
    probs = np.zeros((2, 9, 4))
    probs[..., :2] = 0.5
    s = q_statistics(_out(QC), probs, OFFSETS, 0.1)
    assert s["atom_utilization"] == pytest.approx(0.5)
    assert s["atom_entropy"] == pytest.approx(math.log(2) / math.log(4))


def test_atom_mass_threshold_is_relative_to_uniform():
    # N = 4, threshold 0.1 -> an atom counts from p >= 0.025.
    probs = np.tile(np.array([0.03, 0.02, 0.45, 0.5]), (2, 9, 1))
    s = q_statistics(_out(QC), probs, OFFSETS, 0.1)
    assert s["atom_utilization"] == pytest.approx(3 / 4)


def test_branch_argmax_per_branch():
    got = branch_argmax(QC, OFFSETS)
    assert got.dtype == np.int64 and got.shape == (2, 4)
    # indices are within the branch; ties go to the first maximum
    np.testing.assert_array_equal(got, [[1, 0, 1, 1], [2, 0, 0, 0]])


def test_branch_argmax_matches_loop():
    rng = np.random.default_rng(7)
    values = rng.normal(size=(16, 12))
    offsets = (0, 3, 7, 8, 12)
    got = branch_argmax(values, offsets)
    for b in range(16):
        for d in range(4):
            part = values[b, offsets[d] : offsets[d + 1]]
            assert got[b, d] == int(np.argmax(part))


class _Select:
    """Selection values = raw Q + 100 (told apart from coordinated Q at a glance)."""

    name = "shift_select"

    def __init__(self, in_evaluation: bool) -> None:
        self.in_evaluation = in_evaluation

    def select_values(self, xp, inputs):
        return inputs.q_raw + 100.0


@pytest.mark.parametrize("in_evaluation", [False, True])
def test_evaluation_uses_coordinated_q_unless_the_select_stage_says_otherwise(in_evaluation):
    from foxhunt_core.qpipe import QPipeline

    rng = np.random.default_rng(0)
    q_raw, q_coord = rng.normal(size=(4, 12)), rng.normal(size=(4, 12))
    out = QOut(q_raw, np.zeros_like(q_raw), q_coord)
    pipe = QPipeline(select=_Select(in_evaluation))
    probs, z = np.full((4, 12, 5), 0.2), np.linspace(-1, 1, 5)
    np.testing.assert_array_equal(pipe.selection_values(probs, z, out, 0.5), q_raw + 100.0)  # collection
    want = q_raw + 100.0 if in_evaluation else q_coord
    np.testing.assert_array_equal(pipe.selection_values(probs, z, out, 1.0, evaluation=True), want)
    assert pipe.selects() and pipe.selects(evaluation=True) == in_evaluation
    assert not QPipeline().selects()


def test_select_stage_must_say_whether_it_applies_in_evaluation():
    from foxhunt_core.qpipe import QPipeline

    stage = _Select(False)
    del stage.in_evaluation
    with pytest.raises(TypeError, match="'shift_select' must say in_evaluation"):
        QPipeline(select=stage)


def test_post_attention_stages_receive_var_beside_q_and_pass_slots_through():
    from foxhunt_core import attention
    from foxhunt_core.qpipe import QPipeline
    from foxhunt_core.stages import PostInputs

    seen = {}

    class Probe:
        name = "probe"

        def forward(self, xp, params, inputs):
            seen["inputs"] = inputs
            return inputs.q * 2.0, None

        def backward(self, xp, params, cache, dq, grads_into=None):
            seen["slots"] = grads_into
            return dq * 2.0, {}

    rng = np.random.default_rng(3)
    probs = rng.random((4, 12, 5))
    probs /= probs.sum(-1, keepdims=True)
    z = np.linspace(-1.0, 1.0, 5)
    params = {"core": attention.init_params(12, 4, rng), "probe": {}}
    pipe = QPipeline(post=[Probe()])
    out = pipe.forward(params, probs, z, keep_cache=True)
    q, var = expected_q(probs, z)
    assert isinstance(seen["inputs"], PostInputs)
    np.testing.assert_array_equal(seen["inputs"].var, var)
    np.testing.assert_allclose(out.q_coord, 2.0 * seen["inputs"].q)
    slots = {"probe": {"w": np.zeros(3)}}
    pipe.backward(params, out, np.ones((4, 12)), grads_into=slots)
    assert seen["slots"] is slots["probe"]
    with pytest.raises(ValueError, match="read Var"):
        pipe.forward(params, None, z, q_raw=q)
