"""Adam (Kingma & Ba, 2015) with global-norm gradient clipping over a parameter tree.

The tree is ``{owner: {name: array}}`` — the core's parameters and each plugin's. Updates are
in place, so stages and the network keep referring to the same arrays. The optimizer's moments
live in a tree of the same shape and are saved in checkpoints beside the parameters.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .net.layers import _xp

Tree = dict[str, dict[str, Any]]


def tree_map(fn, *trees: Tree) -> Tree:
    return {o: {k: fn(*(t[o][k] for t in trees)) for k in trees[0][o]} for o in trees[0]}


def global_norm(grads: Tree) -> float:
    total = 0.0
    for sub in grads.values():
        for g in sub.values():
            total += float((g * g).sum())
    return float(np.sqrt(total))


class Adam:
    """Adam with bias correction; ``step`` clips the global gradient norm first.

    On the CPU the step counter and the clip factor are host numbers. On a GPU they live on the
    device (``t_dev``, the norm), so a step never waits for the device and can be captured in a
    CUDA graph and replayed: each replay increments ``t_dev`` itself.
    """

    def __init__(
        self,
        params: Tree,
        lr: float,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        clip_norm: float | None = None,
    ) -> None:
        self.lr, self.b1, self.b2, self.eps, self.clip_norm = lr, betas[0], betas[1], eps, clip_norm
        self.m = tree_map(lambda p: _xp(p).zeros_like(p), params)
        self.v = tree_map(lambda p: _xp(p).zeros_like(p), params)
        self.t = 0
        first = next(v for sub in params.values() for v in sub.values())
        self.xp = _xp(first)
        self.on_device = self.xp is not np
        self.t_dev = self.xp.zeros((), dtype=self.xp.float64) if self.on_device else None
        self.flat: Any = None

    def use_flat(self, flat_params: Any) -> None:
        """Switch to the fused GPU update over one flat buffer (``flat_params`` is the
        :class:`~foxhunt_core.gpu.flat.FlatTree` whose views *are* the parameters): one norm
        reduction and one update kernel instead of a dozen launches per tensor."""
        from .gpu.optim import adam_workspace

        self.flat = flat_params
        self.gflat = flat_params.zeros_like()
        self.mflat = flat_params.zeros_like()
        self.vflat = flat_params.zeros_like()
        self.mflat.load(self.m)
        self.vflat.load(self.v)
        self.m, self.v = self.mflat.tree, self.vflat.tree
        self.t_dev = self.xp.full((1,), self.t, dtype=self.xp.int32)
        self.workspace = adam_workspace()
        self.scalars = self.xp.zeros(4, dtype=self.xp.float32)

    def grad_slots(self) -> Tree | None:
        """Views of the flat gradient buffer (fused GPU update) that a backward may write its
        gradients into, sparing the copy in :meth:`step`; None on the per-tensor path."""
        return self.gflat.tree if self.flat is not None else None

    def step(self, params: Tree, grads: Tree) -> Any:
        """Apply one update in place; returns the gradient norm before clipping.

        The norm is a float on the CPU and a 0-d device array on a GPU.
        """
        if self.flat is not None:
            return self._step_flat(grads)
        if self.on_device:
            return self._step_device(params, grads)
        norm = global_norm(grads)
        scale = 1.0
        if self.clip_norm is not None and norm > self.clip_norm:
            scale = self.clip_norm / (norm + 1e-12)
        self.t += 1
        self._apply(params, grads, scale, self.lr / (1.0 - self.b1**self.t), 1.0 - self.b2**self.t)
        return norm

    def _apply(self, params: Tree, grads: Tree, scale: Any, step: Any, c2: Any) -> None:
        """``p -= step * m / (sqrt(v / c2) + eps)`` for every tensor with a gradient, after the
        moments take ``g * scale``; ``step = lr / (1 - b1^t)``, ``c2 = 1 - b2^t`` (host numbers
        on the CPU, device scalars on the GPU)."""
        for owner, sub in params.items():
            gsub = grads.get(owner, {})
            for name, p in sub.items():
                g = gsub.get(name)
                if g is None:
                    continue
                m, v = self._moments(owner, name, g * scale)
                p -= step * m / (_xp(p).sqrt(v / c2) + self.eps)

    def _moments(self, owner: str, name: str, g: Any) -> tuple[Any, Any]:
        """Update the first and second moments of one tensor in place; returns them."""
        m, v = self.m[owner][name], self.v[owner][name]
        m *= self.b1
        m += (1.0 - self.b1) * g
        v *= self.b2
        v += (1.0 - self.b2) * (g * g)
        return m, v

    def _step_device(self, params: Tree, grads: Tree) -> Any:
        xp = self.xp
        sq = None
        for sub in grads.values():
            for g in sub.values():
                s = (g * g).sum(dtype=xp.float32)
                sq = s if sq is None else sq + s
        norm = xp.sqrt(sq)
        scale = (
            xp.minimum(1.0, self.clip_norm / (norm + 1e-12)).astype(xp.float32)
            if self.clip_norm is not None
            else xp.ones((), xp.float32)
        )
        self.t += 1
        self.t_dev += 1.0
        step = (self.lr / (1.0 - self.b1**self.t_dev)).astype(xp.float32)
        c2 = (1.0 - self.b2**self.t_dev).astype(xp.float32)
        self._apply(params, grads, scale, step, c2)
        return norm

    def _step_flat(self, grads: Tree) -> Any:
        from .gpu.optim import adam_step

        for owner, name, view in self.gflat.items():
            g = grads.get(owner, {}).get(name)
            if g is None:
                view.fill(0)
            elif g.data.ptr != view.data.ptr or g.strides != view.strides:
                view[...] = g  # gradients written into grad_slots() are in place already
        self.t += 1
        adam_step(self.flat.buffer, self.gflat.buffer, self.mflat.buffer, self.vflat.buffer, self.t_dev,
                  self.lr, self.b1, self.b2, self.eps, self.clip_norm, scalars=self.scalars,
                  workspace=self.workspace)
        return self.scalars[0]

    def state_tree(self) -> dict[str, Tree]:
        return {"m": self.m, "v": self.v}

    def load_state(self, m: Tree, v: Tree, t: int) -> None:
        for owner in self.m:
            for k in self.m[owner]:
                self.m[owner][k][...] = m[owner][k]
                self.v[owner][k][...] = v[owner][k]
        self.t = int(t)
        if self.t_dev is not None:
            self.t_dev.fill(t)
