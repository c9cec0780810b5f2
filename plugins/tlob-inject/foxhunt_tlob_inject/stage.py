"""The ``branch_inputs`` stages of ``tlob_inject``: feature columns of the observation, by name.

Each stage hands one branch the observation's columns of the named schema features (the plan's
Task 6: the order branch reads bid-ask spread, L1 depth imbalance and queue pressure, the urgency
branch spread velocity, depth change rate and trade arrival rate). The indices come from
:mod:`foxhunt_core.market.schema` by name, never typed as numbers (DESIGN.md, defect 9).

The stages own no parameters: the core widens the branch's GLU weights by one row per column,
the tensors ``w_gate_in`` and ``w_val_in`` (``width x adv_h`` each, in the core's tree), and
because the stages set ``zero_init_rows`` those rows start at zero, so at step 0 the network
computes what it computes without the plugin. The rows' gradient ``u_col^T dpre`` is not zero
there, so they learn from the first update.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from foxhunt_core.market import schema
from foxhunt_core.stages import index_runs

Array = Any
NAME = "tlob_inject"
ORDER, URGENCY = 2, 3  # branch indices of foxhunt_core.net (direction, magnitude, order, urgency)


runs_of = index_runs  # maximal runs of consecutive source indices, (src_start, src_stop, dst_start)


def gather_columns(xp: Any, obs: Array, runs: tuple[tuple[int, int, int], ...], width: int,
                   out: Array | None = None) -> Array:
    """``obs[:, indices]`` [B, width], written into ``out`` when given (one slice copy per run of
    consecutive indices: no index array, so nothing is copied from the host inside a captured graph)."""
    if out is None:
        out = xp.empty((obs.shape[0], width), dtype=obs.dtype)
    for a, b, c in runs:
        out[:, c : c + (b - a)] = obs[:, a:b]
    return out


@dataclass(frozen=True)
class FeatureColumns:
    """A ``BranchInputStage``: the named features' columns for one branch (no parameters)."""

    branch: int
    features: tuple[str, ...]
    name: str = NAME
    zero_init_rows: bool = True
    indices: tuple[int, ...] = field(init=False)
    runs: tuple[tuple[int, int, int], ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        idx = schema.index_of(*self.features)
        object.__setattr__(self, "indices", idx)
        object.__setattr__(self, "runs", runs_of(idx))

    @property
    def branches(self) -> tuple[int, ...]:
        return (self.branch,)

    @property
    def observation_columns(self) -> tuple[int, ...]:
        """The columns are the observation's, as they are: the GPU network copies them into its
        augmented z (the fast path of ``foxhunt_core.stages.BranchInputStage``)."""
        return self.indices

    @property
    def width(self) -> int:
        return len(self.features)

    def init_params(self, rng: np.random.Generator) -> dict[str, Array]:
        return {}

    def forward(self, xp: Any, params: dict[str, Array], obs: Array) -> tuple[Array, Any]:
        return gather_columns(xp, obs, self.runs, self.width), None

    def backward(self, xp: Any, params: dict[str, Array], cache: Any, dcols: Array) -> dict[str, Array]:
        return {}  # the columns are data: the gradient ends in the core's widened rows


def stages_for(order_features: tuple[str, ...], urgency_features: tuple[str, ...]) -> tuple[FeatureColumns, ...]:
    """The plugin's two stages: the order branch's columns, then the urgency branch's."""
    return FeatureColumns(ORDER, tuple(order_features)), FeatureColumns(URGENCY, tuple(urgency_features))
