"""The ``q_mean_center`` plugin: manifest, options and hook implementations.

Entry point ``foxhunt.plugins: q_mean_center = foxhunt_q_mean_center.plugin`` (this module).
"""

from __future__ import annotations

from collections.abc import Callable

from pydantic import BaseModel, ConfigDict, Field

from foxhunt_core.hookspecs import hookimpl
from foxhunt_core.manifest import KernelSpec, PluginManifest, Requires
from foxhunt_core.stages import BuildContext

from . import __version__
from .center import KERNEL_FILE, KERNEL_FUNCTIONS, QMeanCenterStage

NAME = "q_mean_center"


class QMeanCenterOptions(BaseModel):
    """Options of ``q_mean_center`` in a flag file."""

    model_config = ConfigDict(extra="forbid")

    use_cuda_kernel: bool = Field(
        True,
        description="On the CUDA backend, center with the plugin's multi-block kernel; false uses CuPy "
        "array operations (same result; for comparison and debugging).",
    )


MANIFEST = PluginManifest(
    name=NAME,
    version=__version__,
    position=1,
    hooks=("pre_attention",),
    options=QMeanCenterOptions,
    parameters=(),
    kernels=(KernelSpec(path=KERNEL_FILE, functions=KERNEL_FUNCTIONS),),
    requires=Requires(plugins=(), core=">=0.1,<0.2"),
    description="Subtracts the batch's global mean from expected Q before the cross-branch attention (plan Task 10).",
)


def options(source: object) -> QMeanCenterOptions:
    """The validated options from a context's ``options_for`` (a model, a dict or ``None``)."""
    return QMeanCenterOptions.model_validate(source or {})


@hookimpl
def register_plugin(register: Callable[[PluginManifest], None]) -> None:
    register(MANIFEST)


@hookimpl
def pre_attention(ctx: BuildContext) -> QMeanCenterStage:
    return QMeanCenterStage(use_cuda_kernel=options(ctx.options_for(NAME)).use_cuda_kernel)
