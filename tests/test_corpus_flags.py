"""Malformed flag files, inline: `flags validate` and `train` refuse each with the same one line.

Each case is a flag file that must not run (wrong written types, YAML 1.1 forms, non-finite
numbers, sizes beyond their bounds, cross-field rules, the memory limit, data that cannot be
split or trained on) with the line, the dotted path and a fragment of the message expected.
Both commands run in this process: exit 2, exactly that one line on stderr, and ``train``
leaves no run directory. (tests/test_flags_corpus.py holds the file-based corpus of syntax and
schema errors; tests/test_validation_property.py generates mutations of the schema.)
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from corpus_helpers import TINY, invoke

HEAD = "version: 1\nrun:\n  device: cpu\n"  # a case's run lines start at line 4


def R(snippet: str) -> str:
    return HEAD + snippet + "\n"


SMALL = "  market: {bars: 2000}\n"

# id -> (text, line, dotted path, fragment of the message)
CASES: dict[str, tuple[str, int, str, str]] = {
    # ---------------------------------------------------------------- written types
    "version-true": ("version: true\n", 1, "version", "expected an integer, got true"),
    "version-string": ('version: "1"\n', 1, "version", "expected an integer, got the text '1'"),
    "version-float": ("version: 1.0\n", 1, "version", "expected an integer, got the number 1.0"),
    "stage-true": ("version: 1\nstage: true\n", 2, "stage", "expected an integer, got true"),
    "steps-string": (R("  train: {steps: '500'}"), 4, "run.train.steps", "expected an integer, got the text '500'"),
    "steps-bool": (R("  train: {steps: true}"), 4, "run.train.steps", "expected an integer, got true"),
    "steps-float": (R("  train: {steps: 1.5e3}"), 4, "run.train.steps", "expected an integer, got the number 1500.0"),
    "seed-float": (R("  seed: 3.0"), 4, "run.seed", "expected an integer, got the number 3.0"),
    "lr-string": (R("  train: {lr: '0.001'}"), 4, "run.train.lr", "expected a number, got the text '0.001'"),
    "lr-bool": (R("  train: {lr: false}"), 4, "run.train.lr", "expected a number, got false"),
    "tf32-int": (R("  train: {tf32: 1}"), 4, "run.train.tf32", "expected true or false, got int"),
    "tf32-string": (R("  train: {tf32: 'true'}"), 4, "run.train.tf32", "expected true or false, got the text"),
    "enabled-int": ("version: 1\nplugins:\n  q_mean_center: {enabled: 1}\n", 3, "plugins.q_mean_center.enabled",
                    "expected true or false, got int"),
    "position-size-string": (R("  env: {position_sizes: [0.25, '0.5', 1.0]}"), 4, "run.env.position_sizes.1",
                             "expected a number, got the text '0.5'"),
    "urgency-float": (R("  env: {urgency_bars: [1, 4.0, 16]}"), 4, "run.env.urgency_bars.1",
                      "expected an integer, got the number 4.0"),
    "branch-size-bool": (R("  net: {branch_sizes: [3, 3, true, 3]}"), 4, "run.net.branch_sizes.2",
                         "expected an integer, got true"),
    "market-seed-string": (R("  market: {seed: '7'}"), 4, "run.market.seed", "expected an integer, got the text"),
    "option-string": ("version: 1\nplugins:\n  q_mean_center: {enabled: true}\n  atom_entropy:\n    enabled: true\n"
                      "    base_coefficient: '0.01'\n", 6, "plugins.atom_entropy.base_coefficient",
                      "expected a number, got the text '0.01'"),
    # ---------------------------------------------------------------- YAML 1.1 forms and tags
    "sexagesimal-steps": (R("  train: {steps: 1:30}"), 4, "run.train.steps", "base-60 number 90"),
    "sexagesimal-float": (R("  train: {lr: 1:30.5}"), 4, "run.train.lr", "base-60 number 90.5"),
    "octal-stats-every": (R("  train: {stats_every: 010}"), 4, "run.train.stats_every",
                          "YAML 1.1 reads it as the octal number 8, YAML 1.2 as 10"),
    "leading-zero-nine": (R("  train: {stats_every: 09}"), 4, "run.train.stats_every", "'09' is ambiguous"),
    "hex-stats-every": (R("  train: {stats_every: 0x10}"), 4, "run.train.stats_every", "write the decimal number 16"),
    "octal-0o": (R("  train: {stats_every: 0o17}"), 4, "run.train.stats_every", "write the decimal number 15"),
    "binary-0b": (R("  train: {stats_every: 0b101}"), 4, "run.train.stats_every", "write the decimal number 5"),
    "underscore-int": (R("  train: {steps: 1_000}"), 4, "run.train.steps", "YAML 1.1 reads it as 1000"),
    "underscore-float": (R("  train: {lr: 0.000_3}"), 4, "run.train.lr", "is ambiguous"),
    "yes-bool": (R("  train: {tf32: yes}"), 4, "run.train.tf32", "'yes' is ambiguous (YAML 1.1 reads it as true"),
    "on-bool": ("version: 1\nplugins:\n  q_mean_center: {enabled: on}\n", 3, "plugins.q_mean_center.enabled",
                "'on' is ambiguous"),
    "off-bool": (R("  train: {cuda_graphs: Off}"), 4, "run.train.cuda_graphs", "write false"),
    "no-bool": (R("  train: {gpu_collection: NO}"), 4, "run.train.gpu_collection", "'NO' is ambiguous"),
    "binary-tag-seed": (R("  seed: !!binary MTIz"), 4, "run.seed", "tag !!binary is not allowed"),
    "timestamp-tag": ("version: 1\nout_of_order: !!timestamp 2020-01-01\n", 2, "out_of_order",
                      "tag !!timestamp is not allowed"),
    "set-tag": (R("  net: !!set {a, b}"), 4, "run.net", "tag !!set is not allowed"),
    "omap-tag": (R("  train: !!omap [{steps: 5}]"), 4, "run.train", "tag !!omap is not allowed"),
    "custom-tag": (R("  seed: !seed 5"), 4, "run.seed", "tag !seed is not allowed"),
    "python-name-tag": (R("  seed: !!python/name:os.system"), 4, "run.seed", "is not allowed"),
    "int-tag-hex": (R('  seed: !!int "0x10"'), 4, "run.seed", "'0x10' is not a YAML 1.2 int"),
    "bool-tag-yes": (R('  train: {tf32: !!bool "yes"}'), 4, "run.train.tf32", "'yes' is not a YAML 1.2 bool"),
    "float-tag-word": (R('  train: {lr: !!float "fast"}'), 4, "run.train.lr", "'fast' is not a YAML 1.2 float"),
    "null-tag-word": (R('  seed: !!null "zero"'), 4, "run.seed", "'zero' is not a YAML 1.2 null"),
    "two-merge-keys": ("version: 1\nbase: &a {seed: 1}\nmore: &b {device: cpu}\nrun:\n  <<: *a\n  <<: *b\n", 6,
                       "run", "a second merge key '<<' in one mapping (first on line 5"),
    # ---------------------------------------------------------------- non-finite numbers
    "lr-inf": (R("  train: {lr: .inf}"), 4, "run.train.lr", "must be a finite number, not inf"),
    "lr-overflow": (R("  train: {lr: 1e999}"), 4, "run.train.lr", "must be a finite number, not inf"),
    "grad-clip-overflow": (R("  train: {grad_clip: 1e999}"), 4, "run.train.grad_clip", "not inf"),
    "tau-inf": (R("  train: {tau: .inf}"), 4, "run.train.tau", "must be a finite number"),
    "v-min-neg-inf": (R("  net: {v_min: -.inf}"), 4, "run.net.v_min", "must be a finite number, not -inf"),
    "v-max-nan": (R("  net: {v_max: .nan}"), 4, "run.net.v_max", "must be a finite number, not nan"),
    "maker-fee-nan": (R("  env: {maker_fee_bps: .nan}"), 4, "run.env.maker_fee_bps", "not nan"),
    "init-scale-inf": (R("  net: {init_scale: .inf}"), 4, "run.net.init_scale", "not inf"),
    "adam-beta-nan": (R("  train: {adam_betas: [.nan, 0.999]}"), 4, "run.train.adam_betas.0", "not nan"),
    "position-size-inf": (R("  env: {position_sizes: [0.25, 0.5, .inf]}"), 4, "run.env.position_sizes.2", "not inf"),
    "start-price-nan": (R("  market: {start_price: .NaN}"), 4, "run.market.start_price", "not nan"),
    "option-nan": ("version: 1\nplugins:\n  q_mean_center: {enabled: true}\n  atom_entropy:\n    enabled: true\n"
                   "    base_coefficient: .nan\n", 6, "plugins.atom_entropy.base_coefficient", "not nan"),
    "checkpoint-minutes-inf": (R("  train: {checkpoint_minutes: .inf}"), 4, "run.train.checkpoint_minutes", "not inf"),
    # ---------------------------------------------------------------- bounds
    "bars-huge": (R("  market: {bars: 1000000000000}"), 4, "run.market.bars", "must be at most 100_000_000"),
    "replay-huge": (R("  train: {replay_capacity: 100000000000}"), 4, "run.train.replay_capacity",
                    "must be at most 1_000_000_000"),
    "h1-huge": (R("  net: {shared_h1: 4000000000}"), 4, "run.net.shared_h1", "must be at most 16_384"),
    "h2-huge": (R("  net: {shared_h2: 100000}"), 4, "run.net.shared_h2", "must be at most 16_384"),
    "adv-huge": (R("  net: {adv_h: 20000}"), 4, "run.net.adv_h", "must be at most 16_384"),
    "atoms-huge": (R("  net: {num_atoms: 100000000}"), 4, "run.net.num_atoms", "must be at most 1024"),
    "envs-huge": (R("  env: {num_envs: 1000000000}"), 4, "run.env.num_envs", "must be at most 1_048_576"),
    "batch-huge": (R("  train: {batch_size: 10000000}"), 4, "run.train.batch_size", "must be at most 1_048_576"),
    "steps-huge": (R("  train: {steps: 100000000000}"), 4, "run.train.steps", "must be at most 10_000_000_000"),
    "attn-huge": (R("  net: {attn_dim: 5000}"), 4, "run.net.attn_dim", "must be at most 1024"),
    "seed-negative": (R("  seed: -1"), 4, "run.seed", "must be at least 0"),
    "seed-beyond-int64": (R("  seed: 18446744073709551616"), 4, "run.seed", "must be at most"),
    "market-seed-negative": (R("  market: {seed: -5}"), 4, "run.market.seed", "must be at least 0"),
    "lr-huge": (R("  train: {lr: 5.0}"), 4, "run.train.lr", "must be at most 1"),
    "adam-eps-huge": (R("  train: {adam_eps: 2.0}"), 4, "run.train.adam_eps", "must be at most 1"),
    "init-scale-huge": (R("  net: {init_scale: 1000.0}"), 4, "run.net.init_scale", "must be at most 100"),
    "v-min-huge": (R("  net: {v_min: -10000000.0}"), 4, "run.net.v_min", "must be at least -1_000_000"),
    "collect-huge": (R("  train: {collect_per_update: 5000}"), 4, "run.train.collect_per_update",
                     "must be at most 1000"),
    "taker-fee-huge": (R("  env: {taker_fee_bps: 20000.0}"), 4, "run.env.taker_fee_bps", "must be at most 10_000"),
    "maker-fee-low": (R("  env: {maker_fee_bps: -20000.0}"), 4, "run.env.maker_fee_bps", "must be at least -10_000"),
    "episode-huge": (R("  env: {episode_len: 100000000}"), 4, "run.env.episode_len", "must be at most 10_000_000"),
    "entropy-huge": (R("  train: {entropy_coeff: 1000.0}"), 4, "run.train.entropy_coeff", "must be at most 100"),
    "tick-huge": (R("  market: {tick_size: 2000000.0}"), 4, "run.market.tick_size", "must be at most 1_000_000"),
    "reward-scale-tiny": (R("  env: {reward_scale_bps: 0.0000001}"), 4, "run.env.reward_scale_bps",
                          "must be at least 1e-06"),
    "checkpoint-minutes-negative": (R("  train: {checkpoint_minutes: -1}"), 4, "run.train.checkpoint_minutes",
                                    "greater than or equal to 0"),
    "checkpoint-minutes-huge": (R("  train: {checkpoint_minutes: 20000}"), 4, "run.train.checkpoint_minutes",
                                "must be at most 10_080"),
    # ---------------------------------------------------------------- cross-field rules
    "branch-sizes-zero": (R("  net: {branch_sizes: [0, 3, 3, 3]}"), 4, "run.net.branch_sizes", "must be [3, 3, 3, 3]"),
    "branch-sizes-ones": (R("  net: {branch_sizes: [1, 1, 1, 1]}"), 4, "run.net.branch_sizes", "3 order types"),
    "branch-sizes-5733": (R("  net: {branch_sizes: [5, 7, 3, 3]}"), 4, "run.net.branch_sizes",
                          "one magnitude per env.position_sizes entry"),
    "state-dim-zero": (R("  net: {state_dim: 0}"), 4, "run.net.state_dim", "must be 50, the width of the feature"),
    "state-dim-seven": (R("  net: {state_dim: 7}"), 4, "run.net.state_dim", "must be 50"),
    "adam-beta1-one": (R("  train: {adam_betas: [1, 0.999]}"), 4, "run.train.adam_betas.0", "must be in [0, 1), not 1"),
    "adam-beta2-negative": (R("  train: {adam_betas: [0.9, -3]}"), 4, "run.train.adam_betas.1", "not -3"),
    "adam-beta1-two": (R("  train: {adam_betas: [2, 0.999]}"), 4, "run.train.adam_betas.0", "not 2"),
    "tau-min-above-tau": (R("  train: {tau: 0.5, tau_min: 0.8}"), 4, "run.train.tau_min", "must not exceed tau"),
    "liquid-taus-crossed": (R("  train: {liquid_tau_min: 2.0, liquid_tau_max: 1.0}"), 4, "run.train.liquid_tau_min",
                            "must not exceed liquid_tau_max"),
    "position-size-negative": (R("  env: {position_sizes: [-1, 0.5, 1]}"), 4, "run.env.position_sizes.0",
                               "must be in (0, 1]"),
    "position-size-zero": (R("  env: {position_sizes: [0.25, 0, 1]}"), 4, "run.env.position_sizes.1", "not 0"),
    "position-size-huge": (R("  env: {position_sizes: [0.25, 0.5, 1e30]}"), 4, "run.env.position_sizes.2", "1e+30"),
    "urgency-negative": (R("  env: {urgency_bars: [-1, 4, 16]}"), 4, "run.env.urgency_bars.0",
                         "must be between 1 and env.episode_len (256), not -1"),
    "urgency-zero": (R("  env: {urgency_bars: [0, 4, 16]}"), 4, "run.env.urgency_bars.0", "not 0"),
    "urgency-beyond-episode": (R("  env: {episode_len: 64, urgency_bars: [1, 4, 100]}"), 4, "run.env.urgency_bars.2",
                               "between 1 and env.episode_len (64), not 100"),
    "tick-above-price": (R("  market: {tick_size: 200.0, start_price: 100.0}"), 4, "run.market.tick_size",
                         "must be below start_price"),
    "tick-vanishingly-small": (R("  market: {tick_size: 1.0e-300}"), 4, "run.market.tick_size",
                               "start_price is 1e+302 ticks, more than 1e+12"),
    "split-fractions-overlap": (R("  market: {train_fraction: 0.9, val_fraction: 0.4}"), 4, "run.market.val_fraction",
                                "leaves no test block"),
    "split-fractions-sum-one": (R("  market: {train_fraction: 0.6, val_fraction: 0.4}"), 4,
                                "run.market.val_fraction", "= 1 leaves no test block"),
    "replay-below-collection": (R("  env: {num_envs: 512}\n  train: {replay_capacity: 100}"), 5,
                                "run.train.replay_capacity", "must hold one collection step"),
    "one-array-too-large": (R("  train: {batch_size: 400000}\n  net: {num_atoms: 1000}"), 4, "run.train.batch_size",
                            "elements in one array, more than 2^31-1"),
    "replay-array-too-large": (R("  train: {replay_capacity: 900000000}"), 4, "run.train.replay_capacity",
                               "replay_capacity x state_dim"),
    # ---------------------------------------------------------------- the data (market built, split)
    "episode-longer-than-train": (R(SMALL + "  env: {episode_len: 5000}"), 5, "run.env.episode_len",
                                  "leave 1400 bars for training; an episode of env.episode_len 5000 needs 5001"),
    "test-split-too-small": (R("  market: {bars: 2000, train_fraction: 0.94, val_fraction: 0.03}"), 4,
                             "run.market.train_fraction", "leave 60 bars for the test split"),
    "val-split-too-small": (R("  market: {bars: 2000, val_fraction: 0.01}"), 4, "run.market.train_fraction",
                            "leave 20 bars for the val split"),
    "price-reaches-zero": (R("  market: {bars: 2000, start_price: 0.05, noise_ticks: 50.0}"), 4, "run.market",
                           "the simulated price reached zero"),
}


@pytest.fixture(autouse=True)
def _memory(monkeypatch):
    monkeypatch.setenv("FOXHUNT_MEMORY_LIMIT", "8G")


def _one_line(path: Path, args: list) -> str:
    res = invoke(args)
    assert res.exit_code == 2, (res.output, res.exception)
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    lines = res.stderr.splitlines()
    assert len(lines) == 1, lines
    return lines[0]


@pytest.mark.parametrize("name", sorted(CASES))
def test_validate_and_train_refuse_with_the_same_line(name, tmp_path):
    text, line, loc, fragment = CASES[name]
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    got = _one_line(path, ["flags", "validate", path])
    m = re.fullmatch(rf"{re.escape(str(path))}:(\d+): (\S+): (.+)", got)
    assert m is not None, got
    assert (int(m.group(1)), m.group(2)) == (line, loc), got
    assert fragment in m.group(3), got
    out = tmp_path / "run"
    assert _one_line(path, ["train", "--flags", path, "--out", out]) == got
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]  # no run directory


def test_the_memory_limit_is_checked_and_overridable(tmp_path, monkeypatch):
    path = tmp_path / "big.yaml"
    path.write_text(R("  train: {replay_capacity: 40000000}"))
    monkeypatch.setenv("FOXHUNT_MEMORY_LIMIT", "1G")
    line = _one_line(path, ["flags", "validate", path])
    assert line.startswith(f"{path}:4: run.train.replay_capacity: the run needs about 16.5 GiB of memory "
                           "(replay buffer 16.4 GiB"), line
    assert "more than the limit of 1.0 GiB (FOXHUNT_MEMORY_LIMIT=1G)" in line
    assert _one_line(path, ["train", "--flags", path, "--out", tmp_path / "r"]) == line
    monkeypatch.setenv("FOXHUNT_MEMORY_LIMIT", "64G")
    res = invoke(["flags", "validate", path])
    assert res.exit_code == 0, res.output
    monkeypatch.setenv("FOXHUNT_MEMORY_LIMIT", "lots")
    assert "FOXHUNT_MEMORY_LIMIT='lots': write bytes" in _one_line(path, ["flags", "validate", path])
    assert not (tmp_path / "r").exists()


def _special(tmp_path: Path, kind: str) -> Path:
    p = tmp_path / f"{kind}.yaml"
    if kind == "fifo":
        os.mkfifo(p)
    elif kind == "dev-zero":
        p.symlink_to("/dev/zero")
    elif kind == "directory":
        p.mkdir()
    elif kind == "dangling-link":
        p.symlink_to(tmp_path / "nowhere")
    return p


@pytest.mark.parametrize("kind, fragment", [
    ("fifo", "not a regular file (a named pipe (FIFO))"),
    ("dev-zero", "not a regular file (a character device)"),
    ("directory", "not a regular file (a directory)"),
    ("dangling-link", "cannot read (No such file or directory)"),
    ("missing", "cannot read (No such file or directory)"),
])
def test_only_regular_flag_files_are_read(tmp_path, kind, fragment):
    """A FIFO used to hang validate and train forever, /dev/zero to end in a MemoryError."""
    path = _special(tmp_path, kind)
    want = f"{path}:1: <root>: {fragment}"
    assert _one_line(path, ["flags", "validate", path]) == want
    assert _one_line(path, ["train", "--flags", path, "--out", tmp_path / "run"]) == want
    assert not (tmp_path / "run").exists()


def test_the_tiny_base_file_is_valid(tmp_path):
    """The corpus's cases are refused for what they change, not for the rest."""
    path = tmp_path / "tiny.yaml"
    path.write_text(TINY)
    res = invoke(["flags", "validate", path])
    assert res.exit_code == 0, res.output
    path.write_text(R(SMALL))
    assert invoke(["flags", "validate", path]).exit_code == 0


def test_the_corpus_is_large():
    assert len(CASES) >= 100
