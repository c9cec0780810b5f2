"""The ``atom_entropy`` plugin: manifest and hook implementations.

Entry point ``foxhunt.plugins: atom_entropy = foxhunt_atom_entropy.plugin`` (this module).
State lives on the run context (``ctx.state_of("atom_entropy")``, saved in checkpoints):
``utilization_ema`` (``None`` until the first reading), ``readings`` and the last
``coefficient``. Host-side only: the entropy term itself is the core's C51 loss, so the plugin
ships no kernel and adds no parameters.
"""

from __future__ import annotations

from collections.abc import Callable

from foxhunt_core.hookspecs import RunContext, hookimpl
from foxhunt_core.manifest import PluginManifest, Requires

from . import __version__
from .adaptive import AtomEntropyOptions, coefficient, update_ema

NAME = "atom_entropy"

MANIFEST = PluginManifest(
    name=NAME,
    version=__version__,
    position=2,
    hooks=("q_stats", "entropy_coefficient"),
    options=AtomEntropyOptions,
    parameters=(),
    kernels=(),
    requires=Requires(plugins=(), core=">=0.1,<0.2"),
    description="Raises the C51 entropy coefficient while the atom-utilization EMA is low (plan Task 11).",
    starts_as_identity=True,  # it changes the loss only: a warm-started stage keeps the good stage's Q at step 0
)


def options(ctx: RunContext) -> AtomEntropyOptions:
    """The validated options from the run context (a model, a dict or ``None``)."""
    return AtomEntropyOptions.model_validate(ctx.options_for(NAME) or {})


@hookimpl
def register_plugin(register: Callable[[PluginManifest], None]) -> None:
    register(MANIFEST)


@hookimpl
def q_stats(ctx: RunContext, record: dict[str, float]) -> None:
    state = ctx.state_of(NAME)
    state["utilization_ema"] = update_ema(state.get("utilization_ema"), float(record["atom_utilization"]), options(ctx))
    state["readings"] = int(state.get("readings", 0)) + 1


@hookimpl
def entropy_coefficient(ctx: RunContext, base: float) -> float:
    opts = options(ctx)
    b = base if opts.base_coefficient is None else opts.base_coefficient
    c = coefficient(b, ctx.state_of(NAME).get("utilization_ema"), opts)
    ctx.state_of(NAME)["coefficient"] = c
    return c
