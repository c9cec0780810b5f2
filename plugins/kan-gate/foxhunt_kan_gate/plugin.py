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

MANIFEST = PluginManifest(
    name=NAME,
    version=__version__,
    position=5,
    hooks=("gate_activation",),
    options=KanGateOptions,
    parameters=tuple(
        spec for d in range(4) for spec in (  # one pair per branch: direction, magnitude, order, urgency
            ParamSpec(name=f"b{d}.coeff", shape=("adv_h", "options.num_bases"),
                      description=f"Spline coefficients of branch {d}'s gate units, [adv_h, num_bases]."),
            ParamSpec(name=f"b{d}.residual", shape=("adv_h",),
                      description=f"Residual weight of each of branch {d}'s gate units."),
        )
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
