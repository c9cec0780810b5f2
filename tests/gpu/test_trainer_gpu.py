"""Training on the GPU end to end: device-resident collection, graphed collection and update."""

import json

import numpy as np
import pytest

from foxhunt_core.config import RunSettings
from foxhunt_core.trainer import CHECKPOINT, GEMM_TUNING, GPU_PLAN, Trainer

pytestmark = pytest.mark.gpu


def tiny(**train):
    return RunSettings.model_validate({
        "seed": 5, "device": "cuda",
        "market": {"bars": 4000},
        "env": {"num_envs": 64, "episode_len": 64},
        "net": {"shared_h1": 32, "shared_h2": 32, "adv_h": 24, "num_atoms": 11, "attn_dim": 4},
        "train": {"steps": 120, "batch_size": 64, "warmup_steps": 512, "stats_every": 20,
                  "checkpoint_every": 1000, "target_sync_every": 50, "replay_capacity": 8192, **train},
    })


@pytest.mark.parametrize("graphs", [True, False], ids=["graphs", "eager"])
def test_gpu_training_runs_and_learns_something(tmp_path, graphs):
    tr = Trainer(tiny(cuda_graphs=graphs), out_dir=tmp_path / "r")
    assert type(tr.collector).__name__ == "DeviceCollector"
    before = {k: v.get().copy() for k, v in tr.agent.online["core"].items()}
    tr.train()
    assert tr.step == 120 and len(tr.history) == 6
    assert tr.env_steps == 64 * (8 + 120)
    for rec in tr.history:
        assert all(np.isfinite(v) for v in rec.values() if isinstance(v, float)), rec
    moved = [k for k, v in tr.agent.online["core"].items() if not np.array_equal(v.get(), before[k])]
    assert len(moved) == len(before)
    tr.collector.env.check()  # no out-of-range action reached the environment
    assert len(tr.replay) == 64 * (8 + 120)
    table = tr.evaluate("val")
    assert set(table) == {"policy", "flat", "random", "buy_and_hold", "linear", "momentum"}
    assert (tmp_path / "r" / CHECKPOINT).is_file()
    # The update's execution plan, written when the step was built: its batch size and choices.
    plan = json.loads((tmp_path / "r" / GPU_PLAN).read_text())
    assert plan["batch"] == 64 and plan["act_rows"] == 64 and plan["device"]["sm_count"] > 0
    assert plan["choices"] and plan["stages"][0]["name"] == "sigmoid_gate" and plan["stages"][0]["path"] == "fast"


def test_gpu_resume_continues_from_checkpoint(tmp_path):
    a = Trainer(tiny(steps=80), out_dir=tmp_path / "a")
    a.train(until_step=40)
    assert (tmp_path / "a" / GEMM_TUNING).is_file()  # the GEMM algorithms chosen, for the resumed run
    b = Trainer(tiny(steps=80), out_dir=tmp_path / "a")
    assert '"gemm_tuning_loaded"' in (tmp_path / "a" / "log.jsonl").read_text()
    b.load(tmp_path / "a" / CHECKPOINT)
    assert b.step == 40 and b.env_steps == a.env_steps and len(b.replay) == len(a.replay)
    b.train()
    assert b.step == 80


def test_gpu_fresh_runs_share_the_machines_gemm_choices(tmp_path, monkeypatch):
    """A fresh run adds its tuned GEMM algorithms to the machine's cache; the next fresh run (in a
    new process, here: after cublaslt.forget()) takes them all, times nothing, and trains to the
    same parameters bit for bit."""
    from foxhunt_core.gpu import cublaslt, tuning_cache

    monkeypatch.setenv("FOXHUNT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("FOXHUNT_GEMM_CACHE", raising=False)
    cublaslt.forget()
    a = Trainer(tiny(steps=40), out_dir=tmp_path / "a")
    a.train()
    timed_a = [t for t in cublaslt.tuning_report() if t["times_ms"]]
    assert timed_a  # the first run on this "machine" tuned
    cache = tuning_cache.cache_file(tmp_path / "cache", cublaslt.device_tag())
    record_a = json.loads((tmp_path / "a" / GEMM_TUNING).read_text())
    assert json.loads(cache.read_text())["plans"] == record_a["plans"]

    cublaslt.forget()
    b = Trainer(tiny(steps=40), out_dir=tmp_path / "b")
    log_b = [json.loads(x) for x in (tmp_path / "b" / "log.jsonl").read_text().splitlines()]
    loaded = [e for e in log_b if e["event"] == "gemm_tuning_loaded"]
    assert loaded and loaded[0]["source"] == "machine cache" and loaded[0]["path"] == str(cache)
    b.train()
    assert not [t for t in cublaslt.tuning_report() if t["times_ms"]]  # every choice from the cache
    assert json.loads((tmp_path / "b" / GEMM_TUNING).read_text())["plans"] == record_a["plans"]
    for k, v in a.agent.online["core"].items():
        assert np.array_equal(v.get(), b.agent.online["core"][k].get()), k
    cublaslt.forget()
