"""Does a trained stage learn? The same updates with its parameters trained and frozen.

Both arms start from the same initialization and run the same sequence of batches, drawn from one
replay buffer that a random policy filled (the trainer's warm-up), so what differs between them is
the plugin's parameters being trained or kept at their init (its ``trainable`` option) and what
follows from that. The auxiliary coordinated-Q loss is recorded at every update (the loss of the
batch before the update's step, a progressive estimate) and on held-out batches at the end.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..agent import Agent
from ..config import RunSettings
from ..plugins import Registry


@dataclass
class Arm:
    aux: list[float]  # auxiliary loss of each update's batch, before its step
    held_out: float  # mean auxiliary loss on the held-out batches after the last update
    moved: float  # largest absolute change of any of the plugin's parameters from its init


def trained_and_frozen(settings: RunSettings, registry: Registry, names: list[str], plugin: str, *,
                       steps: int, batch_size: int, held_out_batches: int = 8) -> dict[str, Arm]:
    """``{"trained": Arm, "frozen": Arm}`` for ``plugin`` (one of ``names``, the enabled plugins;
    its options model must have ``trainable``) over ``steps`` updates, on the CPU."""
    from ..trainer import Trainer

    tr = Trainer(settings, registry.plugin_set(names), None)
    tr.train(until_step=0)  # the warm-up only: a random policy fills the replay
    batches = [tr.collector.sample(batch_size) for _ in range(steps)]
    held = [tr.collector.sample(batch_size) for _ in range(held_out_batches)]
    coeff = settings.train.entropy_coeff
    out = {}
    for arm, trainable in (("trained", True), ("frozen", False)):
        agent = Agent(settings, registry.plugin_set(names), np, np.random.default_rng(settings.seed),
                      options={plugin: {"trainable": trainable}})
        init = {k: v.copy() for k, v in agent.online[plugin].items()}
        aux = []
        for i, b in enumerate(batches):
            scalars, _, _ = agent.update(b, coeff)
            aux.append(float(scalars["aux_loss"]))
            if (i + 1) % settings.train.target_sync_every == 0:
                agent.sync_target()
        held_out = float(np.mean([float(agent.loss_and_grads(b, coeff)[1]["aux_loss"]) for b in held]))
        moved = max(float(np.abs(agent.online[plugin][k] - v).max()) for k, v in init.items())
        out[arm] = Arm(aux, held_out, moved)
    return out
