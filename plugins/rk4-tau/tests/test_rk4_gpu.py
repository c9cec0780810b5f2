"""On the GPU path: xlstm_context and rk4_tau in a CUDA run (host-side hooks, device-side step)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from foxhunt_core.config import RunSettings
from foxhunt_core.plugins import discover
from foxhunt_core.trainer import CHECKPOINT, Trainer

pytestmark = pytest.mark.gpu


def tiny(steps: int) -> RunSettings:
    return RunSettings.model_validate({
        "seed": 5, "device": "cuda", "market": {"bars": 4000}, "env": {"num_envs": 64, "episode_len": 64},
        "net": {"shared_h1": 32, "shared_h2": 32, "adv_h": 24, "num_atoms": 11, "attn_dim": 4},
        "train": {"steps": steps, "batch_size": 64, "warmup_steps": 512, "stats_every": 20, "checkpoint_every": 1000,
                  "target_sync_every": 50, "replay_capacity": 8192, "liquid_dt": 1.0},
    })


def test_gpu_run_carries_the_signals_and_resumes(tmp_path):
    ps = discover(environ={}).plugin_set(["xlstm_context", "rk4_tau"])
    tr = Trainer(tiny(200), ps, tmp_path / "r")
    tr.train(until_step=100)
    assert tr.device == "cuda" and len(tr.history) == 5
    for rec in tr.history:
        assert all(math.isfinite(rec[k]) for k in ("context_norm", "context_divergence", "rk4_substeps")), rec
        assert all(0.1 <= x <= 2.0 for x in rec["liquid_mod"])
    assert tr.ctx.stash["xlstm_context"]["readings"] == 5
    used = tr.ctx.stash["rk4_tau"].get("rk4_intervals", 0)
    assert used == sum(r["context_norm"] > 0.5 for r in tr.history)
    again = Trainer(tiny(200), discover(environ={}).plugin_set(["xlstm_context", "rk4_tau"]), tmp_path / "r")
    again.load(tmp_path / "r" / CHECKPOINT)
    assert again.ctx.signals.snapshot() == tr.ctx.signals.snapshot()
    again.train()
    assert again.ctx.stash["xlstm_context"]["readings"] == 10
    metrics = json.loads((tmp_path / "r" / "metrics.json").read_text())
    assert [m["step"] for m in metrics] == list(range(20, 201, 20))
    assert np.isfinite([m["context_norm"] for m in metrics]).all()
