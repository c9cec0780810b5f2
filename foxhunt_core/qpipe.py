"""The Q pipeline: atoms -> expected Q -> pre-attention -> attention -> post-attention -> stats.

Everything that turns the network's atom distributions into the values that actions are chosen
by happens here, in this order:

1. **raw expected Q** ``Q = sum_j p_j z_j`` and ``Var[Q] = sum_j p_j z_j^2 - Q^2`` per action.
   The raw Q-mean (and its drift) is read here, before any stage can change it.
2. ``pre_attention`` stages, in plugin order (not differentiated).
3. the cross-branch attention (:mod:`foxhunt_core.attention`).
4. ``post_attention`` stages, in plugin order, each reading Q and Var[Q] (a constant)
   -> **coordinated Q**.
5. selection values: coordinated Q, unless an ``action_select`` stage supplies them (in
   evaluation only where the stage says ``in_evaluation``).

Attention and post-attention stages are trained through :meth:`QPipeline.backward` by the
auxiliary loss of the trainer; the gradient stops at the raw Q (the network learns from C51).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import attention
from .net.layers import _xp
from .stages import ActionSelectStage, PostAttentionStage, PostInputs, PreAttentionStage, SelectInputs

Array = Any


def expected_q(probs: Array, z: Array) -> tuple[Array, Array]:
    """``(E[Q], Var[Q])`` [B, A] from atom probabilities [B, A, N] on support ``z`` [N]."""
    q = (probs * z).sum(axis=-1)
    var = (probs * (z * z)).sum(axis=-1) - q * q
    return q, _xp(var).maximum(var, 0)


@dataclass
class QOut:
    q_raw: Array  # [B, A] expected Q straight from the atoms
    q_var: Array  # [B, A]
    q_coord: Array  # [B, A] coordinated Q (after attention and post-attention stages)
    caches: list[Any] = field(default_factory=list, repr=False)


class QPipeline:
    """The built pipeline for one flag set."""

    def __init__(
        self,
        pre: list[PreAttentionStage] | tuple = (),
        post: list[PostAttentionStage] | tuple = (),
        select: ActionSelectStage | None = None,
        attention: Any = attention,
    ) -> None:
        self.pre = tuple(pre)
        self.post = tuple(post)
        if select is not None and not isinstance(getattr(select, "in_evaluation", None), bool):
            raise TypeError(f"action-select stage {getattr(select, 'name', select)!r} must say in_evaluation "
                            "(True or False: whether greedy evaluation chooses by its values too)")
        self.select = select
        self.attention = attention  # forward/backward of the attention (the step's: array ops or its kernels)

    def forward(
        self, params: dict[str, dict], probs: Array, z: Array, keep_cache: bool = False,
        q_raw: Array | None = None, q_var: Array | None = None,
    ) -> QOut:
        """Run the pipeline; ``q_raw``/``q_var`` may be passed when the network already formed them."""
        xp = _xp(probs if q_raw is None else q_raw)
        if q_raw is None or (q_var is None and probs is not None):
            q_raw, q_var = expected_q(probs, z)
        q = q_raw
        for st in self.pre:
            q = st.forward(xp, q)
        caches = []
        q, c = self.attention.forward(params["core"], q)
        caches.append(c)
        if self.post and q_var is None:
            raise ValueError("post-attention stages read Var[Q]: pass q_var or the atom probabilities")
        for st in self.post:
            q, c = st.forward(xp, params.get(st.name, {}), PostInputs(q, q_var))
            caches.append(c)
        return QOut(q_raw, q_var, q, caches if keep_cache else [])

    def backward(self, params: dict[str, dict], out: QOut, dq_coord: Array,
                 grads_into: dict[str, dict] | None = None) -> dict[str, dict]:
        """Gradients of attention (under ``core``) and of every post-attention stage;
        ``grads_into`` (views of a flat gradient buffer, GPU path) is offered to the attention
        and to each stage (under its name), which may write their gradients into it."""
        if not out.caches:
            raise ValueError("backward needs a forward pass run with keep_cache=True")
        xp = _xp(dq_coord)
        grads: dict[str, dict] = {}
        dq = dq_coord
        for st, c in zip(reversed(self.post), reversed(out.caches[1:])):
            slots = (grads_into or {}).get(st.name)
            dq, g = st.backward(xp, params.get(st.name, {}), c, dq, grads_into=slots)
            if st.name in params:
                grads[st.name] = g
        _, grads["core"] = self.attention.backward(params["core"], out.caches[0], dq,
                                                   grads_into=(grads_into or {}).get("core"))
        return grads

    def selects(self, evaluation: bool = False) -> bool:
        """Whether the action-select stage supplies the values (collection, or ``evaluation``)."""
        return self.select is not None and (not evaluation or self.select.in_evaluation)

    def selection_values(self, probs: Array, z: Array, out: QOut, iqn_readiness: Any,
                         evaluation: bool = False) -> Array:
        """The values [B, A] that actions are chosen by: in collection, or in greedy evaluation
        (``evaluation``), where coordinated Q is used unless the stage says ``in_evaluation``.

        ``iqn_readiness`` is a float, or on the GPU a 0-d device array (a captured collection
        step reads it when it runs), so a stage must use it in array arithmetic, not ``float()``.
        """
        if not self.selects(evaluation):
            return out.q_coord
        xp = _xp(probs)
        return self.select.select_values(
            xp, SelectInputs(probs, z, out.q_raw, out.q_coord, iqn_readiness)
        )


def branch_argmax(values: Array, offsets: tuple[int, ...]) -> Array:
    """Greedy action index within each branch: [B, num_branches] (int64)."""
    xp = _xp(values)
    cols = [values[:, offsets[d] : offsets[d + 1]].argmax(axis=1) for d in range(len(offsets) - 1)]
    return xp.stack(cols, axis=1).astype(xp.int64)


def q_statistics(
    out: QOut, probs: Array, offsets: tuple[int, ...], atom_mass_threshold: float
) -> dict[str, float]:
    """One Q-statistics record over a batch. Every statistic is a plain float:

    - ``avg_max_q``: mean over samples and branches of the branch's largest coordinated Q.
    - ``q_min``, ``q_max``, ``q_mean``, ``q_var``: over all coordinated Q-values of the batch.
    - ``raw_q_mean``: mean of the raw expected Q (before pre-attention stages); the drift
      statistic compares it with the run's first record.
    - ``atom_entropy``: mean over samples and actions of ``H(p) / log(N)`` (1 = uniform).
    - ``atom_utilization``: mean over samples and actions of the fraction of the N atoms whose
      probability is at least ``atom_mass_threshold / N`` (1 = every atom carries mass; a
      distribution collapsed onto one atom scores 1/N).
    - ``q_gap_d`` (d = 0..3): mean over samples of the margin between the best and the second
      best coordinated Q within branch ``d`` (how decisive the branch is).
    """
    xp = _xp(probs)
    qc = out.q_coord
    N = probs.shape[-1]
    logp = xp.log(xp.maximum(probs, 1e-30))
    ent = -(probs * logp).sum(axis=-1) / np.log(N)
    util = (probs >= atom_mass_threshold / N).mean(axis=-1)
    vals = {
        "q_min": qc.min(),
        "q_max": qc.max(),
        "q_mean": qc.mean(),
        "q_var": qc.var(),
        "raw_q_mean": out.q_raw.mean(),
        "atom_entropy": ent.mean(),
        "atom_utilization": util.mean(),
    }
    maxes = []
    for d in range(len(offsets) - 1):
        part = xp.sort(qc[:, offsets[d] : offsets[d + 1]], axis=1)
        maxes.append(part[:, -1])
        vals[f"q_gap_{d}"] = (part[:, -1] - part[:, -2]).mean()
    vals["avg_max_q"] = xp.stack(maxes).mean()
    host = xp.stack([xp.asarray(v, dtype=xp.float64) for v in vals.values()])
    host = host.get() if hasattr(host, "get") else host  # one device->host transfer
    return {k: float(v) for k, v in zip(vals.keys(), host)}
