"""The built step for one flag set: network, Q pipeline, parameters, target network, optimizer.

:class:`Agent` asks the hot-path hooks for their stages once, at construction, and then runs
them directly in :meth:`Agent.act_values` (collection and evaluation) and :meth:`Agent.update`
(one gradient step). The update reads as the algorithm:

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

import math
from typing import Any

import numpy as np

from . import attention, c51
from .config import RunSettings
from .net import BranchingC51, NetOutput
from .optim import Adam
from .plugins import PluginSet
from .qpipe import QOut, QPipeline, branch_argmax, q_statistics
from .stages import BuildContext

Array = Any
Tree = dict[str, dict[str, Any]]


def tree_to(xp: Any, tree: Tree, dtype: Any) -> Tree:
    return {o: {k: xp.ascontiguousarray(xp.asarray(v, dtype=dtype)) for k, v in s.items()} for o, s in tree.items()}


def tree_copy(tree: Tree) -> Tree:
    return {o: {k: v.copy() for k, v in s.items()} for o, s in tree.items()}


def _row_means(x: Array) -> Array:
    """Means of the rows of ``x`` [R, n] on the GPU: sums over chunks of the rows, then over the
    chunks (a one-block-per-row reduction over a few long rows leaves most of the device idle)."""
    n = x.shape[1]
    chunks = math.gcd(n, 256)
    return x.reshape(x.shape[0], chunks, n // chunks).sum(axis=2).sum(axis=1) / n


def merge_grads(a: Tree, b: Tree) -> Tree:
    out = {o: dict(s) for o, s in a.items()}
    for o, s in b.items():
        for k, v in s.items():
            dst = out.setdefault(o, {})
            dst[k] = dst[k] + v if k in dst else v
    return out


class Agent:
    """Everything that changes per flag set and is differentiated."""

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
        ctx = BuildContext(settings=settings, xp=xp, options=options or {})
        self.stage_owners: dict[str, list[str]] = {}
        gate = self._one(plugins, "gate_activation", ctx)
        branch_inputs = self._many(plugins, "branch_inputs", ctx)
        pre = self._many(plugins, "pre_attention", ctx)
        post = self._many(plugins, "post_attention", ctx)
        select = self._one(plugins, "action_select", ctx)
        self.net = BranchingC51(settings.net, gate=gate, branch_inputs=branch_inputs)
        self.qpipe = QPipeline(pre=pre, post=post, select=select)
        self.offsets = self.net.offsets
        self.num_branches = len(self.net.sizes)

        tree = self.net.init_params(rng, dtype=np.float64)
        tree["core"].update(attention.init_params(self.net.num_actions, settings.net.attn_dim, rng))
        for st in post:
            p = st.init_params(rng)
            if p:
                tree[st.name] = p
        self.online: Tree = tree_to(xp, tree, dtype)
        flat = None
        self._online_twin: Any = None
        if xp is not np and np.dtype(dtype) == np.float32:
            from .gpu.flat import FlatTree
            from .net.fused import Device, ExecutionPlan, FusedNetwork, storage_shapes

            plan = ExecutionPlan.build(self.net, Device.current(), settings.train.tf32, settings.train.batch_size,
                                       q_stages=[(h, n) for h in ("pre_attention", "post_attention", "action_select")
                                                 for n in self.stage_owners.get(h, [])],
                                       act_rows=settings.env.num_envs, **(plan_overrides or {}))
            self.net.fused_net = FusedNetwork(self.net, plan)

            # One buffer whose views are the parameters, with the weights the fused path pads
            # kept in zero-padded blocks. The online network, a twin of it refreshed at each
            # update and the target network are stacked in one allocation at a constant stride,
            # so that the update's three forwards (online on s, online on s', target on s') run
            # as strided-batched GEMMs (net.fused.forward_segments).
            shapes = {o: {k: tuple(v.shape) for k, v in sub.items()} for o, sub in self.online.items()}
            flat, self._online_twin, target = FlatTree.stacked(
                3, shapes, xp=xp, dtype=dtype, storage={"core": storage_shapes(self.net)})
            flat.load(self.online)
            target.buffer[...] = flat.buffer
            self.online = flat.tree
            self._flats = (flat, target)
            self.target: Tree = target.tree
        else:
            self._flats = None
            self.target = tree_copy(self.online)
        t = settings.train
        self.opt = Adam(self.online, t.lr, tuple(t.adam_betas), t.adam_eps, t.grad_clip)
        if flat is not None:
            self.opt.use_flat(flat)
        self.z = c51.support(settings.net.v_min, settings.net.v_max, settings.net.num_atoms, xp, dtype)
        self.branch_base = xp.asarray(self.offsets[:-1], dtype=xp.int64)[None, :]  # first action of each branch

    @property
    def fused_network(self) -> Any:
        """The fused GPU network (:class:`~foxhunt_core.net.fused.FusedNetwork`), None on the reference path."""
        return self.net.fused_net

    @property
    def plan(self) -> Any:
        """The GPU execution plan of the update (:class:`~foxhunt_core.net.fused.ExecutionPlan`),
        None on the reference path."""
        return self.net.fused_net.plan if self.net.fused_net is not None else None

    def replan(self, **overrides: Any) -> Any:
        """Build the execution plan again with ``overrides`` (tests and benchmarks compare
        arrangements on one agent); the fused network keeps its kernels. Returns the new plan."""
        from .net.fused import ExecutionPlan, FusedNetwork

        old = self.net.fused_net
        p = old.plan
        plan = ExecutionPlan.build(self.net, p.device, p.tf32, p.batch, q_stages=[(s.hook, s.name) for s in p.stages
                                                                                 if s.path == "own"],
                                   act_rows=p.act_rows, limits=p.limits, **overrides)
        self.net.fused_net = FusedNetwork(self.net, plan, kernels=old.K, blas=old.blas, xp=old.xp)
        return plan

    def _one(self, plugins: PluginSet, hook: str, ctx: BuildContext) -> Any:
        res = plugins.ordered(hook, ctx=ctx)
        if res:
            self.stage_owners[hook] = [res[0][0]]
            return res[0][1]
        return None

    def _many(self, plugins: PluginSet, hook: str, ctx: BuildContext) -> list[Any]:
        res = plugins.ordered(hook, ctx=ctx)
        self.stage_owners[hook] = [n for n, _ in res]
        return [st for _, st in res]

    # ------------------------------------------------------------------ acting
    def act_values(self, obs: Array, iqn_readiness: float, params: Tree | None = None) -> Array:
        """Selection values [B, A] for observations [B, S] (no caches kept)."""
        params = self.online if params is None else params
        # Only an action-select stage reads the distributions; without one E[Q] is enough.
        wanted = ("probs", "q", "var") if self.qpipe.select is not None else ("q",)
        out = self.net.forward(params, obs, outputs=wanted)
        q = self._qpipe(params, out)
        return self.qpipe.selection_values(out.probs, self.z, q, iqn_readiness)

    def _qpipe(self, params: Tree, out: NetOutput, keep_cache: bool = False) -> QOut:
        return self.qpipe.forward(params, out.probs, self.z, keep_cache, q_raw=out.q, q_var=out.var)

    def greedy(self, obs: Array, iqn_readiness: float = 1.0) -> Array:
        return branch_argmax(self.act_values(obs, iqn_readiness), self.offsets)

    # ------------------------------------------------------------------ learning
    def bootstrap(self, batch: dict[str, Array]) -> tuple[Array, Array]:
        """Target-network distributions of each branch's bootstrap action at ``s'`` [B, D, N]
        and the discounts ``gamma (1 - terminal)`` [B] (see :mod:`foxhunt_core.c51`)."""
        nxt = batch["next_obs"]
        sel = self._qpipe(self.online, self.net.forward(self.online, nxt))
        a_star = branch_argmax(sel.q_coord, self.offsets)  # [B, D]
        tgt_probs = self.net.forward(self.target, nxt).probs  # [B, A, N]
        idx = a_star + self.branch_base
        p_next = self.xp.take_along_axis(tgt_probs, idx[:, :, None], axis=1)  # [B, D, N]
        return p_next, self._discount(batch)

    def _discount(self, batch: dict[str, Array]) -> Array:
        """``gamma (1 - terminal)`` [B]."""
        return (self.settings.train.gamma * (1.0 - batch["terminal"])).astype(self.dtype, copy=False)

    def _bootstrap_fused(self, batch: dict[str, Array], online_next: NetOutput) -> tuple[Array, Array]:
        """:meth:`bootstrap` on the fused GPU path, from the online network's E[Q] at ``s'``:
        ``(absolute index of each branch's bootstrap action [B, D], discounts)``; the loss
        kernel forms those actions' target distributions from the target network's heads."""
        from .gpu import kernels as K

        sel = self._qpipe(self.online, online_next)
        a_star = K.branch_argmax(self.xp.ascontiguousarray(sel.q_coord), self.offsets, absolute=True)
        return a_star, self._discount(batch)

    def targets(self, batch: dict[str, Array]) -> Array:
        """Projected C51 targets [B, num_branches, N] for a batch."""
        xp = self.xp
        p_next, disc = self.bootstrap(batch)
        B, D, N = p_next.shape
        m = c51.project(p_next.reshape(B * D, N), xp.repeat(batch["reward"], D), xp.repeat(disc, D), self.z)
        return m.reshape(B, D, N)

    def loss_and_grads(
        self, batch: dict[str, Array], entropy_coeff: Any
    ) -> tuple[Tree, dict[str, Array], NetOutput, QOut]:
        """Gradients of the full objective; returns ``(grads, scalars, net_out, q_out)``.

        ``entropy_coeff`` is a float, or (on the GPU) a device scalar read when the step runs.
        On the fused GPU path the core's gradients are views of the optimizer's flat gradient
        buffer (no copy before the step), so the next call overwrites them.
        """
        xp = self.xp
        t = self.settings.train
        obs, act = batch["obs"], batch["action"]
        B = obs.shape[0]
        fused = self.net.fused(obs)
        idx = act + self.branch_base  # taken action per branch, [B, D]
        D = idx.shape[1]
        if fused:
            from .gpu import kernels as K
            from .net import fused as F

            # The online forward on s (kept for the backward), the online forward on s' (E[Q]
            # only) and the target forward on s' (its heads only) as one set of launches:
            # the online parameters' twin, refreshed here, sits between the online and the target
            # parameters at the same stride (see __init__).
            nxt = batch["next_obs"]
            online_next = self.online  # (large batches: the online forwards run as one, the target's apart)
            if self._online_twin is not None and self.net.fused_net.plan.stacks(B):
                K.copy(self._online_twin.buffer, self._flats[0].buffer)
                online_next = self._online_twin.tree
            out, on_next, tgt = self.net.forward_many(
                [(self.online, obs, F.ALL_OUTPUTS), (online_next, nxt, ("q",)), (self.target, nxt, (F.HEADS,))],
                keep_cache=True)
            # Bootstrap, projection, loss and its gradient over all actions: the bootstrap
            # actions' target distributions (from the target's heads), the gather of the taken
            # rows and the scatter of the gradient happen inside the loss kernel.
            a_star, disc = self._bootstrap_fused(batch, on_next)
            coeff = entropy_coeff if hasattr(entropy_coeff, "shape") else float(entropy_coeff)
            stats = xp.empty((3, B, D), dtype=xp.float32)  # loss, entropy, squared auxiliary error
            y = xp.empty((B, D), dtype=xp.float32)  # E[m_d], the auxiliary loss's target
            _, dlogits, loss, ent = K.c51_target_loss(
                None, batch["reward"], disc, out.log_probs, self.z, coeff, next_heads=tgt.heads,
                next_action=a_star, action=idx, offsets=self.offsets, dlogits_full=True,
                loss=stats[0], entropy=stats[1], write_m=False, m_mean=y)
            grads = self.net.backward(self.online, out, dlogits, grads_into=self.opt.grad_slots())
        else:
            out = self.net.forward(self.online, obs, keep_cache=True)
            logp = xp.take_along_axis(out.log_probs, idx[:, :, None], axis=1)  # [B, D, N]
            m = self.targets(batch)
            loss, dl, ent = c51.loss_and_grad(logp, m, entropy_coeff)
            dlogits = xp.zeros_like(out.log_probs)
            xp.put_along_axis(dlogits, idx[:, :, None], dl / (B * D), axis=1)
            grads = self.net.backward(self.online, out, dlogits)

        q = self._qpipe(self.online, out, keep_cache=True)
        if fused:
            # Squared error into the third row of stats, its gradient at the taken actions: one launch.
            _, dq = K.aux_error(xp.ascontiguousarray(q.q_coord), idx, y, 2.0 * t.aux_weight / (B * D), self.offsets,
                                err2=stats[2])
            means = _row_means(stats.reshape(3, -1))  # the three means together
            loss, ent, aux = means[0], means[1], t.aux_weight * means[2]
        else:
            y = (m * self.z).sum(axis=-1)  # E[m_d], [B, D]
            err = xp.take_along_axis(q.q_coord, idx, axis=1) - y
            aux = t.aux_weight * (err * err).mean()
            dq = xp.zeros_like(q.q_coord)
            xp.put_along_axis(dq, idx, 2.0 * t.aux_weight * err / (B * D), axis=1)
        # The attention's gradients go straight into the optimizer's flat buffer too (fused path).
        grads = merge_grads(grads, self.qpipe.backward(self.online, q, dq,
                                                       grads_into=self.opt.grad_slots() if fused else None))
        if not fused:
            loss, ent = loss.mean(), ent.mean()
        scalars = {"loss": loss, "aux_loss": aux, "entropy": ent}
        return grads, scalars, out, q

    def update(self, batch: dict[str, Array], entropy_coeff: float) -> tuple[dict[str, Array], NetOutput, QOut]:
        """One gradient step. Scalars stay on the device (no host sync) until read."""
        grads, scalars, out, q = self.loss_and_grads(batch, entropy_coeff)
        scalars["grad_norm"] = self.opt.step(self.online, grads)
        return scalars, out, q

    def statistics(self, out: NetOutput, q: QOut) -> dict[str, float]:
        """The Q-statistics record of a batch (:func:`foxhunt_core.qpipe.q_statistics`); on the
        GPU one multi-block reduction kernel and a single device-to-host copy."""
        thr = self.settings.train.atom_mass_threshold
        if self.net.fused(out.probs):
            from .gpu import kernels as K
            from .gpu.qkernels import q_stats_record

            xp = self.xp
            qc, qr = xp.ascontiguousarray(q.q_coord), xp.ascontiguousarray(q.q_raw)
            res = K.q_stats_reduce(qc, qr, xp.ascontiguousarray(out.probs), self.offsets, thr)
            return q_stats_record(res, self.num_branches)
        return q_statistics(q, out.probs, self.offsets, thr)

    def sync_target(self) -> None:
        if self._flats is not None:  # one copy of the whole buffer
            from .gpu import kernels as K

            K.copy(self._flats[1].buffer, self._flats[0].buffer)
            return
        for o, sub in self.online.items():
            for k, v in sub.items():
                self.target[o][k][...] = v
