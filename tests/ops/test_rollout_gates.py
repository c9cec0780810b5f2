"""Gate semantics and the paired tests across seeds, on hand-made trial results."""

from __future__ import annotations

import math

import pytest

from foxhunt_ops.gates import evaluate_gate, failure_notes
from foxhunt_ops.plan import Gate
from foxhunt_ops.stats import sign_test_less, wilcoxon_less


def res(**final: float | str | None) -> dict:
    return {"final": final}


def by_seed(metric: str, values: list[float | str | None]) -> dict[int, dict | None]:
    return {s: res(**{metric: v}) for s, v in enumerate(values)}


@pytest.mark.parametrize(
    "x, p",
    [([-1, -2, -3], 0.125), ([-1, -2, 3], 0.5), ([1, 2, 3], 1.0), ([0, 0, -1], 0.5), ([], 1.0),
     ([-1] * 5, 1 / 32)],
)
def test_sign_test_is_the_exact_binomial_tail(x, p):
    assert sign_test_less(x) == pytest.approx(p)


@pytest.mark.parametrize(
    "x, p",
    [([-1, -2, -3], 0.125), ([1, -2, -3], 0.25), ([-1, -1, 2], 0.625), ([-1] * 5, 1 / 32), ([3, 2, 1], 1.0)],
)
def test_wilcoxon_signed_rank_is_exact_with_averaged_ties(x, p):
    assert wilcoxon_less(x) == pytest.approx(p)


def test_wilcoxon_normal_approximation_agrees_with_the_exact_count():
    x = [(-1) ** i * (i + 1) - 3 for i in range(16)]
    assert wilcoxon_less(x, exact_up_to=0) == pytest.approx(wilcoxon_less(x), abs=0.02)


def test_absolute_all_names_the_worst_seed():
    g = Gate(name="drift", metric="raw_q_drift", aggregate="all", min=-0.1, max=0.1)
    v = evaluate_gate(g, by_seed("raw_q_drift", [0.05, -0.2, 0.09]), None)
    assert v.verdict == "fail" and v.value == -0.2 and v.blocking
    assert "(seed 1)" in v.reason and "outside" in v.reason
    assert evaluate_gate(g, by_seed("raw_q_drift", [0.05, -0.02]), None).verdict == "pass"


def test_comparisons_pair_by_seed_and_are_skipped_without_a_good_stage():
    g = Gate(name="ret", metric="eval_return", compare="difference", min=-0.1, test="sign")
    cur = {0: res(eval_return=1.0), 1: res(eval_return=2.0), 5: res(eval_return=9.0)}
    prev = {0: res(eval_return=1.5), 1: res(eval_return=1.0)}
    v = evaluate_gate(g, cur, prev)
    assert v.per_seed == {"0": -0.5, "1": 1.0} and v.value == pytest.approx(0.25) and v.verdict == "pass"
    assert v.p_value == pytest.approx(0.75)  # one of two seeds worse
    skipped = evaluate_gate(g, cur, None)
    assert skipped.verdict == "skip" and "no good stage" in skipped.reason


def test_ratio_gate():
    g = Gate(name="tp", metric="updates_per_second", compare="ratio", aggregate="median", min=0.85)
    v = evaluate_gate(g, by_seed("updates_per_second", [80, 90, 70]), by_seed("updates_per_second", [100] * 3))
    assert v.value == pytest.approx(0.8) and v.verdict == "fail" and v.volatile


def test_missing_data_fails_by_default_or_is_ignored():
    g = Gate(name="u", metric="atom_utilization", min=0.5)
    cur = {0: res(atom_utilization=0.7), 1: None}
    v = evaluate_gate(g, cur, None, {1: "trial failed: exit 1: boom"})
    assert v.verdict == "fail" and "no data for seed(s) 1 (trial failed: exit 1: boom)" in v.reason
    v = evaluate_gate(g.model_copy(update={"on_no_data": "ignore"}), cur, None)
    assert v.verdict == "pass" and v.value == 0.7
    v = evaluate_gate(g.model_copy(update={"on_no_data": "ignore"}), {0: None}, None)
    assert v.verdict == "skip"


def test_nan_fails_by_default_or_is_ignored():
    g = Gate(name="d", metric="raw_q_drift", aggregate="all", min=-0.1, max=0.1)
    cur = by_seed("raw_q_drift", [0.0, "NaN"])
    v = evaluate_gate(g, cur, None)
    assert v.verdict == "fail" and "NaN/Inf for seed(s) 1" in v.reason and math.isnan(v.per_seed["1"])
    assert evaluate_gate(g.model_copy(update={"on_nan": "ignore"}), cur, None).verdict == "pass"


def test_alpha_blocks_only_significant_losses():
    g = Gate(name="ret", metric="eval_return", compare="difference", min=-0.01, test="sign", alpha=0.05)
    prev = by_seed("eval_return", [0.0] * 5)
    three = evaluate_gate(g, by_seed("eval_return", [-0.1] * 3), prev)
    assert three.verdict == "pass" and three.p_value == pytest.approx(0.125) and "not significant" in three.reason
    five = evaluate_gate(g, by_seed("eval_return", [-0.1] * 5), prev)
    assert five.verdict == "fail" and five.p_value == pytest.approx(1 / 32)


def test_a_dry_run_gate_fails_without_blocking():
    g = Gate(name="finite", metric="non_finite", aggregate="max", max=0, dry_run=True)
    cur = by_seed("non_finite", [0, 12])
    cur[1]["non_finite_fields"] = ["metrics.q_mean", "metrics.q_min", "params.core/w1"]
    v = evaluate_gate(g, cur, None, failure_notes(cur, {}))
    assert v.verdict == "fail" and not v.blocking
    assert "seed 1: non-finite in metrics (q_mean, q_min); params (core/w1)" in v.reason
    assert v.to_json()["per_seed"] == {"0": 0, "1": 12}
