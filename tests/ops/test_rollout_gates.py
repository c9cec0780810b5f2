"""Gate semantics, the three verdicts and the statistics across seeds, on hand-made trial results."""

from __future__ import annotations

import math

import numpy as np
import pytest

from foxhunt_ops.gates import analysis, evaluate, evaluate_gate, failure_notes
from foxhunt_ops.plan import DEFAULT_GATES, Gate
from foxhunt_ops.stats import BOOTSTRAP_SEED, bootstrap_interval, sign_test_less, wilcoxon_less


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


def test_wilcoxon_exact_count_by_enumerating_every_sign_pattern():
    """scipy's p-value against a direct count over all 2**n sign patterns (tied ranks averaged)."""
    import itertools

    from scipy.stats import rankdata

    rng = np.random.default_rng(5)
    for n in (4, 7, 9):
        x = np.round(rng.normal(size=n), 1)  # rounding makes ties
        x = x[x != 0]
        r = rankdata(np.abs(x))
        w_plus = r[x > 0].sum()
        hits = sum(1 for signs in itertools.product((0, 1), repeat=x.size)
                   if r[np.array(signs, dtype=bool)].sum() <= w_plus + 1e-9)
        assert wilcoxon_less(list(x)) == pytest.approx(hits / 2**x.size)


def test_the_bootstrap_interval_is_scipys_percentile_interval_and_reproducible():
    from scipy import stats

    x = [0.03, -0.01, 0.02, 0.05, -0.02]
    lo, hi = bootstrap_interval(x, "mean", 0.9)
    ref = stats.bootstrap((np.array(x),), np.mean, confidence_level=0.9, method="percentile",
                          rng=np.random.default_rng(BOOTSTRAP_SEED)).confidence_interval
    assert (lo, hi) == pytest.approx((ref.low, ref.high))
    assert min(x) <= lo < np.mean(x) < hi <= max(x)
    assert bootstrap_interval(x, "mean", 0.9) == (lo, hi)  # fixed resampling seed
    wide = bootstrap_interval(x, "mean", 0.99)
    assert wide[0] <= lo and wide[1] >= hi
    assert bootstrap_interval([1.0], "mean") is None and bootstrap_interval([2.0, 2.0], "median") == (2.0, 2.0)


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
    assert v.verdict == "fail" and "1 of 2 seed(s) fail (failure_limit 0): 1 (no data: trial failed: exit 1: boom)" \
        in v.reason
    v = evaluate_gate(g.model_copy(update={"on_no_data": "ignore"}), cur, None)
    assert v.verdict == "pass" and v.value == 0.7
    v = evaluate_gate(g.model_copy(update={"on_no_data": "ignore"}), {0: None}, None)
    assert v.verdict == "inconclusive" and "too few finite seeds: 0 of 1 (the gate needs 1)" in v.reason


def test_nan_fails_by_default_or_is_ignored():
    g = Gate(name="d", metric="raw_q_drift", aggregate="all", min=-0.1, max=0.1)
    cur = by_seed("raw_q_drift", [0.0, "NaN"])
    v = evaluate_gate(g, cur, None)
    assert v.verdict == "fail" and "fail (failure_limit 0): 1 (NaN/Inf)" in v.reason and math.isnan(v.per_seed["1"])
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


def test_failure_limit_lets_that_many_seeds_fail():
    g = Gate(name="vb", metric="value_bias", aggregate="all", min=-1, max=1)
    cur = by_seed("value_bias", [0.2, 1.7, -0.4, None])
    v = evaluate_gate(g, cur, None, {3: "trial failed: killed by signal 9"})
    assert v.verdict == "fail" and v.value == 1.7 and v.failed_seeds == {
        "1": "+1.7 outside [-1, 1]", "3": "no data: trial failed: killed by signal 9"}
    assert "2 of 4 seed(s) fail (failure_limit 0)" in v.reason
    one = evaluate_gate(g.model_copy(update={"failure_limit": 1}), cur, None)
    assert one.verdict == "fail" and "failure_limit 1" in one.reason
    two = evaluate_gate(g.model_copy(update={"failure_limit": 2}), cur, None)
    assert two.verdict == "pass" and "2 seed(s) failing within failure_limit 2" in two.reason


def test_too_few_finite_seeds_is_inconclusive():
    g = Gate(name="vb", metric="value_bias", aggregate="all", min=-1, max=1, on_no_data="ignore", min_seeds=2)
    cur = by_seed("value_bias", [0.1, None, None])
    v = evaluate_gate(g, cur, None, {1: "trial failed: exit 1"})
    assert v.verdict == "inconclusive" and v.pending and not v.blocking
    assert "too few finite seeds: 1 of 3 (the gate needs 2); left out: 1 (no data: trial failed: exit 1), " \
        "2 (no data)" in v.reason
    assert evaluate_gate(g, by_seed("value_bias", [0.1, 0.3, None]), None).verdict == "pass"


def test_an_interval_decides_three_ways():
    g = Gate(name="ret", metric="eval_return", compare="difference", aggregate="mean", min=-0.05,
             decide_by="interval", test="sign")
    prev = by_seed("eval_return", [0.0] * 5)
    better = evaluate_gate(g, by_seed("eval_return", [0.01, 0.03, -0.01, 0.02, 0.0]), prev)
    assert better.verdict == "pass" and better.interval[0] >= -0.05 and "interval inside" in better.reason
    worse = evaluate_gate(g, by_seed("eval_return", [-0.2, -0.15, -0.1, -0.3, -0.12]), prev)
    assert worse.verdict == "fail" and worse.interval[1] < -0.05 and worse.blocking
    mixed = evaluate_gate(g, by_seed("eval_return", [0.05, -0.2, 0.02, -0.15, 0.01]), prev)
    assert mixed.verdict == "inconclusive" and mixed.interval[0] < -0.05 < mixed.interval[1]
    assert "interval straddles the bound" in mixed.reason and mixed.p_value is not None
    one = evaluate_gate(g, {0: res(eval_return=0.1)}, {0: res(eval_return=0.0)})
    assert one.verdict == "inconclusive" and "the gate needs 2" in one.reason


def test_every_mean_or_median_gate_reports_its_interval_and_value_gates_decide_by_value():
    g = Gate(name="ret", metric="eval_return", compare="difference", aggregate="mean", min=-0.05)
    v = evaluate_gate(g, by_seed("eval_return", [0.05, -0.2, 0.02]), by_seed("eval_return", [0.0] * 3))
    assert v.verdict == "pass" and v.interval is not None and v.interval[0] < -0.05  # the point decides
    assert "90% interval [" in v.reason


def test_a_stages_analysis():
    ok = Gate(name="a", metric="loss", max=1.0)
    dry = Gate(name="b", metric="loss", max=0.1, dry_run=True)
    few = Gate(name="c", metric="loss", max=1.0, min_seeds=3)
    cur = by_seed("loss", [0.5, 0.6])
    assert analysis(evaluate([ok, dry], cur, None)) == "Successful"  # a dry-run failure never counts
    assert analysis(evaluate([ok, few], cur, None)) == "Inconclusive"
    assert analysis(evaluate([few, ok.model_copy(update={"max": 0.1})], cur, None)) == "Failed"


def test_the_default_gates_judge_value_bias_and_report_raw_drift():
    gates = {g["name"]: Gate.model_validate(g) for g in DEFAULT_GATES}
    assert gates["value_bias"].metric == "value_bias" and not gates["value_bias"].dry_run
    assert (gates["value_bias"].min, gates["value_bias"].max) == (-1.0, 1.0)
    assert gates["raw_q_drift"].dry_run
    assert gates["eval_return"].decide_by == "interval"
