"""The ``xlstm_context`` plugin: manifest and hook implementation.

Entry point ``foxhunt.plugins: xlstm_context = foxhunt_xlstm_context.plugin`` (this module).
Every Q-statistics record goes to the online learner (:mod:`.learner`); the plugin then
publishes the signals ``context_norm`` and ``context_divergence`` (:mod:`foxhunt_core.signals`).
Its whole state (weights, Adam moments, memory, normalizer, counters) lives on the run context
(``ctx.state_of("xlstm_context")``) as JSON and is saved in checkpoints.

Host-side only, as the plan has it: a few hundred multiply-adds once per stats interval, no CUDA
kernel, no parameters in the network, nothing on the training step. The plugin only observes:
without a consumer of its signals the run's training is exactly that of a run without it (its
weights come from its own generator, seeded by the ``init_seed`` option).
"""

from __future__ import annotations

from collections.abc import Callable

from foxhunt_core.hookspecs import RunContext, hookimpl
from foxhunt_core.manifest import PluginManifest, Requires
from foxhunt_core.signals import SignalSpec

from . import __version__
from .learner import INPUT_KEYS, ContextLearner
from .options import XlstmContextOptions

NAME = "xlstm_context"

MANIFEST = PluginManifest(
    name=NAME,
    version=__version__,
    position=8,
    hooks=("q_stats",),
    options=XlstmContextOptions,
    parameters=(),
    kernels=(),
    requires=Requires(plugins=(), core=">=0.1,<0.2"),
    provides=(
        SignalSpec(name="context_norm",
                   description="L2 norm of the mLSTM context (context_dim wide) after this interval's reading "
                   "(0 before the first)."),
        SignalSpec(name="context_divergence",
                   description="L2 change of the context from the previous interval (0 for a skipped reading)."),
    ),
    description="Stabilized mLSTM context over the Q-statistics, trained online; host-side only, no kernels "
    "(plan Task 7).",
)


def options(ctx: RunContext) -> XlstmContextOptions:
    """The validated options from the run context (a model, a dict or ``None``)."""
    return XlstmContextOptions.model_validate(ctx.options_for(NAME) or {})


@hookimpl
def register_plugin(register: Callable[[PluginManifest], None]) -> None:
    register(MANIFEST)


@hookimpl
def q_stats(ctx: RunContext, record: dict[str, float]) -> None:
    opts = options(ctx)
    state = ctx.state_of(NAME)
    learner = ContextLearner.from_state(opts, state) if state else ContextLearner(opts)
    learner.observe([record.get(k, float("nan")) for k in INPUT_KEYS])
    state.clear()
    state.update(learner.state_dict())
    ctx.signals.publish(NAME, "context_norm", learner.context_norm)
    ctx.signals.publish(NAME, "context_divergence", learner.divergence)
