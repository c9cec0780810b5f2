"""The built agent for one flag set: its stages, network, Q pipeline and training step.

:class:`Agent` asks the hot-path hooks for their stages once, at construction, builds the network
and the Q pipeline from them, initialises the parameters and chooses the training step once: the
reference (:class:`foxhunt_core.step.ReferenceStep`, array operations) or, for float32 on CuPy,
the fused GPU step (:class:`foxhunt_core.gpu.step.FusedStep`, every kernel choice from one
execution plan). The step holds the parameters, the target network and the optimizer, and runs
:meth:`Agent.act_values` (collection and evaluation) and :meth:`Agent.update` (one gradient step).
The update is, in either step:

1. online forward on ``s`` (kept for backward) and the Q pipeline on it;
2. double-DQN bootstrap: online coordinated Q at ``s'`` picks ``a*_d`` in each branch, the
   target network's distribution of ``a*_d`` is projected through ``r + gamma (1 - terminal) z``
   (see :mod:`foxhunt_core.c51` for the target across branches);
3. C51 loss ``CE - entropy_coeff * H`` on the taken actions -> network gradients;
4. auxiliary loss ``aux_weight * mean (Qc(s, a_d) - E[m_d])^2`` -> attention and post-attention
   gradients (stopped at the raw Q);
5. Adam with global-norm clipping over the whole tree (core and plugin parameters).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import attention
from .config import RunSettings
from .net import BranchingC51, NetOutput
from .plugins import PluginSet
from .qpipe import QOut, QPipeline, branch_argmax
from .stages import BuildContext
from .step import ReferenceStep, Step, Tree, merge_grads, tree_copy, tree_to

__all__ = ["Agent", "Stages", "build_stages", "merge_grads", "step_class", "tree_copy", "tree_to"]

Array = Any
Q_HOOKS = ("pre_attention", "post_attention", "action_select")


def step_class(xp: Any, dtype: Any) -> type[Step]:
    """The training step for the array module ``xp`` and ``dtype``: the fused GPU step for float32
    on CuPy, the reference otherwise (NumPy, or CuPy in float64 for checks)."""
    if xp is not np and np.dtype(dtype) == np.float32:
        from .gpu.step import FusedStep

        return FusedStep
    return ReferenceStep


@dataclass
class Stages:
    """The hot-path stages of one flag set, as the hooks returned them (once), and their owners."""

    gate: Any = None
    branch_inputs: list[Any] = field(default_factory=list)
    pre: list[Any] = field(default_factory=list)
    post: list[Any] = field(default_factory=list)
    select: Any = None
    owners: dict[str, list[str]] = field(default_factory=dict)  # hook -> plugin names


def build_stages(plugins: PluginSet, settings: RunSettings, xp: Any, options: dict[str, Any] | None = None) -> Stages:
    """Ask the hot-path hooks for their stages (first result for the one-stage hooks)."""
    ctx = BuildContext(settings=settings, xp=xp, options=options or {})
    st = Stages()

    def one(hook: str) -> Any:
        res = plugins.ordered(hook, ctx=ctx)
        if res:
            st.owners[hook] = [res[0][0]]
            return res[0][1]
        return None

    def many(hook: str) -> list[Any]:
        res = plugins.ordered(hook, ctx=ctx)
        st.owners[hook] = [n for n, _ in res]
        return [s for _, s in res]

    st.gate = one("gate_activation")
    st.branch_inputs = many("branch_inputs")
    st.pre = many("pre_attention")
    st.post = many("post_attention")
    st.select = one("action_select")
    return st


class Agent:
    """Everything that changes per flag set and is differentiated. ``plan_overrides``: knobs of
    the GPU execution plan (:class:`foxhunt_core.net.fused.Knobs`; tests and benchmarks)."""

    def __init__(
        self,
        settings: RunSettings,
        plugins: PluginSet,
        xp: Any,
        rng: np.random.Generator,
        options: dict[str, Any] | None = None,
        dtype: Any = np.float32,
        plan_overrides: dict[str, Any] | None = None,
    ) -> None:
        self.settings = settings
        self.xp = xp
        self.dtype = dtype
        st = build_stages(plugins, settings, xp, options)
        self.stage_owners: dict[str, list[str]] = st.owners
        post = st.post
        step = step_class(xp, dtype)
        self.net = BranchingC51(settings.net, gate=st.gate, branch_inputs=st.branch_inputs)
        self.qpipe = QPipeline(pre=st.pre, post=post, select=st.select, attention=step.attention)
        self.offsets = self.net.offsets
        self.num_branches = len(self.net.sizes)

        tree = self.net.init_params(rng, dtype=np.float64)
        tree["core"].update(attention.init_params(self.net.num_actions, settings.net.attn_dim, rng))
        for st in post:
            p = st.init_params(rng)
            if p:
                tree[st.name] = p
        plugins.check_parameters(tree, settings, options)  # each plugin's tensors as its manifest declares
        if step is ReferenceStep:
            self.step: Step = step(self.net, self.qpipe, settings, xp, dtype, tree)
        else:
            q_stages = [(h, n) for h in Q_HOOKS for n in self.stage_owners.get(h, [])]
            self.step = step(self.net, self.qpipe, settings, xp, dtype, tree, q_stages=q_stages,
                             plan_overrides=plan_overrides)

    # ------------------------------------------------------------------ the step's state
    @property
    def online(self) -> Tree:
        return self.step.online

    @property
    def target(self) -> Tree:
        return self.step.target

    @property
    def opt(self) -> Any:
        return self.step.opt

    @property
    def z(self) -> Array:
        """The atom support [N]."""
        return self.step.z

    @property
    def plan(self) -> Any:
        """The GPU execution plan (:class:`~foxhunt_core.net.fused.ExecutionPlan`); None on the
        reference step."""
        return self.step.plan

    @property
    def fused_network(self) -> Any:
        """The fused GPU network (:class:`~foxhunt_core.net.fused.FusedNetwork`); None on the
        reference step."""
        return self.step.fused_network

    def replan(self, **overrides: Any) -> Any:
        """The GPU step's execution plan built again with ``overrides`` (tests and benchmarks
        compare arrangements on one agent); returns it."""
        return self.step.replan(**overrides)

    # ------------------------------------------------------------------ acting and learning
    def act_values(self, obs: Array, iqn_readiness: float, params: Tree | None = None,
                   evaluation: bool = False) -> Array:
        """Selection values [B, A] for observations [B, S] (no caches kept): collection's, or
        greedy evaluation's (``evaluation``: coordinated Q unless the select stage says otherwise)."""
        return self.step.act_values(obs, iqn_readiness, params, evaluation)

    def greedy(self, obs: Array, iqn_readiness: float = 1.0) -> Array:
        return branch_argmax(self.act_values(obs, iqn_readiness, evaluation=True), self.offsets)

    def loss_and_grads(self, batch: dict[str, Array], entropy_coeff: Any) -> tuple[Tree, dict[str, Array],
                                                                                 NetOutput, QOut]:
        """Gradients of the full objective; returns ``(grads, scalars, net_out, q_out)``.
        ``entropy_coeff`` is a float, or (on the GPU) a device scalar read when the step runs."""
        return self.step.loss_and_grads(batch, entropy_coeff)

    def update(self, batch: dict[str, Array], entropy_coeff: Any) -> tuple[dict[str, Array], NetOutput, QOut]:
        """One gradient step. Scalars stay on the device (no host sync) until read."""
        return self.step.update(batch, entropy_coeff)

    def statistics(self, out: NetOutput, q: QOut) -> dict[str, float]:
        """The Q-statistics record of a batch (:func:`foxhunt_core.qpipe.q_statistics`)."""
        return self.step.statistics(out, q)

    def sync_target(self) -> None:
        self.step.sync_target()
