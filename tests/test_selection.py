"""Model selection on the validation split: the best parameters are kept, saved, deployed; the
verdict when nothing beats flat; select.fallback: flat."""

import numpy as np
import pytest
from test_trainer import tiny

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
