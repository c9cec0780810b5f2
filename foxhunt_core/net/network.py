"""The branching dueling C51 network: forward and hand-written backward (NumPy reference).

Shapes (all from :class:`~foxhunt_core.config.NetSettings`; ``A = sum(branch_sizes)`` actions,
``N = num_atoms``)::

    obs [B, S]
      h1 = relu(obs W1 + b1)                      [B, H1]   trunk
      h2 = relu(h1 W2 + b2)                       [B, H2]
      m  = sigmoid(h2 Wm + bm);  z = h2 * m       [B, H2]   variable-selection mask (VSN)
      V  = z Wv + bv                              [B, N]    value head
      for branch d (direction, magnitude, order, urgency):
        u_d = [z, cond_d, extra_d]                          magnitude: cond = Q_dir / q_scale
        h_d = gate(u_d Wg + bg) * (u_d Wb + bb)   [B, Ad]   GLU (gate: sigmoid or a plugin stage)
                                                            Wg = [w_gate; w_gate_in] (the rows of extra_d
                                                            a tensor of their own), Wb likewise
        Adv_d = h_d Wo + bo                       [B, n_d, N]
        logits_d = V + Adv_d - mean_a Adv_d                 per-atom dueling aggregation
    probs = softmax over atoms                    [B, A, N]

The magnitude branch is conditioned on the direction branch: its input carries the direction
branch's three expected Q-values (scaled by ``q_scale = max(|v_min|, |v_max|)``), so gradients
reach the direction branch and the value head through that path too. Branch-input stages
(the ``branch_inputs`` hook) append columns computed from the observation to chosen branches.
The GLU weight rows that read those columns are tensors of their own, ``branch<d>.w_gate_in``
and ``branch<d>.w_val_in`` [extra width, adv_h] (present where the branch has extra columns):
the GPU network places them in its weight blocks where the columns are, apart from the rows
that read z and the direction Q.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..config import NetSettings
from ..stages import BranchInputStage, GateActivation, GateFragment, Params
from . import layers as L

Array = Any
ParamTree = dict[str, Params]
DIRECTION, MAGNITUDE = 0, 1


class SigmoidGate:
    """The GLU's default gate: a parameter-free sigmoid (its CUDA form: ``kernels/gate_sigmoid.cuh``,
    a fragment like any gate's, the GLU kernels' default)."""

    name = "sigmoid_gate"
    fragment = GateFragment(str(Path(__file__).resolve().parent.parent / "kernels" / "gate_sigmoid.cuh"))

    def init_params(self, widths: tuple[int, ...], rng: np.random.Generator) -> Params:
        return {}

    def forward(self, xp: Any, params: Params, branch: int, pre: Array) -> tuple[Array, Any]:
        y = L.sigmoid(pre)
        return y, y

    def backward(
        self, xp: Any, params: Params, branch: int, cache: Any, dgate: Array
    ) -> tuple[Array, Params]:
        return L.sigmoid_backward(cache, dgate), {}


@dataclass
class NetOutput:
    """Result of a forward pass; ``cache`` is ``None`` unless asked for."""

    logits: Array | None  # [B, A, N] combined (dueling) logits (normalised on the fused GPU path)
    probs: Array | None  # [B, A, N]
    log_probs: Array | None  # [B, A, N] (None only where a fused forward was told to skip them)
    cache: dict[str, Any] | None = field(default=None, repr=False)
    q: Array | None = None  # [B, A] expected Q, when the forward computed it anyway
    var: Array | None = None  # [B, A] Var[Q], likewise
    q_next: Array | None = None  # [B', A] expected Q of next_obs, when a fused forward carried it along
    # (value head, advantage row) in the GPU network's padded layout, when a fused forward was asked
    # for "heads" (the C51 loss kernel forms the bootstrap distributions from them)
    heads: tuple[Array, Array] | None = None


WIDENED_KEY = re.compile(r"^(?P<head>.+/)?core/branch(?P<d>\d+)\.(?P<w>w_gate|w_val)$")


def split_widened_rows(tensors: dict[str, np.ndarray], net: BranchingC51) -> dict[str, np.ndarray]:
    """Flat checkpoint tensors (``<prefix>/core/branch<d>.w_gate`` ...) with the GLU rows that read
    branch-input columns split off into ``w_gate_in`` / ``w_val_in``, as this network keeps them.
    Checkpoints written before the split hold them as extra rows of ``w_gate`` / ``w_val``; those
    load as if written now. Other tensors, and checkpoints already split, pass unchanged."""
    out = dict(tensors)
    for key, a in tensors.items():
        m = WIDENED_KEY.match(key)
        if m is None or a.ndim != 2 or int(m["d"]) >= len(net.sizes):
            continue
        base = net.base_width(int(m["d"]))
        extra = key + "_in"
        if a.shape[0] > base and extra not in tensors:
            out[key], out[extra] = a[:base], a[base:]
    return out


def _glorot(rng: np.random.Generator, fan_in: int, fan_out: int, gain: float) -> np.ndarray:
    lim = gain * np.sqrt(6.0 / (fan_in + fan_out))
    return rng.uniform(-lim, lim, size=(fan_in, fan_out))


def _rows_glorot(rng: np.random.Generator, drawn: np.ndarray, fan_out: int, gain: float) -> np.ndarray:
    """Glorot-uniform rows where ``drawn`` is true (fan-in: their count), zero rows elsewhere."""
    w = np.zeros((drawn.size, fan_out))
    w[drawn] = _glorot(rng, int(drawn.sum()), fan_out, gain)
    return w


def _he(rng: np.random.Generator, fan_in: int, fan_out: int, gain: float) -> np.ndarray:
    return rng.normal(0.0, gain * np.sqrt(2.0 / fan_in), size=(fan_in, fan_out))


class BranchingC51:
    """Forward and backward of the network for one flag set (its gate and branch-input stages)."""

    def __init__(
        self,
        net: NetSettings,
        gate: GateActivation | None = None,
        branch_inputs: list[BranchInputStage] | tuple[BranchInputStage, ...] = (),
    ) -> None:
        self.settings = net
        self.sizes = tuple(int(n) for n in net.branch_sizes)
        self.offsets = tuple(int(o) for o in np.cumsum((0,) + self.sizes))
        self.num_actions = self.offsets[-1]
        self.num_atoms = net.num_atoms
        self.support64 = np.linspace(net.v_min, net.v_max, net.num_atoms)
        self.q_scale = float(max(abs(net.v_min), abs(net.v_max)))
        self._supports: dict[tuple[str, str], Any] = {}
        self.gate: GateActivation = gate if gate is not None else SigmoidGate()
        self.branch_inputs = tuple(branch_inputs)
        for st in self.branch_inputs:
            bad = [d for d in st.branches if not 0 <= d < len(self.sizes)]
            if bad:
                raise ValueError(f"branch-input stage {st.name!r} names unknown branches {bad}")
        self.extra_width = [
            sum(st.width for st in self.branch_inputs if d in st.branches)
            for d in range(len(self.sizes))
        ]
        self.in_width = [self.base_width(d) + self.extra_width[d] for d in range(len(self.sizes))]

    def base_width(self, d: int) -> int:
        """Rows of ``branch<d>.w_gate`` / ``w_val``: z, and for the magnitude branch the direction Q
        (the rows reading branch-input columns are ``w_gate_in`` / ``w_val_in``)."""
        return self.settings.shared_h2 + (self.sizes[DIRECTION] if d == MAGNITUDE else 0)

    def glu_weights(self, p: Params, d: int) -> tuple[Array, Array]:
        """Branch ``d``'s whole GLU weights ``(W_gate, W_val)`` [in_width, adv_h]: the base rows, then
        the rows reading branch-input columns."""
        if not self.extra_width[d]:
            return p[f"branch{d}.w_gate"], p[f"branch{d}.w_val"]
        xp = L._xp(p[f"branch{d}.w_gate"])
        return tuple(xp.concatenate([p[f"branch{d}.{w}"], p[f"branch{d}.{w}_in"]], axis=0)
                     for w in ("w_gate", "w_val"))

    # ------------------------------------------------------------------ parameters
    def drawn_rows(self, d: int) -> np.ndarray:
        """Mask over branch ``d``'s GLU input rows: false where a branch-input stage with
        ``zero_init_rows`` owns the row (initialised at zero), true where it is drawn at random."""
        drawn = np.ones(self.in_width[d], dtype=bool)
        col = self.in_width[d] - self.extra_width[d]
        for st in self.branch_inputs:
            if d in st.branches:
                if getattr(st, "zero_init_rows", False):
                    drawn[col : col + st.width] = False
                col += st.width
        return drawn

    def init_params(self, rng: np.random.Generator, dtype: Any = np.float32) -> ParamTree:
        """A fresh parameter tree: ``{"core": ..., <gate plugin>: ..., <branch-input plugin>: ...}``."""
        s, g = self.settings, self.settings.init_scale
        core: dict[str, np.ndarray] = {
            "trunk.w1": _he(rng, s.state_dim, s.shared_h1, g),
            "trunk.b1": np.zeros(s.shared_h1),
            "trunk.w2": _he(rng, s.shared_h1, s.shared_h2, g),
            "trunk.b2": np.zeros(s.shared_h2),
            "vsn.w": _glorot(rng, s.shared_h2, s.shared_h2, g),
            "vsn.b": np.full(s.shared_h2, 1.0),  # mask starts mostly open
            # Small output layers: the initial distributions are near uniform (all atoms used).
            "value.w": _glorot(rng, s.shared_h2, s.num_atoms, 0.1 * g),
            "value.b": np.zeros(s.num_atoms),
        }
        for d, n in enumerate(self.sizes):
            drawn, base = self.drawn_rows(d), self.base_width(d)
            for w, b in (("w_gate", "b_gate"), ("w_val", "b_val")):
                full = _rows_glorot(rng, drawn, s.adv_h, g)
                core[f"branch{d}.{w}"] = full[:base]
                if self.extra_width[d]:
                    core[f"branch{d}.{w}_in"] = full[base:]
                core[f"branch{d}.{b}"] = np.zeros(s.adv_h)
            core[f"branch{d}.w_out"] = _glorot(rng, s.adv_h, n * s.num_atoms, 0.1 * g)
            core[f"branch{d}.b_out"] = np.zeros(n * s.num_atoms)
        tree: ParamTree = {"core": core}
        gate_params = self.gate.init_params(tuple([s.adv_h] * len(self.sizes)), rng)
        if gate_params:
            tree[self.gate.name] = gate_params
        for st in self.branch_inputs:
            p = st.init_params(rng)
            if p:
                tree[st.name] = p
        return {
            owner: {k: np.ascontiguousarray(v, dtype=dtype) for k, v in sub.items()}
            for owner, sub in tree.items()
        }

    def support(self, like: Array) -> Array:
        """The atom support on the array module and dtype of ``like`` (made once, then cached:
        inside a CUDA-graph capture no host-to-device copy is allowed)."""
        xp = L._xp(like)
        key = (xp.__name__, str(like.dtype))
        z = self._supports.get(key)
        if z is None:
            z = self._supports[key] = xp.asarray(self.support64, dtype=like.dtype)
        return z

    # ------------------------------------------------------------------ forward
    def forward(self, params: ParamTree, obs: Array, keep_cache: bool = False) -> NetOutput:
        """Distributions of every action for ``obs`` [B, S] (logits, probabilities, log-probabilities;
        with ``keep_cache`` what :meth:`backward` reads). The GPU's fused network
        (:class:`foxhunt_core.net.fused.FusedNetwork`) computes the same."""
        xp = L._xp(obs)
        p = params["core"]
        gp = params.get(self.gate.name, {})
        B, N = obs.shape[0], self.num_atoms
        h1 = L.relu(L.linear(obs, p["trunk.w1"], p["trunk.b1"]))
        h2 = L.relu(L.linear(h1, p["trunk.w2"], p["trunk.b2"]))
        m = L.sigmoid(L.linear(h2, p["vsn.w"], p["vsn.b"]))
        z = h2 * m
        v = L.linear(z, p["value.w"], p["value.b"])  # [B, N]

        extra_cols, extra_caches = [], []
        for st in self.branch_inputs:
            cols, c = st.forward(xp, params.get(st.name, {}), obs)
            extra_cols.append(cols)
            extra_caches.append(c)

        support = self.support(obs)
        logits = [None] * len(self.sizes)
        bc: list[dict[str, Any]] = [dict() for _ in self.sizes]
        q_dir = None
        # Direction first: the magnitude branch reads its expected Q.
        for d in (DIRECTION,) + tuple(i for i in range(len(self.sizes)) if i != DIRECTION):
            parts = [z]
            if d == MAGNITUDE:
                parts.append(q_dir / self.q_scale)
            parts += [cols for st, cols in zip(self.branch_inputs, extra_cols) if d in st.branches]
            u = xp.concatenate(parts, axis=1) if len(parts) > 1 else z
            w_gate, w_val = self.glu_weights(p, d)
            pre = L.linear(u, w_gate, p[f"branch{d}.b_gate"])
            gate, gcache = self.gate.forward(xp, gp, d, pre)
            val = L.linear(u, w_val, p[f"branch{d}.b_val"])
            h = gate * val
            adv = L.linear(h, p[f"branch{d}.w_out"], p[f"branch{d}.b_out"])
            adv = adv.reshape(B, self.sizes[d], N)
            lg = v[:, None, :] + adv - adv.mean(axis=1, keepdims=True)
            logits[d] = lg
            if d == DIRECTION:
                q_dir = (L.softmax(lg) * support).sum(axis=-1)  # [B, n_dir]
            bc[d].update(u=u, gate=gate, gcache=gcache, val=val, h=h)
        all_logits = xp.concatenate(logits, axis=1)
        log_probs = L.log_softmax(all_logits)
        probs = xp.exp(log_probs)
        cache = None
        if keep_cache:
            cache = dict(
                obs=obs, h1=h1, h2=h2, m=m, z=z, branches=bc, q_dir=q_dir,
                extra_cols=extra_cols, extra_caches=extra_caches,
            )
        return NetOutput(all_logits, probs, log_probs, cache)

    # ------------------------------------------------------------------ backward
    def backward(self, params: ParamTree, out: NetOutput, dlogits: Array) -> ParamTree:
        """Gradients of a scalar loss w.r.t. every parameter, given ``dloss/dlogits`` [B, A, N]."""
        if out.cache is None:
            raise ValueError("backward needs a forward pass run with keep_cache=True")
        c = out.cache
        xp = L._xp(dlogits)
        p = params["core"]
        gp = params.get(self.gate.name, {})
        B, H2 = dlogits.shape[0], self.settings.shared_h2
        g: dict[str, Array] = {}
        ggate: Params = {}
        gextra = [None] * len(self.branch_inputs)
        dz = xp.zeros_like(c["z"])
        dlog = [dlogits[:, self.offsets[d] : self.offsets[d + 1], :] for d in range(len(self.sizes))]
        dlog[DIRECTION] = dlog[DIRECTION].copy()  # receives the conditioning path below
        support = self.support(dlogits)

        # Magnitude before direction: it adds to the direction branch's logit gradient.
        order = (MAGNITUDE,) + tuple(d for d in range(len(self.sizes)) if d != MAGNITUDE)
        for d in order:
            bc = c["branches"][d]
            dl = dlog[d]
            dadv = dl - dl.mean(axis=1, keepdims=True)  # through  A - mean_a A
            dh = dadv.reshape(B, -1)
            dh_in, g[f"branch{d}.w_out"], g[f"branch{d}.b_out"] = L.linear_backward(
                bc["h"], p[f"branch{d}.w_out"], dh
            )
            dgate = dh_in * bc["val"]
            dval = dh_in * bc["gate"]
            dpre, gg = self.gate.backward(xp, gp, d, bc["gcache"], dgate)
            for k, val in gg.items():
                ggate[k] = ggate[k] + val if k in ggate else val
            w_gate, w_val = self.glu_weights(p, d)
            du1, gw_gate, g[f"branch{d}.b_gate"] = L.linear_backward(bc["u"], w_gate, dpre)
            du2, gw_val, g[f"branch{d}.b_val"] = L.linear_backward(bc["u"], w_val, dval)
            base = self.base_width(d)
            for w, gw in (("w_gate", gw_gate), ("w_val", gw_val)):
                g[f"branch{d}.{w}"] = gw[:base]
                if self.extra_width[d]:
                    g[f"branch{d}.{w}_in"] = gw[base:]
            du = du1 + du2
            dz += du[:, :H2]
            col = H2
            if d == MAGNITUDE:
                n_dir = self.sizes[DIRECTION]
                dq_dir = du[:, col : col + n_dir] / self.q_scale
                col += n_dir
                # dQ_a / dlogit_{a,j} = p_{a,j} (z_j - Q_a)
                pdir = out.probs[:, : self.sizes[DIRECTION], :]
                dlog[DIRECTION] += dq_dir[:, :, None] * pdir * (support - c["q_dir"][:, :, None])
            for i, st in enumerate(self.branch_inputs):
                if d in st.branches:
                    dcols = du[:, col : col + st.width]
                    gextra[i] = dcols if gextra[i] is None else gextra[i] + dcols
                    col += st.width

        dv = sum(dl.sum(axis=1) for dl in dlog)  # V enters every action's logits
        dz_v, g["value.w"], g["value.b"] = L.linear_backward(c["z"], p["value.w"], dv)
        dz += dz_v
        dh2 = dz * c["m"]
        dm = dz * c["h2"]
        dmpre = L.sigmoid_backward(c["m"], dm)
        dh2_m, g["vsn.w"], g["vsn.b"] = L.linear_backward(c["h2"], p["vsn.w"], dmpre)
        dh2 = L.relu_backward(c["h2"], dh2 + dh2_m)
        dh1, g["trunk.w2"], g["trunk.b2"] = L.linear_backward(c["h1"], p["trunk.w2"], dh2)
        dh1 = L.relu_backward(c["h1"], dh1)
        _, g["trunk.w1"], g["trunk.b1"] = L.linear_backward(c["obs"], p["trunk.w1"], dh1)

        grads: ParamTree = {"core": g}
        if self.gate.name in params and self.gate.name != "core":
            grads[self.gate.name] = {k: ggate.get(k, xp.zeros_like(v)) for k, v in gp.items()}
        for i, st in enumerate(self.branch_inputs):
            if st.name in params:
                dcols = gextra[i] if gextra[i] is not None else xp.zeros_like(c["extra_cols"][i])
                grads[st.name] = st.backward(xp, params[st.name], c["extra_caches"][i], dcols)
        return grads
