"""The ``quantile_select`` plugin: manifest, options, stage and hook implementations.

Entry point ``foxhunt.plugins: quantile_select = foxhunt_quantile_select.plugin`` (this module).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from foxhunt_core.hookspecs import hookimpl
from foxhunt_core.manifest import KernelSpec, PluginManifest, Requires
from foxhunt_core.stages import BuildContext, SelectInputs

from . import __version__
from .kernel import KERNEL_FILE, KERNEL_FUNCTIONS, quantile_select_cuda, tile_for
from .quantile import quantile_select_xp

NAME = "quantile_select"

Array = Any


class QuantileSelectOptions(BaseModel):
    """Options of ``quantile_select`` in a flag file."""

    model_config = ConfigDict(extra="forbid")

    lower_quantile: float = Field(
        0.1, gt=0, lt=1,
        description="tau_lo: the pessimistic quantile level, weighted by alpha = clip(iqn_readiness, 0, 1).",
    )
    upper_quantile: float = Field(
        0.9, gt=0, lt=1,
        description="tau_hi: the optimistic quantile level, weighted by 1 - alpha.",
    )
    evaluation: Literal["coordinated_q", "q_select"] = Field(
        "coordinated_q",
        description="What greedy evaluation chooses by: coordinated Q (collection alone uses Q_select), or "
        "Q_select at the evaluation's iqn_readiness (1: the lower quantile).",
    )
    use_cuda_kernel: bool = Field(
        True,
        description="On the CUDA backend, compute Q_select with the plugin's kernel; false uses CuPy array "
        "operations (same function, float64 inside; for comparison and debugging).",
    )

    @model_validator(mode="after")
    def _levels(self) -> QuantileSelectOptions:
        if self.lower_quantile > self.upper_quantile:
            raise ValueError("lower_quantile must not exceed upper_quantile")
        return self


@dataclass(frozen=True)
class QuantileSelectStage:
    """The ``action_select`` stage: atom distributions [B, A, N] -> Q_select [B, A] (no parameters)."""

    lower: float = 0.1
    upper: float = 0.9
    in_evaluation: bool = False
    use_cuda_kernel: bool = True
    name: str = NAME

    def select_values(self, xp: Any, inputs: SelectInputs) -> Array:
        p = inputs.probs
        on_gpu = getattr(xp, "__name__", "") == "cupy"
        if on_gpu and self.use_cuda_kernel and p.dtype == np.float32 and p.ndim == 3 and p.flags.c_contiguous \
                and inputs.support.dtype == np.float32 and tile_for(p.shape[-1]) is not None:
            return quantile_select_cuda(p, inputs.support, inputs.iqn_readiness, self.lower, self.upper)
        return quantile_select_xp(xp, p, inputs.support, inputs.iqn_readiness, self.lower, self.upper)


MANIFEST = PluginManifest(
    name=NAME,
    version=__version__,
    position=3,
    hooks=("action_select",),
    options=QuantileSelectOptions,
    parameters=(),
    kernels=(KernelSpec(path=KERNEL_FILE, functions=KERNEL_FUNCTIONS),),
    requires=Requires(plugins=(), core=">=0.1,<0.2"),
    description="Collection's Boltzmann draws on (1 - a) Q90 + a Q10 of each action's atom CDF, "
    "a = iqn_readiness (plan Task 2).",
)


def options(source: object) -> QuantileSelectOptions:
    """The validated options from a context's ``options_for`` (a model, a dict or ``None``)."""
    return QuantileSelectOptions.model_validate(source or {})


def stage(opts: QuantileSelectOptions) -> QuantileSelectStage:
    return QuantileSelectStage(lower=opts.lower_quantile, upper=opts.upper_quantile,
                               in_evaluation=opts.evaluation == "q_select", use_cuda_kernel=opts.use_cuda_kernel)


@hookimpl
def register_plugin(register: Callable[[PluginManifest], None]) -> None:
    register(MANIFEST)


@hookimpl
def action_select(ctx: BuildContext) -> QuantileSelectStage:
    return stage(options(ctx.options_for(NAME)))
