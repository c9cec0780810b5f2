"""The training step on the GPU with the fused kernels: the same mathematics as
:class:`foxhunt_core.step.ReferenceStep`, every kernel choice from one execution plan.

:class:`FusedStep` keeps the parameters in flat buffers (the online tree, a twin of it and the
target tree stacked in one allocation, the weights in the padded and joined blocks of
:func:`foxhunt_core.net.fused.storage_shapes`), runs the network through
:class:`~foxhunt_core.net.fused.FusedNetwork` under its :class:`~foxhunt_core.net.fused.
ExecutionPlan`, and forms the bootstrap, the C51 loss and the auxiliary loss in kernels of their
own. Nothing here synchronizes with the host: the whole update can be captured as a CUDA graph
(:mod:`foxhunt_core.graphs`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from ..config import RunSettings
from ..net import BranchingC51, NetOutput
from ..net.fused import ALL_OUTPUTS, HEADS, Device, ExecutionPlan, FusedNetwork, storage_shapes
from ..qpipe import QOut, QPipeline
from ..step import Step, Tree, merge_grads, tree_to
from . import kernels as K
from .flat import FlatTree
from .streams import SideStream

Array = Any


class KernelAttention:
    """The cross-branch attention as the Q pipeline calls it (``forward``, ``backward``, as
    :mod:`foxhunt_core.attention`), on its kernels (:func:`.kernels.attention_forward` and
    ``attention_backward``)."""

    @staticmethod
    def forward(params: dict[str, Array], q: Array) -> tuple[Array, dict[str, Array]]:
        q = q if q.flags.c_contiguous else q.copy()
        p = params
        qc = K.attention_forward(q, p["attn.emb"], p["attn.wq"], p["attn.wk"], p["attn.gate"])
        return qc, {"q": q}

    @staticmethod
    def backward(params: dict[str, Array], cache: dict[str, Array], dqc: Array,
                 grads_into: dict[str, Array] | None = None) -> tuple[Array, dict[str, Array]]:
        """``(None, grads)``: dq is not formed (the training step stops the gradient at the raw Q);
        the gradients go into ``grads_into``'s views where it has them."""
        p = params
        dqc = dqc if dqc.flags.c_contiguous else dqc.copy()
        slots = grads_into or {}
        outs = {k: slots.get(n) for k, n in (("demb", "attn.emb"), ("dwq", "attn.wq"), ("dwk", "attn.wk"),
                                             ("dgate", "attn.gate"))}
        return K.attention_backward(cache["q"], dqc, p["attn.emb"], p["attn.wq"], p["attn.wk"], p["attn.gate"], **outs)


def _row_means(x: Array) -> Array:
    """Means of the rows of ``x`` [R, n] on the GPU: sums over chunks of the rows, then over the
    chunks (a one-block-per-row reduction over a few long rows leaves most of the device idle)."""
    n = x.shape[1]
    chunks = math.gcd(n, 256)
    return x.reshape(x.shape[0], chunks, n // chunks).sum(axis=2).sum(axis=1) / n


class FusedStep(Step):
    """The training step on the GPU (see the module). ``q_stages`` the Q pipeline's ``(hook, name)``
    (for the plan's record); ``plan_overrides`` the execution plan's knobs."""

    attention = KernelAttention()

    def __init__(self, net: BranchingC51, qpipe: QPipeline, settings: RunSettings, xp: Any, dtype: Any, tree: Tree,
                 q_stages: Sequence[tuple[str, str]] = (), plan_overrides: dict[str, Any] | None = None) -> None:
        super().__init__(net, qpipe, settings, xp, dtype)
        t = settings.train
        self.plan = ExecutionPlan.build(net, Device.current(), t.tf32, t.batch_size, q_stages=q_stages,
                                        act_rows=settings.env.num_envs, **(plan_overrides or {}))
        self.fused_network = FusedNetwork(net, self.plan)
        self.q_lane = SideStream(enabled=bool(self.plan.q_stream), lane=1)
        # One buffer whose views are the parameters, with the weights the fused network pads kept
        # in zero-padded blocks. The online network, a twin of it refreshed at each update and the
        # target network are stacked in one allocation at a constant stride, so that the update's
        # three forwards (online on s, online on s', target on s') run as strided-batched GEMMs
        # where the plan stacks them.
        online = tree_to(xp, tree, dtype)
        shapes = {o: {k: tuple(v.shape) for k, v in sub.items()} for o, sub in online.items()}
        self.flat, self.twin, self.target_flat = FlatTree.stacked(
            3, shapes, xp=xp, dtype=dtype, storage={"core": storage_shapes(net)})
        self.flat.load(online)
        self.target_flat.buffer[...] = self.flat.buffer
        self.online, self.target = self.flat.tree, self.target_flat.tree
        self.opt = self._optimizer()
        self.opt.use_flat(self.flat)

    def replan(self, **overrides: Any) -> ExecutionPlan:
        """Build the execution plan again with ``overrides`` (tests and benchmarks compare
        arrangements on one agent); the fused network keeps the kernels it was given."""
        old, p = self.fused_network, self.plan
        self.plan = ExecutionPlan.build(self.net, p.device, p.tf32, p.batch,
                                        q_stages=[(s.hook, s.name) for s in p.stages if s.path == "own"],
                                        act_rows=p.act_rows, limits=p.limits, **overrides)
        self.fused_network = FusedNetwork(self.net, self.plan, kernels=old.K, blas=old.blas, xp=old.xp)
        self.q_lane = SideStream(enabled=bool(self.plan.q_stream), lane=1)
        return self.plan

    def acting_forward(self, params: Tree, obs: Array, outputs: tuple[str, ...]) -> NetOutput:
        return self.fused_network.forward(params, obs, outputs=outputs)

    def forwards(self, batch: dict[str, Array]) -> tuple[NetOutput, NetOutput, NetOutput]:
        """The update's three forwards as one set of launches: the online forward on s (kept for the
        backward), the online forward on s' (E[Q] only) and the target forward on s' (its heads
        only). Where the plan stacks them, the online parameters' twin, refreshed here, sits
        between the online and the target parameters at the same stride."""
        nxt = batch["next_obs"]
        online_next = self.online  # (past the stacking threshold the online forwards run as one, the target's apart)
        if self.plan.stacks(batch["obs"].shape[0]):
            K.copy(self.twin.buffer, self.flat.buffer)
            online_next = self.twin.tree
        out, on_next, tgt = self.fused_network.forward_segments(
            [(self.online, batch["obs"], ALL_OUTPUTS), (online_next, nxt, self.q_outputs),
             (self.target, nxt, (HEADS,))], keep_cache=True)
        return out, on_next, tgt

    def bootstrap(self, batch: dict[str, Array], online_next: NetOutput) -> tuple[Array, Array]:
        """From the online network's E[Q] at ``s'``: the absolute index of each branch's bootstrap
        action [B, D] and the discounts; the loss kernel forms those actions' target distributions
        from the target network's heads."""
        sel = self.q_pipeline(self.online, online_next)
        a_star = K.branch_argmax(self.xp.ascontiguousarray(sel.q_coord), self.offsets, absolute=True)
        return a_star, self.discount(batch)

    def loss_and_grads(self, batch: dict[str, Array], entropy_coeff: Any) -> tuple[Tree, dict[str, Array], NetOutput,
                                                                                 QOut]:
        """Gradients of the full objective; returns ``(grads, scalars, net_out, q_out)``.

        ``entropy_coeff`` is a float or a device scalar read when the step runs. The core's
        gradients are views of the optimizer's flat gradient buffer (no copy before the step), so
        the next call overwrites them."""
        xp, t = self.xp, self.settings.train
        B = batch["obs"].shape[0]
        taken = batch["action"] + self.branch_base  # taken action per branch, [B, D]
        D = taken.shape[1]
        out, on_next, tgt = self.forwards(batch)
        # The Q pipeline at s, the auxiliary loss and their backward read only the forward's E[Q]
        # and Var[Q], the loss kernel's E[m] and the parameters; where the plan says so they run on
        # a stream of their own (gpu/streams.py, lane 1). The pipeline's forward forks as soon as
        # the forwards are done, beside the bootstrap's chain of small kernels at s' on this
        # stream; the auxiliary loss and the backward follow the loss kernel, beside the network's
        # backward. Every buffer the lane reads stays alive, and unwritten, until the join below.
        early = self.plan.knobs.q_early
        if early:
            with self.q_lane.beside():
                q = self.q_pipeline(self.online, out, keep_cache=True)
        # Bootstrap, projection, loss and its gradient over all actions: the bootstrap actions'
        # target distributions (from the target's heads), the gather of the taken rows and the
        # scatter of the gradient happen inside the loss kernel.
        a_star, disc = self.bootstrap(batch, on_next)
        coeff = entropy_coeff if hasattr(entropy_coeff, "shape") else float(entropy_coeff)
        stats = xp.empty((3, B, D), dtype=xp.float32)  # loss, entropy, squared auxiliary error
        y = xp.empty((B, D), dtype=xp.float32)  # E[m_d], the auxiliary loss's target
        _, dlogits, loss, ent = K.c51_target_loss(
            None, batch["reward"], disc, out.log_probs, self.z, coeff, next_heads=tgt.heads,
            next_action=a_star, action=taken, offsets=self.offsets, dlogits_full=True,
            loss=stats[0], entropy=stats[1], write_m=False, m_mean=y)
        with self.q_lane.beside():  # after the loss kernel (its E[m]) and the forward at s queued above
            if not early:
                q = self.q_pipeline(self.online, out, keep_cache=True)
            # Squared error into the third row of stats, its gradient at the taken actions: one launch.
            _, dq = K.aux_error(xp.ascontiguousarray(q.q_coord), taken, y, 2.0 * t.aux_weight / (B * D),
                                self.offsets, err2=stats[2])
            # The attention's and the stages' gradients go straight into the optimizer's flat buffer too.
            q_grads = self.qpipe.backward(self.online, q, dq, grads_into=self.opt.grad_slots())
        grads = self.fused_network.backward(self.online, out, dlogits, grads_into=self.opt.grad_slots())
        self.q_lane.join()
        means = _row_means(stats.reshape(3, -1))  # the three means together
        grads = merge_grads(grads, q_grads)
        return grads, {"loss": means[0], "aux_loss": t.aux_weight * means[2], "entropy": means[1]}, out, q

    def statistics(self, out: NetOutput, q: QOut) -> dict[str, float]:
        """The Q-statistics record of a batch: one multi-block reduction kernel and a single
        device-to-host copy (:func:`foxhunt_core.qpipe.q_statistics`'s twin)."""
        from .qkernels import q_stats_record

        xp = self.xp
        qc, qr = xp.ascontiguousarray(q.q_coord), xp.ascontiguousarray(q.q_raw)
        res = K.q_stats_reduce(qc, qr, xp.ascontiguousarray(out.probs), self.offsets,
                               self.settings.train.atom_mass_threshold)
        return q_stats_record(res, len(self.net.sizes))

    def sync_target(self) -> None:
        K.copy(self.target_flat.buffer, self.flat.buffer)  # one copy of the whole buffer
