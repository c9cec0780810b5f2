"""The ``diffusion_refine`` plugin: manifest, options and hook implementations.

Entry point ``foxhunt.plugins: diffusion_refine = foxhunt_diffusion_refine.plugin`` (this module).
"""

from __future__ import annotations

from collections.abc import Callable

from pydantic import BaseModel, ConfigDict, Field

from foxhunt_core.hookspecs import hookimpl
from foxhunt_core.manifest import KernelSpec, ParamSpec, PluginManifest, Requires
from foxhunt_core.stages import BuildContext

from . import __version__
from .cuda import KERNEL_FILE, KERNEL_FUNCTIONS
from .stage import DiffusionRefineStage

NAME = "diffusion_refine"


class DiffusionRefineOptions(BaseModel):
    """Options of ``diffusion_refine`` in a flag file."""

    model_config = ConfigDict(extra="forbid")

    steps: int = Field(3, ge=1, le=8, description="Denoising steps K; step k = 0..K-1 sees the noise level "
                       "sqrt(Var[Q]) (1 - k/K).")
    hidden: int = Field(24, ge=1, le=256, description="Hidden units of each step's FC-SiLU-FC block (the plan's "
                        "24 = 2 x 12 actions). The CUDA kernels cover the sizes whose shared memory fits 48 KiB "
                        "(with 12 actions: up to 57 at K = 3, 22 at K = 8); others run as CuPy array operations.")
    step_scale: float = Field(0.1, gt=0, le=1, description="Each step adds step_scale times its residual to Q "
                              "(the plan's 0.1).")
    zero_init_output: bool = Field(True, description="Start each step's second layer at 0, so the stage begins as "
                                   "the identity (a warm start keeps the previous stage's function); false "
                                   "initialises it Glorot-uniform like the first layer (the plan).")
    trainable: bool = Field(True, description="Train the parameters with the auxiliary coordinated-Q loss; false "
                            "keeps them at their init (the frozen arm of an A/B; Q's gradient still flows through).")
    use_cuda_kernel: bool = Field(True, description="On the CUDA backend (float32), run the plugin's forward and "
                                  "backward kernels; false uses CuPy array operations (same function; for comparison "
                                  "and debugging).")


_K, _H, _A = "options.steps", "options.hidden", "num_actions"

MANIFEST = PluginManifest(
    name=NAME,
    version=__version__,
    position=6,
    hooks=("post_attention",),
    options=DiffusionRefineOptions,
    parameters=(
        ParamSpec(name="w_q", shape=(_K, _H, _A), description="first layer, on Q, per step"),
        ParamSpec(name="w_sigma", shape=(_K, _H, _A), description="first layer, on the noise level, per step"),
        ParamSpec(name="b1", shape=(_K, _H), description="first layer's bias, per step"),
        ParamSpec(name="w2", shape=(_K, _A, _H), description="second layer (the residual), per step"),
        ParamSpec(name="b2", shape=(_K, _A), description="second layer's bias, per step"),
    ),
    kernels=(KernelSpec(path=KERNEL_FILE, functions=KERNEL_FUNCTIONS),),
    requires=Requires(plugins=(), core=">=0.1,<0.2"),
    description="Variance-conditioned K-step FC-SiLU-FC refinement of coordinated Q, trained (plan Task 5).",
)


def options(source: object) -> DiffusionRefineOptions:
    """The validated options from a context's ``options_for`` (a model, a dict or ``None``)."""
    return DiffusionRefineOptions.model_validate(source or {})


@hookimpl
def register_plugin(register: Callable[[PluginManifest], None]) -> None:
    register(MANIFEST)


@hookimpl
def post_attention(ctx: BuildContext) -> DiffusionRefineStage:
    o = options(ctx.options_for(NAME))
    return DiffusionRefineStage(ctx.num_actions, steps=o.steps, hidden=o.hidden, step_scale=o.step_scale,
                                zero_init_output=o.zero_init_output, trainable=o.trainable,
                                use_cuda_kernel=o.use_cuda_kernel)
