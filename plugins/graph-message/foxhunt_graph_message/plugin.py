"""The ``graph_message`` plugin: manifest, options and hook implementations.

Entry point ``foxhunt.plugins: graph_message = foxhunt_graph_message.plugin`` (this module).
"""

from __future__ import annotations

from collections.abc import Callable

from pydantic import BaseModel, ConfigDict, Field

from foxhunt_core.hookspecs import hookimpl
from foxhunt_core.manifest import KernelSpec, ParamSpec, PluginManifest, Requires
from foxhunt_core.stages import BuildContext

from . import __version__
from .cuda import KERNEL_FILE, KERNEL_FUNCTIONS
from .graph import EDGES
from .stage import GraphMessageStage

NAME = "graph_message"


class GraphMessageOptions(BaseModel):
    """Options of ``graph_message`` in a flag file."""

    model_config = ConfigDict(extra="forbid")

    msg_init: float = Field(0.1, description="Each edge's message matrix starts at msg_init times the identity "
                            "(the plan's 0.1); the gate weights start at 0, so every gate starts at 1/2.")
    trainable: bool = Field(True, description="Train the parameters with the auxiliary coordinated-Q loss; false "
                            "keeps them at their init (the frozen arm of an A/B; Q's gradient still flows through).")
    use_cuda_kernel: bool = Field(True, description="On the CUDA backend (float32), run the plugin's forward and "
                                  "backward kernels; false uses CuPy array operations (same function; for comparison "
                                  "and debugging).")


def _param_specs() -> tuple[ParamSpec, ...]:
    out = []
    names = ("direction", "magnitude", "order", "urgency")
    for e, s, d in EDGES:
        src, dst = f"branch_size_{s}", f"branch_size_{d}"
        edge = f"{names[s]} -> {names[d]}"
        out += [ParamSpec(name=f"{e}.gate_src", shape=(src,), description=f"gate weights, source Q ({edge})"),
                ParamSpec(name=f"{e}.gate_dst", shape=(dst,), description=f"gate weights, destination Q ({edge})"),
                ParamSpec(name=f"{e}.msg", shape=(dst, src), description=f"message matrix ({edge})")]
    return tuple(out)


MANIFEST = PluginManifest(
    name=NAME,
    version=__version__,
    position=4,
    hooks=("post_attention",),
    options=GraphMessageOptions,
    parameters=_param_specs(),
    kernels=(KernelSpec(path=KERNEL_FILE, functions=KERNEL_FUNCTIONS),),
    requires=Requires(plugins=(), core=">=0.1,<0.2"),
    description="Gated message passing along four branch edges after the attention, trained (plan Task 3).",
)


def options(source: object) -> GraphMessageOptions:
    """The validated options from a context's ``options_for`` (a model, a dict or ``None``)."""
    return GraphMessageOptions.model_validate(source or {})


@hookimpl
def register_plugin(register: Callable[[PluginManifest], None]) -> None:
    register(MANIFEST)


@hookimpl
def post_attention(ctx: BuildContext) -> GraphMessageStage:
    o = options(ctx.options_for(NAME))
    return GraphMessageStage(ctx.branch_sizes, msg_init=o.msg_init, trainable=o.trainable,
                             use_cuda_kernel=o.use_cuda_kernel)
