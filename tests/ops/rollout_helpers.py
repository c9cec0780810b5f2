"""Shared constants and helpers of the rollout tests (a module of its own: ``conftest`` names clash)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from foxhunt_core.cli import app

ROOT = Path(__file__).resolve().parents[2]
SMOKE = ROOT / "ops" / "plans" / "smoke.yaml"
FLAGS = ROOT / "flags"

TINY_RUN = """\
run:
  market: {bars: 2000}
  env: {num_envs: 16, episode_len: 64}
  net: {shared_h1: 16, shared_h2: 16, adv_h: 16}
  train: {batch_size: 32, warmup_steps: 200, replay_capacity: 2000, stats_every: 10, checkpoint_every: 1000}
"""


def invoke(*args: object) -> Any:
    """``foxhunt ARGS`` in this process (so it shares the session's Ray instance)."""
    return CliRunner().invoke(app, [str(a) for a in args], catch_exceptions=False)
