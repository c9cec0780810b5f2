"""Model selection on the validation split: the best parameters are kept, saved, deployed; the
verdict when nothing beats flat; select.fallback: flat."""

import json

import numpy as np
import pytest
from test_trainer import tiny

from foxhunt_core.edge import edge_bounds
from foxhunt_core.evaluate import baseline_policies, walk
from foxhunt_core.plugins import PluginSet
from foxhunt_core.selection import NO_EDGE, Selection
from foxhunt_core.trainer import CHECKPOINT, Trainer


def test_selection_keeps_the_best_and_says_so():
    s = Selection(every=10, fallback="none")
    copies = []
    for step, ret in ((10, -0.2), (20, 0.1), (30, 0.05)):
        s.offer(step, {"total_return": ret, "sharpe": 0.0}, lambda st=step: copies.append(st) or st)
    assert s.best_step == 20 and s.best_return == 0.1 and s.params == 20 and copies == [10, 20]
    assert s.edge and NO_EDGE not in s.verdict() and "update 20" in s.verdict()
    low = Selection(every=10, fallback="flat")
    low.offer(10, {"total_return": 0.0}, lambda: "p")
    assert low.edge is False and low.deploys_flat and low.verdict().startswith(NO_EDGE)
    assert "deployed policy is flat" in low.verdict()
    assert Selection(every=0, fallback="flat").verdict().startswith("no selection")


def test_a_bootstrap_bound_at_or_below_zero_is_no_edge():
    s = Selection(every=10, fallback="flat", edge_test="bootstrap", confidence=0.95)
    s.offer(10, {"total_return": 0.3}, lambda: "p", {"flat": 0.05, "buy_and_hold": -0.01})
    assert s.edge is False and s.deploys_flat  # above flat, but not surely above buy-and-hold
    assert s.verdict().startswith(NO_EDGE)
    assert "95% lower bound of the return over flat +0.0500, buy_and_hold -0.0100" in s.verdict()
    s.offer(20, {"total_return": 0.4}, lambda: "q", {"flat": 0.05, "buy_and_hold": 0.01})
    assert s.edge and not s.deploys_flat and s.params == "q" and NO_EDGE not in s.verdict()
    s.offer(30, {"total_return": 0.1}, lambda: "r", {"flat": -1.0, "buy_and_hold": -1.0})
    assert s.edge and s.best_bounds == {"flat": 0.05, "buy_and_hold": 0.01}  # the best's bounds, kept
    assert [h["lower_over_buy_and_hold"] for h in s.history] == [-0.01, 0.01, -1.0]
    again = Selection(every=10, fallback="flat", edge_test="bootstrap")
    again.load(json.loads(json.dumps(s.state())), "q")
    assert again.best_bounds == s.best_bounds and again.edge and again.verdict() == s.verdict()
    # a bound above zero is not enough when the return itself does not beat flat
    neg = Selection(every=10, fallback="flat", edge_test="bootstrap")
    neg.offer(10, {"total_return": -0.01}, lambda: "p", {"flat": 0.01})
    assert neg.edge is False
    # the return test ignores the bounds
    ret = Selection(every=10, fallback="flat", edge_test="return")
    ret.offer(10, {"total_return": 0.3}, lambda: "p", {"flat": -0.1})
    assert ret.edge and "lower bound" not in ret.verdict()


def _settings(steps=60, **select):
    s = tiny(steps=steps)
    return s.model_copy(update={"select": s.select.model_copy(update={"every": 20, **select})})


def test_the_deployed_policy_is_the_one_selected(tmp_path):
    tr = Trainer(_settings(), PluginSet(), tmp_path / "r")
    tr.train()
    sel = tr.selection
    assert [h["step"] for h in sel.history] == [20, 40, 60]
    assert sel.best_return == max(h["total_return"] for h in sel.history)
    # the deployed policy walks validation to exactly the selected return (not the last parameters')
    assert tr.evaluate("val")["policy"]["total_return"] == sel.best_return
    # saved and restored with the checkpoint
    again = Trainer(_settings(), PluginSet(), None)
    again.load(tmp_path / "r" / CHECKPOINT)
    assert again.selection.best_step == sel.best_step
    assert again.evaluate("test")["policy"] == tr.evaluate("test")["policy"]


def test_no_edge_falls_back_to_flat(tmp_path):
    """A market without edge and a fee of 50 bp: no policy beats flat on validation."""
    s = _settings(fallback="flat")
    s = s.model_copy(update={"market": s.market.model_copy(update={"edge_snr": 0.0}),
                             "env": s.env.model_copy(update={"taker_fee_bps": 50.0, "maker_fee_bps": 50.0})})
    tr = Trainer(s, PluginSet(), None)
    tr.train()
    assert tr.selection.edge is False and tr.selection.deploys_flat
    table = tr.evaluate("test")
    assert table["policy"] == table["flat"]
    assert tr.evaluation_notes()["selection"]["deployed"] == "flat"
    assert tr.evaluation_notes()["selection"]["verdict"].startswith("no edge found on validation")


def test_the_edge_test_compares_the_selected_policy_with_each_reference_on_validation():
    """The bounds kept are those of the deployed parameters' validation PnL over the validation PnL
    of flat, buy-and-hold, linear and momentum, bar by bar, recomputed here from scratch."""
    tr = Trainer(_settings(), PluginSet(), None)
    tr.train()
    sel = tr.selection
    rng = lambda: np.random.default_rng(tr.settings.seed + 2)  # noqa: E731 (the evaluation's fill draws)
    pnl, _ = walk(tr.splits.val, tr.source.env, tr.policy(), rng())
    pols = {**baseline_policies(np.random.default_rng(0)), **tr.baselines().policies}
    refs = {n: walk(tr.splits.val, tr.source.env, pols[n], rng())[0]
            for n in ("flat", "buy_and_hold", "linear", "momentum")}
    assert sel.best_bounds == edge_bounds(pnl, refs, 0.95)
    assert sel.edge == (sel.best_return > 0 and min(sel.best_bounds.values()) > 0)
    assert all(set(h) >= {f"lower_over_{n}" for n in refs} for h in sel.history)
    report = tr.evaluation_notes()["selection"]
    assert report["edge_test"] == "bootstrap" and report["best_bounds"] == sel.best_bounds


def test_selection_never_reads_the_test_split():
    """The same run with its test split replaced by other bars selects, bounds and decides alike."""
    a = Trainer(_settings(fallback="flat"), PluginSet(), None)
    b = Trainer(_settings(fallback="flat"), PluginSet(), None)
    b.splits.test = b.splits.train
    for tr in (a, b):
        tr.train()
    assert a.selection.report() == b.selection.report()


def test_training_time_leaves_out_validation(tmp_path, monkeypatch):
    import time

    tr = Trainer(_settings(steps=40), PluginSet(), None)
    real = tr._select

    def slow():
        time.sleep(0.5)
        return real() + 0.5

    monkeypatch.setattr(tr, "_select", slow)
    t0 = time.perf_counter()
    tr.train()
    wall = time.perf_counter() - t0
    assert len(tr.selection.history) == 2
    assert tr.train_seconds < wall - 0.9
    assert np.isfinite(tr.steady_updates_per_second)


@pytest.mark.gpu
def test_selection_on_the_gpu_deploys_the_selected_parameters(tmp_path):
    s = _settings().model_copy(update={"device": "cuda"})
    tr = Trainer(s, PluginSet(), tmp_path / "g")
    tr.train()
    assert tr.evaluate("val")["policy"]["total_return"] == pytest.approx(tr.selection.best_return, abs=1e-12)
