"""graph_message learns (defect 5): over a run of updates its parameters leave the init, and the
auxiliary coordinated-Q loss is lower than with the parameters frozen at the init, on the same
batches from the same start (foxhunt_core.testing.learning).

Measured (README, "Does it learn?"): the trained arm's loss is lower over the run as a whole in
every seed tried, most of it in the first half; by the end of the run the two arms are level
within noise (the frozen arm sometimes lower), so only the run's mean is asserted here.
"""

from __future__ import annotations

import numpy as np
import pytest

from foxhunt_core.config import RunSettings
from foxhunt_core.plugins import discover
from foxhunt_core.testing.learning import trained_and_frozen

STEPS = 400


def settings(seed: int) -> RunSettings:
    return RunSettings.model_validate({
        "seed": seed, "device": "cpu", "market": {"bars": 4000}, "env": {"num_envs": 8, "episode_len": 64},
        "net": {"shared_h1": 32, "shared_h2": 32, "adv_h": 16, "num_atoms": 11, "attn_dim": 4,
                "v_min": -2.0, "v_max": 8.0},
        "train": {"steps": STEPS, "batch_size": 64, "warmup_steps": 2000, "lr": 1e-3, "target_sync_every": 50,
                  "replay_capacity": 10000, "checkpoint_every": 100000},
    })


@pytest.mark.parametrize("seed", [0, 1])
def test_parameters_leave_the_init_and_the_auxiliary_loss_is_lower_than_frozen(seed):
    r = trained_and_frozen(settings(seed), discover(), ["graph_message"], "graph_message", steps=STEPS,
                           batch_size=64)
    trained, frozen = r["trained"], r["frozen"]
    assert frozen.moved == 0.0
    assert trained.moved > 0.01
    assert np.isfinite(trained.aux).all() and len(trained.aux) == STEPS
    assert np.mean(trained.aux) < np.mean(frozen.aux), (np.mean(trained.aux), np.mean(frozen.aux))
