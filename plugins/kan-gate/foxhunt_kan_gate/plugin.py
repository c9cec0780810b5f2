"""The ``kan_gate`` plugin: manifest, options and the ``gate_activation`` hook.

Entry point ``foxhunt.plugins: kan_gate = foxhunt_kan_gate.plugin`` (this module).
"""

from __future__ import annotations

from collections.abc import Callable

from foxhunt_core.hookspecs import hookimpl
from foxhunt_core.manifest import KernelSpec, ParamSpec, PluginManifest, Requires
from foxhunt_core.stages import BuildContext

from . import __version__
from .cuda import KERNEL_FILE, KERNEL_FUNCTIONS
from .options import KanGateOptions
from .stage import KanGateStage

NAME = "kan_gate"
DEFAULT_BASES = KanGateOptions().num_bases

MANIFEST = PluginManifest(
    name=NAME,
    version=__version__,
    position=5,
    hooks=("gate_activation",),
    options=KanGateOptions,
    parameters=(
        ParamSpec(name="b<d>.coeff", shape=("num_branches", "adv_h", DEFAULT_BASES),
                  description=f"Spline coefficients, one [adv_h, num_bases] tensor per branch d "
                  f"(num_bases {DEFAULT_BASES} by default; the count assumes it)."),
        ParamSpec(name="b<d>.residual", shape=("num_branches", "adv_h"),
                  description="Residual weight of every unit, one [adv_h] tensor per branch d."),
    ),
    kernels=(KernelSpec(path=KERNEL_FILE, functions=KERNEL_FUNCTIONS),),
    requires=Requires(plugins=(), core=">=0.1,<0.2"),
    description="Replaces the GLU's sigmoid gate by a learned cubic B-spline per unit (plan Task 4).",
)


def options(source: object) -> KanGateOptions:
    """The validated options from a context's ``options_for`` (a model, a dict or ``None``)."""
    return KanGateOptions.model_validate(source or {})


@hookimpl
def register_plugin(register: Callable[[PluginManifest], None]) -> None:
    register(MANIFEST)


@hookimpl
def gate_activation(ctx: BuildContext) -> KanGateStage:
    opts = options(ctx.options_for(NAME))
    return KanGateStage(grid=opts.grid(), residual_init=opts.residual_init, use_cuda_kernels=opts.use_cuda_kernels)
