"""CUDA trials on the GPUs of this host (run on a GPU machine; skipped without one): one visible GPU
and a bounded memory pool per trial process, several trials per GPU, the GPU in the ledger."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from rollout_helpers import FLAGS, TINY_RUN, invoke

from foxhunt_ops.backends import visible_gpus
from foxhunt_ops.ledger import Ledger
from foxhunt_ops.trial import TrialSpec, trial_env

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

PROBE = ("import json, cupy; print(json.dumps({'count': cupy.cuda.runtime.getDeviceCount(), "
         "'limit': cupy.get_default_memory_pool().get_limit(), 'total': cupy.cuda.runtime.memGetInfo()[1]}))")


def test_a_trial_process_sees_one_gpu_and_a_bounded_pool(tmp_path: Path):
    gpus = visible_gpus()
    assert gpus, "a GPU machine lists its GPUs"
    spec = TrialSpec(stage_id="s", seed=0, steps=1, flags_file="f", flags_sha256="h", run_dir=str(tmp_path),
                     device="cuda", gpu_memory_fraction=0.25)
    for gpu in gpus:
        out = subprocess.run([sys.executable, "-c", PROBE], env=trial_env(spec, gpu), capture_output=True,
                             text=True, check=True, timeout=120)
        doc = json.loads(out.stdout)
        assert doc["count"] == 1
        assert doc["limit"] == pytest.approx(0.25 * doc["total"], rel=1e-6)


def test_a_cuda_rollout_runs_several_trials_per_gpu_and_records_them(tmp_path: Path):
    gpus = visible_gpus()
    plan = tmp_path / "plan.yaml"
    plan.write_text("version: 1\nname: gpu\ndevice: cuda\nseeds: [0, 1, 2, 3]\nsteps: 50\nworkers_per_gpu: 2\n"
                    "init_from: good\n" + TINY_RUN + "gates:\n  - {name: atom_utilization, dry_run: true}\n"
                    "  - {name: throughput, dry_run: true}\n"
                    f"stages:\n  - flags: {FLAGS / 'stage-00-baseline.yaml'}\n"
                    f"  - flags: {FLAGS / 'stage-01-q-mean-center.yaml'}\n")
    out = tmp_path / "rollout"
    res = invoke("rollout", "run", plan, "--dir", out)
    led = Ledger.open(out)
    trials = led.trials()
    led.close()
    assert res.exit_code in (0, 1, 3), res.output
    assert [t["status"] for t in trials] == ["done"] * 8, [t["error"] for t in trials]
    assert {t["gpu"] for t in trials} <= set(gpus)
    assert len({t["gpu"] for t in trials}) == min(len(gpus), 4)  # every GPU used (up to 4 trials at once)
    assert all(t["result"]["device"] == "cuda" for t in trials)
    assert all(t["result"]["warm_start"] is not None for t in trials if t["stage_id"] == "stage-1")
