"""The ``tlob_inject`` plugin: manifest and hook implementations.

Entry point ``foxhunt.plugins: tlob_inject = foxhunt_tlob_inject.plugin`` (this module).
"""

from __future__ import annotations

from collections.abc import Callable

from foxhunt_core.hookspecs import hookimpl
from foxhunt_core.manifest import PluginManifest, Requires
from foxhunt_core.stages import BuildContext

from . import __version__
from .options import TlobInjectOptions
from .stage import NAME, FeatureColumns, stages_for

MANIFEST = PluginManifest(
    name=NAME,
    version=__version__,
    position=7,
    hooks=("branch_inputs",),
    options=TlobInjectOptions,
    parameters=(),  # the widened GLU rows are the core's (branch2/3.w_gate_in, w_val_in), see stage.py
    requires=Requires(plugins=(), core=">=0.1,<0.2"),
    starts_as_identity=True,
    description="Order and urgency branches read microstructure features (spread, depth, queue, trade "
    "arrival) through zero-initialised GLU rows (plan Task 6).",
)


def options(source: object) -> TlobInjectOptions:
    """The validated options from a context's ``options_for`` (a model, a dict or ``None``)."""
    if isinstance(source, TlobInjectOptions):
        return source
    return TlobInjectOptions.model_validate(source or {})


@hookimpl
def register_plugin(register: Callable[[PluginManifest], None]) -> None:
    register(MANIFEST)


@hookimpl
def branch_inputs(ctx: BuildContext) -> tuple[FeatureColumns, ...]:
    opts = options(ctx.options_for(NAME))
    return stages_for(opts.order_features, opts.urgency_features)
