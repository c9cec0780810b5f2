"""q_mean_center on the NumPy path: centering, ranking, raw-drift statistics, manifest, kernel build."""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest
from foxhunt_q_mean_center import plugin
from foxhunt_q_mean_center.center import (
    KERNEL_FILE,
    MAX_PARTIALS,
    QMeanCenterStage,
    center_reference,
    center_xp,
    launch_shape,
)

from foxhunt_core.agent import Agent
from foxhunt_core.config import RunSettings
from foxhunt_core.plugins import discover
from foxhunt_core.qpipe import branch_argmax, expected_q, q_statistics
from foxhunt_core.stages import BuildContext
from foxhunt_core.trainer import Trainer

OFFSETS = (0, 3, 6, 9, 12)


def _q(rng: np.random.Generator, batch: int, dtype=np.float32) -> np.ndarray:
    # a large common offset (the drift the plugin removes) plus per-action structure
    return (rng.normal(size=(batch, 12)) + rng.normal() * 5.0 + 3.0).astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("batch", [1, 7, 128, 4099])
def test_centered_mean_is_zero_and_branch_argmax_unchanged(batch, dtype):
    rng = np.random.default_rng()
    q = _q(rng, batch, dtype)
    before = q.copy()
    out = QMeanCenterStage().forward(np, q)
    assert out.dtype == q.dtype and out.shape == q.shape
    assert np.array_equal(q, before), "the input (raw expected Q) must not be modified"
    tol = 1e-5 if dtype == np.float32 else 1e-12
    assert abs(out.astype(np.float64).mean()) < tol * (1 + np.abs(q).max())
    np.testing.assert_array_equal(branch_argmax(out, OFFSETS), branch_argmax(q, OFFSETS))
    # the per-branch gaps (what Boltzmann selection sees) are unchanged too
    np.testing.assert_allclose(np.diff(out, axis=1), np.diff(q, axis=1), atol=tol * 10 * (1 + np.abs(q).max()))


def test_reference_and_array_path_agree():
    rng = np.random.default_rng()
    q = _q(rng, 333)
    np.testing.assert_allclose(center_xp(np, q), center_reference(q), rtol=0, atol=2e-6)
    ref = q.astype(np.float64) - q.astype(np.float64).mean()
    np.testing.assert_allclose(center_reference(q), ref, rtol=0, atol=1e-6)


def test_raw_statistics_are_read_before_centering():
    """Defect 6: the drift statistic must see expected Q before the pre-attention stage."""
    rng = np.random.default_rng(5)
    agent = Agent(tiny(1), discover().plugin_set(["q_mean_center"]), np, rng, dtype=np.float64)
    assert [st.name for st in agent.qpipe.pre] == ["q_mean_center"]
    probs = rng.random((16, 12, 11))
    probs /= probs.sum(-1, keepdims=True)
    out = agent.qpipe.forward(agent.online, probs, agent.z)
    raw, _ = expected_q(probs, agent.z)
    np.testing.assert_array_equal(out.q_raw, raw)
    stats = q_statistics(out, probs, agent.offsets, 0.1)
    assert stats["raw_q_mean"] == pytest.approx(raw.mean())
    assert abs(stats["raw_q_mean"]) > 1.0  # the support is off-centre
    assert abs(stats["q_mean"]) < 0.1 * abs(stats["raw_q_mean"])  # coordinated Q is centred


def tiny(steps: int) -> RunSettings:
    return RunSettings.model_validate({
        "seed": 1, "device": "cpu", "market": {"bars": 4000}, "env": {"num_envs": 8, "episode_len": 64},
        "net": {"shared_h1": 16, "shared_h2": 16, "adv_h": 12, "num_atoms": 11, "attn_dim": 4,
                "v_min": -2.0, "v_max": 8.0},
        "train": {"steps": steps, "batch_size": 32, "warmup_steps": 200, "stats_every": 20,
                  "checkpoint_every": 1000, "target_sync_every": 50, "replay_capacity": 5000},
    })


def test_training_run_centres_q_but_reports_raw_drift():
    reg = discover()
    tr = Trainer(tiny(80), reg.plugin_set(["q_mean_center"]), None, options={"q_mean_center": {}})
    assert tr.agent.stage_owners["pre_attention"] == ["q_mean_center"]
    tr.train()
    first, last = tr.history[0], tr.history[-1]
    assert abs(last["raw_q_mean"]) > 0.5  # off-centre support: raw Q is far from 0 ...
    assert abs(last["q_mean"]) < 0.1 * abs(last["raw_q_mean"])  # ... coordinated Q is centred
    assert last["raw_q_drift"] == pytest.approx(last["raw_q_mean"] - first["raw_q_mean"])


def test_manifest_is_discovered_and_validated():
    reg = discover()
    assert "q_mean_center" not in reg.problems
    p = reg.plugins["q_mean_center"]
    assert p.position == 1 and p.manifest.hooks == ("pre_attention",)
    assert p.manifest.kernel_names() == ["q_mean_partial", "q_mean_subtract"]
    assert p.manifest.parameter_count() == 0
    assert p.distribution.startswith("foxhunt-q-mean-center ")


@pytest.mark.parametrize("source", [None, {}, {"use_cuda_kernel": False}, plugin.QMeanCenterOptions()])
def test_hook_reads_options(source):
    ctx = BuildContext(settings=RunSettings(), xp=np, options={} if source is None else {"q_mean_center": source})
    stage = plugin.pre_attention(ctx)
    want = True if not source else bool(dict(source).get("use_cuda_kernel", True))
    assert stage.use_cuda_kernel is want and stage.name == "q_mean_center"


def test_options_reject_unknown_keys():
    with pytest.raises(ValueError, match="extra"):
        plugin.QMeanCenterOptions.model_validate({"use_cuda_kernl": True})


def test_reduction_uses_many_blocks_at_large_batch():
    """Defect 8: the plan reduced B x 12 values with one block of 256 threads."""
    assert launch_shape(12) == (1, 1)
    parts, blocks = launch_shape(12 * 65_536)
    assert parts > 100 and blocks > 1000
    assert launch_shape(10**9)[0] == MAX_PARTIALS


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on this machine")
def test_kernel_compiles_to_ptx_for_sm90(tmp_path):
    res = subprocess.run(["nvcc", "-ptx", "-arch=sm_90", str(KERNEL_FILE), "-o", str(tmp_path / "k.ptx")],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    ptx = (tmp_path / "k.ptx").read_text()
    assert ".entry q_mean_partial" in ptx and ".entry q_mean_subtract" in ptx
