"""Small plugins registered by the tests to prove each hook point of the engine."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from foxhunt_core.hookspecs import hookimpl
from foxhunt_core.market import schema
from foxhunt_core.stages import GateFragment


class TanhGateStage:
    """gate = (1 + tanh(s_d * pre)) / 2 with a trained slope vector ``s_d`` per branch; its CUDA
    fragment (``tanh_gate.cuh``) runs it inside the fused GLU kernels on the GPU."""

    name = "tanh_gate"
    fragment = GateFragment(str(Path(__file__).parent / "tanh_gate.cuh"), arrays=("b{d}.slope",), unit_floats=(1,))

    def init_params(self, widths, rng):
        return {f"b{d}.slope": np.ones(w) for d, w in enumerate(widths)}

    def forward(self, xp, params, branch, pre):
        s = params[f"b{branch}.slope"]
        y = xp.tanh(pre * s)
        return 0.5 * (1.0 + y), (pre, y)

    def backward(self, xp, params, branch, cache, dgate):
        pre, y = cache
        s = params[f"b{branch}.slope"]
        dy = 0.5 * dgate * (1.0 - y * y)
        return dy * s, {f"b{branch}.slope": (dy * pre).sum(axis=0)}


class TanhGatePlugin:
    POSITION = 5

    @hookimpl
    def gate_activation(self, ctx):
        return TanhGateStage()


class PlainTanhGateStage(TanhGateStage):
    """The same gate without a CUDA fragment: the slow path (its forward and backward per branch)."""

    fragment = None


class PlainTanhGatePlugin(TanhGatePlugin):
    @hookimpl
    def gate_activation(self, ctx):
        return PlainTanhGateStage()


class AffinePostStage:
    """q' = q * (1 + a) + b + c * var with trained per-action vectors a, b, c (all start at 0);
    ``var`` (Var[Q]) is a constant of the stage: no gradient flows into it."""

    name = "affine_post"

    def init_params(self, rng):
        return {"a": np.zeros(12), "b": np.zeros(12), "c": np.zeros(12)}

    def forward(self, xp, params, inputs):
        q, var = inputs.q, inputs.var
        return q * (1.0 + params["a"]) + params["b"] + params["c"] * var, (q, var)

    def backward(self, xp, params, cache, dq, grads_into=None):
        q, var = cache
        grads = {"a": (dq * q).sum(axis=0), "b": dq.sum(axis=0), "c": (dq * var).sum(axis=0)}
        return dq * (1.0 + params["a"]), grads


class AffinePostPlugin:
    POSITION = 4

    @hookimpl
    def post_attention(self, ctx):
        return AffinePostStage()


class OfiColumnStage:
    """One extra column, ``w * obs[ofi]``, for the order and urgency branches."""

    name = "ofi_column"
    branches = (2, 3)
    width = 1

    def init_params(self, rng):
        return {"w": np.ones(1)}

    def forward(self, xp, params, obs):
        col = obs[:, schema.INDEX["ofi"]][:, None]
        return col * params["w"], col

    def backward(self, xp, params, cache, dcols):
        return {"w": (dcols * cache).sum(axis=0)}


class ZeroRows:
    """Two columns of the observation for ``branches``, read by rows that start at zero."""

    width = 2
    zero_init_rows = True

    def __init__(self, branches: tuple[int, ...], name: str = "zero_rows", width: int = 2) -> None:
        self.branches, self.name, self.width = tuple(branches), name, width

    def init_params(self, rng):
        return {}

    def forward(self, xp, params, obs):
        return obs[:, : self.width], None

    def backward(self, xp, params, cache, dcols):
        return {}


class OfiColumnPlugin:
    POSITION = 7

    @hookimpl
    def branch_inputs(self, ctx):
        return OfiColumnStage()


class CenterStage:
    name = "center"

    def forward(self, xp, q):
        return q - q.mean()


class CenterPlugin:
    POSITION = 1

    @hookimpl
    def pre_attention(self, ctx):
        return CenterStage()


class RawSelectStage:
    """Choose actions by raw expected Q (ignores attention)."""

    name = "raw_select"
    in_evaluation = True  # greedy evaluation chooses by raw Q too
    calls = 0

    def select_values(self, xp, inputs):
        RawSelectStage.calls += 1
        return inputs.q_raw


class RawSelectPlugin:
    POSITION = 3

    @hookimpl
    def action_select(self, ctx):
        return RawSelectStage()


class IntervalPlugin:
    """Records q_stats, integrates tau with half-steps, and sets a fixed entropy coefficient."""

    POSITION = 8

    def __init__(self, coeff: float = 0.123) -> None:
        self.coeff = coeff

    @hookimpl
    def q_stats(self, ctx, record):
        st = ctx.state_of("interval")
        st.setdefault("steps", []).append(record["step"])
        st["last_util"] = record["atom_utilization"]

    @hookimpl
    def tau_update(self, ctx, mod, tau, dt):
        st = ctx.state_of("interval")
        st["tau_calls"] = st.get("tau_calls", 0) + 1
        return 1.0 - (1.0 - mod) * np.exp(-dt / tau)

    @hookimpl
    def entropy_coefficient(self, ctx, base):
        return self.coeff


def all_plugins() -> dict[str, Any]:
    return {
        "center": CenterPlugin(),
        "raw_select": RawSelectPlugin(),
        "affine_post": AffinePostPlugin(),
        "tanh_gate": TanhGatePlugin(),
        "ofi_column": OfiColumnPlugin(),
        "interval": IntervalPlugin(),
    }
