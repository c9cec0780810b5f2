"""The training step of one flag set, as array operations: the reference every test checks against.

:class:`ReferenceStep` runs on NumPy (CuPy runs the same operations, for checks) and reads as the
algorithm, top to bottom (``loss_and_grads``): the forwards, the double-DQN bootstrap, the C51
projection and loss, the auxiliary coordinated-Q loss, the hand-written backward. The GPU's step,
:class:`foxhunt_core.gpu.step.FusedStep`, computes the same with the fused kernels; the agent
chooses one of them once, when it is built (:func:`foxhunt_core.agent.step_class`).

Both hold the parameters (online and target trees), the optimizer and the atom support, and give
the agent the same methods: ``act_values``, ``loss_and_grads``, ``update``, ``statistics``,
``sync_target``.
"""

from __future__ import annotations

from typing import Any

from . import attention, c51
from .config import RunSettings
from .net import BranchingC51, NetOutput
from .optim import Adam
from .qpipe import QOut, QPipeline, branch_argmax, q_statistics

Array = Any
Tree = dict[str, dict[str, Any]]


def tree_to(xp: Any, tree: Tree, dtype: Any) -> Tree:
    return {o: {k: xp.ascontiguousarray(xp.asarray(v, dtype=dtype)) for k, v in s.items()} for o, s in tree.items()}


def tree_copy(tree: Tree) -> Tree:
    return {o: {k: v.copy() for k, v in s.items()} for o, s in tree.items()}


def merge_grads(a: Tree, b: Tree) -> Tree:
    out = {o: dict(s) for o, s in a.items()}
    for o, s in b.items():
        for k, v in s.items():
            dst = out.setdefault(o, {})
            dst[k] = dst[k] + v if k in dst else v
    return out


class Step:
    """What both steps share: the network, the Q pipeline, the support, the branches' offsets."""

    attention: Any = attention  # the Q pipeline's cross-branch attention (its forward and backward)
    plan: Any = None  # the GPU execution plan (the fused step's)
    fused_network: Any = None

    def __init__(self, net: BranchingC51, qpipe: QPipeline, settings: RunSettings, xp: Any, dtype: Any) -> None:
        self.net, self.qpipe, self.settings, self.xp, self.dtype = net, qpipe, settings, xp, dtype
        s = settings.net
        self.z = c51.support(s.v_min, s.v_max, s.num_atoms, xp, dtype)
        self.offsets = net.offsets
        self.branch_base = xp.asarray(self.offsets[:-1], dtype=xp.int64)[None, :]  # first action of each branch
        self.online: Tree = {}
        self.target: Tree = {}
        self.opt: Any = None

    def _optimizer(self) -> Adam:
        t = self.settings.train
        return Adam(self.online, t.lr, tuple(t.adam_betas), t.adam_eps, t.grad_clip)

    def discount(self, batch: dict[str, Array]) -> Array:
        """``gamma (1 - terminal)`` [B]."""
        return (self.settings.train.gamma * (1.0 - batch["terminal"])).astype(self.dtype, copy=False)

    def q_pipeline(self, params: Tree, out: NetOutput, keep_cache: bool = False) -> QOut:
        """The Q pipeline on a forward's output (its E[Q] and Var[Q] where the forward has them)."""
        return self.qpipe.forward(params, out.probs, self.z, keep_cache, q_raw=out.q, q_var=out.var)

    @property
    def q_outputs(self) -> tuple[str, ...]:
        """What the Q pipeline reads of a forward: E[Q], and Var[Q] where post-attention stages run."""
        return ("q", "var") if self.qpipe.post else ("q",)

    def act_values(self, obs: Array, iqn_readiness: Any, params: Tree | None = None,
                   evaluation: bool = False) -> Array:
        """Selection values [B, A] for observations [B, S] (no caches kept): collection's, or greedy
        evaluation's (``evaluation``: coordinated Q unless the select stage says otherwise)."""
        params = self.online if params is None else params
        out, q = self.acting(obs, params, evaluation)
        return self.qpipe.selection_values(out.probs, self.z, q, iqn_readiness, evaluation=evaluation)

    def acting(self, obs: Array, params: Tree | None = None, evaluation: bool = False) -> tuple[NetOutput, QOut]:
        """The forward and the Q pipeline that acting reads, without caches."""
        params = self.online if params is None else params
        # Only an action-select stage reads the distributions; without one the Q pipeline's inputs do.
        wanted = ("probs", "q", "var") if self.qpipe.selects(evaluation) else self.q_outputs
        out = self.acting_forward(params, obs, wanted)
        return out, self.q_pipeline(params, out)

    def acting_forward(self, params: Tree, obs: Array, outputs: tuple[str, ...]) -> NetOutput:
        raise NotImplementedError

    def loss_and_grads(self, batch: dict[str, Array], entropy_coeff: Any) -> tuple[Tree, dict[str, Array], NetOutput,
                                                                                 QOut]:
        raise NotImplementedError

    def replan(self, **overrides: Any) -> Any:
        raise ValueError(f"{type(self).__name__} has no GPU execution plan to build again")

    def update(self, batch: dict[str, Array], entropy_coeff: Any) -> tuple[dict[str, Array], NetOutput, QOut]:
        """One gradient step. Scalars stay on the device (no host sync) until read."""
        grads, scalars, out, q = self.loss_and_grads(batch, entropy_coeff)
        scalars["grad_norm"] = self.opt.step(self.online, grads)
        return scalars, out, q


class ReferenceStep(Step):
    """The training step as array operations (see the module)."""

    def __init__(self, net: BranchingC51, qpipe: QPipeline, settings: RunSettings, xp: Any, dtype: Any,
                 tree: Tree) -> None:
        super().__init__(net, qpipe, settings, xp, dtype)
        self.online = tree_to(xp, tree, dtype)
        self.target = tree_copy(self.online)
        self.opt = self._optimizer()

    def acting_forward(self, params: Tree, obs: Array, outputs: tuple[str, ...]) -> NetOutput:
        return self.net.forward(params, obs)  # every output: the reference forms them all anyway

    def bootstrap(self, batch: dict[str, Array]) -> tuple[Array, Array]:
        """Double DQN: the online network's coordinated Q at ``s'`` picks each branch's action
        ``a*_d``; returns the target network's distributions of them [B, D, N] and the discounts
        ``gamma (1 - terminal)`` [B] (see :mod:`foxhunt_core.c51`)."""
        nxt = batch["next_obs"]
        sel = self.q_pipeline(self.online, self.net.forward(self.online, nxt))
        a_star = branch_argmax(sel.q_coord, self.offsets) + self.branch_base  # [B, D], over all actions
        tgt_probs = self.net.forward(self.target, nxt).probs  # [B, A, N]
        p_next = self.xp.take_along_axis(tgt_probs, a_star[:, :, None], axis=1)  # [B, D, N]
        return p_next, self.discount(batch)

    def targets(self, batch: dict[str, Array]) -> Array:
        """Projected C51 targets [B, D, N]: ``r + gamma (1 - terminal) z`` onto the support (Eq. 7),
        each branch from its own bootstrap action, every branch credited with the whole reward."""
        xp = self.xp
        p_next, disc = self.bootstrap(batch)
        B, D, N = p_next.shape
        m = c51.project(p_next.reshape(B * D, N), xp.repeat(batch["reward"], D), xp.repeat(disc, D), self.z)
        return m.reshape(B, D, N)

    def loss_and_grads(self, batch: dict[str, Array], entropy_coeff: Any) -> tuple[Tree, dict[str, Array], NetOutput,
                                                                                 QOut]:
        """Gradients of the full objective; returns ``(grads, scalars, net_out, q_out)``."""
        xp, t = self.xp, self.settings.train
        obs, act = batch["obs"], batch["action"]
        B = obs.shape[0]
        taken = act + self.branch_base  # each branch's taken action over all actions, [B, D]
        D = taken.shape[1]

        # 1. online forward on s, kept for the backward
        out = self.net.forward(self.online, obs, keep_cache=True)
        # 2. the target of each branch: the bootstrap action's target distribution, projected
        m = self.targets(batch)  # [B, D, N]
        # 3. C51 loss CE(m, p) - entropy_coeff H(p) on the taken actions, mean over samples and branches
        logp = xp.take_along_axis(out.log_probs, taken[:, :, None], axis=1)  # [B, D, N]
        loss, dl, ent = c51.loss_and_grad(logp, m, entropy_coeff)
        dlogits = xp.zeros_like(out.log_probs)
        xp.put_along_axis(dlogits, taken[:, :, None], dl / (B * D), axis=1)
        grads = self.net.backward(self.online, out, dlogits)

        # 4. auxiliary loss: the coordinated Q of the taken actions regressed on E[m_d]; its
        #    gradient reaches the attention and the post-attention stages (it stops at the raw Q)
        q = self.q_pipeline(self.online, out, keep_cache=True)
        y = (m * self.z).sum(axis=-1)  # E[m_d], [B, D]
        err = xp.take_along_axis(q.q_coord, taken, axis=1) - y
        aux = t.aux_weight * (err * err).mean()
        dq = xp.zeros_like(q.q_coord)
        xp.put_along_axis(dq, taken, 2.0 * t.aux_weight * err / (B * D), axis=1)
        grads = merge_grads(grads, self.qpipe.backward(self.online, q, dq))
        return grads, {"loss": loss.mean(), "aux_loss": aux, "entropy": ent.mean()}, out, q

    def statistics(self, out: NetOutput, q: QOut) -> dict[str, float]:
        """The Q-statistics record of a batch (:func:`foxhunt_core.qpipe.q_statistics`)."""
        return q_statistics(q, out.probs, self.offsets, self.settings.train.atom_mass_threshold)

    def sync_target(self) -> None:
        for o, sub in self.online.items():
            for k, v in sub.items():
                self.target[o][k][...] = v

