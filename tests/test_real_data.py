"""Training on a real bar file end to end: `foxhunt train --data`, a flag file's file market,
`resume`, `eval`, and the one-line errors of bad data (tests/data/README.md says where the file
comes from)."""

import json
import shutil
from pathlib import Path

import pytest
from test_cli import foxhunt

DATA = Path(__file__).parent / "data" / "sp500_daily_2011_2018.csv"

SMALL = """\
version: 1
stage: 0
run:
  seed: 2
  device: cpu
  env: {num_envs: 8, episode_len: 64}
  net: {shared_h1: 16, shared_h2: 16, adv_h: 12, num_atoms: 11, attn_dim: 4}
  train: {steps: 60, batch_size: 32, warmup_steps: 200, stats_every: 20, checkpoint_every: 1000}
  select: {every: 20}
plugins: {}
"""


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    d = tmp_path_factory.mktemp("real")
    flags = d / "small.yaml"
    flags.write_text(SMALL)
    out = d / "run"
    res = foxhunt("train", "--flags", flags, "--out", out, "--data", DATA, "--quiet")
    return d, flags, out, res


def test_train_on_a_real_file(trained):
    _, _, out, res = trained
    report = json.loads((out / "eval.json").read_text())
    # 2 012 daily bars: 70 / 10 / 20 % by time
    assert report["bars"] == 2012 - int(2012 * 0.7) - int(2012 * 0.1) - 1
    assert report["interval"]["label"] == "1d" and report["interval"]["source"] == "detected"
    assert 245 < report["interval"]["bars_per_year"] < 256  # trading days, from the timestamps
    assert "ohlcv:sp500_daily_2011_2018.csv" in report["market"]
    assert "Corwin-Schultz" in report["costs"]
    assert set(report["policies"]) == {"policy", "flat", "random", "buy_and_hold", "linear", "momentum"}
    assert report["policies"]["flat"]["total_return"] == 0.0
    assert report["baselines"]["momentum"]["k"] in (1, 2, 4, 8, 16, 32, 64)
    sel = report["selection"]
    assert [h["step"] for h in sel["history"]] == [20, 40, 60]
    assert sel["best_return"] == max(h["total_return"] for h in sel["history"])
    assert "1d bars" in res.stdout and "selection:" in res.stdout
    run = json.loads((out / "run.json").read_text())
    assert run["settings"]["market"]["source"] == "file"
    assert Path(run["settings"]["market"]["path"]).is_absolute()
    assert list(out.glob("events.out.tfevents.*")), "no TensorBoard event file"


def test_resume_and_eval_on_the_file(trained):
    d, _, out, _ = trained
    again = d / "again"
    shutil.copytree(out, again)
    foxhunt("resume", again, "--steps", 80)
    report = json.loads((again / "eval.json").read_text())
    assert report["step"] == 80 and [h["step"] for h in report["selection"]["history"]] == [20, 40, 60, 80]
    first = json.loads((out / "eval.json").read_text())
    res = foxhunt("eval", out)
    assert "1d bars" in res.stdout
    assert json.loads((out / "eval.json").read_text())["policies"] == first["policies"]  # eval writes nothing
    res = foxhunt("eval", out, "--data", DATA, "--split", "val")
    assert "1d bars" in res.stdout and "linear" in res.stdout


def test_flag_file_market_is_relative_to_the_flag_file(tmp_path):
    sub = tmp_path / "project"
    (sub / "data").mkdir(parents=True)
    shutil.copy(DATA, sub / "data" / "bars.csv")
    market = "  market: {source: file, path: data/bars.csv, half_spread_bps: 0.5, fee_bps: 0.2}\n"
    text = SMALL.replace("  select: {every: 20}\n", "  select: {every: 0}\n" + market)
    (sub / "flags.yaml").write_text(text)
    out = tmp_path / "run"
    res = foxhunt("train", "--flags", sub / "flags.yaml", "--out", out, "--quiet", "--steps", 20)
    report = json.loads((out / "eval.json").read_text())
    assert report["costs"] == "half spread 0.5 bp (set); fee 0.2 bp (set)"
    assert report["selection"]["verdict"].startswith("no selection")
    assert "no selection" in res.stdout
    # a changed data file: resume and eval refuse it with one line
    with open(sub / "data" / "bars.csv", "a") as fh:
        fh.write("2019-01-02,2476.96,2519.49,2467.47,2510.03,3733160000\n")
    for cmd in (("resume", out), ("eval", out)):
        res = foxhunt(*cmd, check=False)
        assert res.returncode == 2, res.stderr
        assert len(res.stderr.strip().splitlines()) == 1 and "changed since the run was trained" in res.stderr


def test_bad_data_is_one_line_and_writes_nothing(tmp_path):
    flags = tmp_path / "small.yaml"
    flags.write_text(SMALL)
    bad = tmp_path / "bad.csv"
    bad.write_text("timestamp,open,high,low,close\n2020-01-02,1,1,1,1\n")
    out = tmp_path / "run"
    res = foxhunt("train", "--flags", flags, "--out", out, "--data", bad, "--quiet", check=False)
    assert res.returncode == 2
    assert res.stderr.strip() == f"{bad}: missing column 'volume' (found: timestamp, open, high, low, close)"
    assert not out.exists()
    res = foxhunt("train", "--flags", flags, "--out", out, "--data", tmp_path / "none.csv", check=False)
    assert res.returncode == 2 and "none.csv: cannot read (No such file or directory)" in res.stderr
    assert not out.exists()
    short = tmp_path / "short.csv"
    short.write_text(DATA.read_text().splitlines()[0] + "\n" + "\n".join(DATA.read_text().splitlines()[1:60]) + "\n")
    res = foxhunt("train", "--flags", flags, "--out", out, "--data", short, check=False)
    assert res.returncode == 2 and "episode_len" in res.stderr and not out.exists()


@pytest.mark.gpu
def test_train_on_a_real_file_on_the_gpu(tmp_path):
    flags = tmp_path / "small.yaml"
    flags.write_text(SMALL.replace("device: cpu", "device: cuda"))
    out = tmp_path / "run"
    foxhunt("train", "--flags", flags, "--out", out, "--data", DATA, "--quiet")
    report = json.loads((out / "eval.json").read_text())
    assert report["device"] == "cuda" and report["interval"]["label"] == "1d"
    assert [h["step"] for h in report["selection"]["history"]] == [20, 40, 60]
