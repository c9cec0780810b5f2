"""The foxhunt command line, run as a user runs it (the installed console script)."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

TINY_RUN = """\
version: 1
stage: 0
run:
  seed: 1
  device: cpu
  market: {bars: 4000}
  env: {num_envs: 8, episode_len: 64}
  net: {shared_h1: 16, shared_h2: 16, adv_h: 12, num_atoms: 11, attn_dim: 4}
  train: {steps: 60, batch_size: 32, warmup_steps: 200, stats_every: 20, checkpoint_every: 1000}
plugins: {}
"""


def foxhunt(*args, check=True):
    exe = shutil.which("foxhunt", path=str(Path(sys.executable).parent))
    cmd = [exe] if exe else [sys.executable, "-m", "foxhunt_core.cli"]
    res = subprocess.run(cmd + [str(a) for a in args], capture_output=True, text=True, timeout=600,
                         env={**os.environ, "OPENBLAS_NUM_THREADS": "1", "COLUMNS": "200"})
    if check and res.returncode != 0:
        raise AssertionError(f"exit {res.returncode}\nstdout:{res.stdout}\nstderr:{res.stderr}")
    return res


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli")
    flags = d / "tiny.yaml"
    flags.write_text(TINY_RUN)
    out = d / "run"
    res = foxhunt("train", "--flags", flags, "--out", out, "--quiet")
    return flags, out, res


def test_train_writes_run_directory_and_eval_table(trained):
    _, out, res = trained
    for name in ("run.json", "checkpoint.safetensors", "metrics.json", "log.jsonl", "eval.json"):
        assert (out / name).is_file(), name
    report = json.loads((out / "eval.json").read_text())
    assert report["split"] == "test" and report["step"] == 60
    assert set(report["policies"]) == {"policy", "flat", "random", "buy_and_hold", "linear", "momentum"}
    for row in report["policies"].values():
        assert {"total_return", "sharpe", "volatility", "max_drawdown", "turnover"} <= set(row)
    assert report["interval"]["label"] == "1h" and report["selection"]["verdict"]
    assert report["policies"]["flat"]["total_return"] == 0.0
    assert "buy_and_hold" in res.stdout and "total_return" in res.stdout  # the printed table


def test_eval_reproduces_the_run_table(trained):
    _, out, _ = trained
    res = foxhunt("eval", out)
    report = json.loads((out / "eval.json").read_text())
    ret = report["policies"]["policy"]["total_return"]
    assert f"{ret:+.4f}" in res.stdout


def test_resume_extends_a_finished_run(trained, tmp_path):
    _, out, _ = trained
    copy = tmp_path / "run"
    shutil.copytree(out, copy)
    foxhunt("resume", copy, "--steps", 80)
    assert json.loads((copy / "eval.json").read_text())["step"] == 80


def test_bad_flag_file_exits_2_and_writes_nothing(tmp_path):
    flags = tmp_path / "bad.yaml"
    flags.write_text("version: 1\nrun:\n  train: {steps: -5}\n")
    out = tmp_path / "never"
    res = foxhunt("train", "--flags", flags, "--out", out, check=False)
    assert res.returncode == 2
    assert "Traceback" not in res.stderr
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and str(flags) in lines[0] and "run.train.steps" in lines[0]
    assert not out.exists()


def test_unreadable_checkpoint_exits_2(tmp_path):
    bad = tmp_path / "checkpoint.safetensors"
    bad.write_bytes(b"not a checkpoint")
    res = foxhunt("eval", bad, check=False)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert str(bad) in res.stderr


def test_cuda_without_gpu_is_a_clear_error(trained, tmp_path):
    from foxhunt_core.backend import cuda_available

    if cuda_available():
        pytest.skip("a GPU is present")
    flags, _, _ = trained
    res = foxhunt("train", "--flags", flags, "--out", tmp_path / "r", "--device", "cuda", check=False)
    assert res.returncode == 2 and "cuda" in res.stderr and "Traceback" not in res.stderr
    assert not (tmp_path / "r").exists()


def test_eval_on_an_ohlcv_bar_file(trained, tmp_path):
    """`foxhunt eval --data` evaluates the trained policy on a user's bar file (its last split)."""
    import numpy as np

    _, out, _ = trained
    rng = np.random.default_rng(0)
    n = 3000
    close = 100 * np.exp(np.cumsum(rng.normal(0, 5e-4, n)))
    open_ = np.concatenate([[close[0]], close[:-1]])
    high = np.maximum(open_, close) * (1 + np.abs(rng.normal(0, 2e-4, n)))
    low = np.minimum(open_, close) * (1 - np.abs(rng.normal(0, 2e-4, n)))
    ts = np.arange(n) * 60 + 1_700_000_000
    lines = ["timestamp,open,high,low,close,volume"] + [
        f"{t},{o:.4f},{h:.4f},{lo:.4f},{c:.4f},{v}"
        for t, o, h, lo, c, v in zip(ts, open_, high, low, close, rng.integers(100, 1000, n))
    ]
    bars = tmp_path / "bars.csv"
    bars.write_text("\n".join(lines) + "\n")
    res = foxhunt("eval", out, "--data", bars)
    assert "buy_and_hold" in res.stdout and "bars" in res.stdout
    bad = tmp_path / "bad.csv"
    bad.write_text("timestamp,open,high,low,close\n1,1,1,1,1\n")
    res = foxhunt("eval", out, "--data", bad, check=False)
    assert res.returncode == 2 and str(bad) in res.stderr and "volume" in res.stderr
    assert "Traceback" not in res.stderr


def test_explain_prints_the_gpu_plan_for_a_given_device_without_training(tmp_path):
    flags = tmp_path / "tiny.yaml"
    flags.write_text(TINY_RUN)
    res = foxhunt("train", "--flags", flags, "--explain", "--gpu", "90:132", "--batch-size", "4096")
    assert res.stdout.startswith("GPU execution plan: compute capability 9.0, 132 SMs, TF32 on, batch 4096")
    # (the tiny network's adv_h 12 is no multiple of glu_gemm's tile: cuBLAS and glu_forward, said so)
    assert "adv_h 12 is not a multiple of the 128-column tile" in res.stdout
    assert "4096 rows > stack_max_rows 1024" in res.stdout
    assert list(tmp_path.iterdir()) == [flags]  # nothing trained, nothing written


def test_explain_says_why_it_cannot_plan_and_exits_2(tmp_path):
    flags = tmp_path / "tiny.yaml"
    flags.write_text(TINY_RUN)  # device: cpu
    res = foxhunt("train", "--flags", flags, "--explain", check=False)
    assert res.returncode == 2 and "device: cpu" in res.stderr and "--gpu CAPABILITY:SMS" in res.stderr
    assert "Traceback" not in res.stderr
    res = foxhunt("train", "--flags", flags, "--explain", "--gpu", "hopper", check=False)
    assert res.returncode == 2 and "--gpu: device 'hopper': expected CAPABILITY:SMS" in res.stderr
    res = foxhunt("train", "--flags", flags, check=False)  # training needs its run directory
    assert res.returncode == 2 and "--out" in res.stderr and "Traceback" not in res.stderr
