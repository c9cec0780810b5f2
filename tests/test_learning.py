"""The README's promise: the stage-0 agent of `make run` beats flat, random and the linear
forecast out of sample on the synthetic market's default.

Trains the baseline flag file exactly as `make run` does, for seeds 0..4, and evaluates the
policy selected on the validation split on the held-out test split. Slow (several minutes on two
cores); deselect with -m "not slow".
"""

from pathlib import Path

import pytest

from foxhunt_core.flags import load_flags
from foxhunt_core.trainer import Trainer

BASELINE = Path(__file__).resolve().parents[1] / "flags" / "stage-00-baseline.yaml"


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4])
def test_baseline_policy_beats_flat_random_and_linear(seed):
    flags = load_flags(BASELINE)
    settings = flags.settings.model_copy(update={"seed": seed, "device": "cpu"})
    trainer = Trainer(settings)
    trainer.train()
    table = trainer.evaluate("test")
    policy = table["policy"]["total_return"]
    assert policy > table["flat"]["total_return"], table
    assert policy > table["random"]["total_return"], table
    assert policy > table["linear"]["total_return"], table
