"""The network's forward and backward on the GPU with fused kernels (CuPy, float32).

Same mathematics as :mod:`foxhunt_core.net.network` (its NumPy reference), arranged for the
device so that each activation makes as few trips through memory as possible:

* GEMMs through cuBLASLt (:mod:`foxhunt_core.gpu.cublas`) with the trunk's bias + ReLU and the
  VSN bias fused into the GEMM's epilogue; the VSN mask, the GLU and dueling
  aggregation + log-softmax + E[Q] + Var[Q] each in one kernel (:mod:`foxhunt_core.gpu.kernels`);
* the gate and value halves of a GLU are one strided-batched GEMM in the forward (their weights
  sit at a fixed distance in the flat parameter buffer);
* a branch's input columns beyond the shared features ``z`` (the magnitude branch's direction Q,
  branch-input stages) are never concatenated to ``z``: their rank-E share of the
  pre-activations is added inside the GLU kernel, and their gradients come from small GEMMs;
* the GLU forward writes only its output ``h``: the backward recomputes the gate and the value
  from the two GEMM outputs it keeps (and writes their gradients over them);
* the advantage GEMMs write straight into one advantage buffer, and the value and advantage
  biases are added by the dueling kernel as it reads them;
* the 51-column value head and each branch's 153-column advantage block are computed 52 and 156
  columns wide over zero-padded weights (:func:`storage_shapes`; the flat parameter buffers keep
  those weights in padded blocks), and a 259-wide branch input as 260: cuBLAS runs a GEMM on its
  aligned kernels only when every extent is a multiple of 4 floats, and its ``align1`` kernels
  were measured at a third of the speed. The dueling kernels skip the padding columns, and the
  backward writes zeros into those of the gradients, so the padding of the weights stays zero;
* a forward can skip outputs nobody reads (``outputs``): the bootstrap needs only E[Q] from the
  online network and only the probabilities from the target network;
* the backward accumulates input gradients in place (GEMMs with ``beta = 1``) and can write the
  weight gradients straight into the optimizer's flat gradient buffer (``grads_into``).

Plugin stages (a gate activation, branch-input columns) run their own forward/backward here
exactly as in the reference, so they are captured in the same CUDA graph.
``tests/gpu/test_update_gpu.py`` checks this path against the NumPy one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..gpu import cublas
from ..gpu import kernels as K
from ..gpu.flat import storage_of
from ..gpu.launch import HEAD_ALIGN, head_columns, padded

Array = Any
Shape = tuple[int, ...]
DIRECTION, MAGNITUDE = 0, 1
ALL_OUTPUTS = ("log_probs", "probs", "q", "var")


def mm(a: Array, b: Array, out: Array | None = None, beta: float = 0.0, **epilogue: Any) -> Array:
    """``a @ b`` through :func:`foxhunt_core.gpu.cublas.matmul` (``bias`` and ``relu`` fused into
    the GEMM where cuBLASLt can)."""
    return cublas.matmul(a, b, out=out, beta=beta, **epilogue)


def colsum(x: Array, out: Array) -> Array:
    """Column sums of ``x`` [B, H] (any row stride) into ``out`` [H]: a GEMM with a ones row,
    which cuBLAS runs as a gemv. (CuPy's axis-0 reduction is slow, and cuBLASLt's bias-gradient
    epilogue runs as a separate kernel that measured ~4x slower than the gemv.)"""
    return mm(cublas.ones_row(x.shape[0], x.dtype), x, out=out.reshape(1, -1))


def storage_shapes(net: Any) -> dict[str, Shape]:
    """The core weights this path wants in zero-padded blocks, ``{name: (rows, cols)}``: the
    value head's and each branch's output columns, and the input rows of the trunk and of a
    branch whose input width is not a multiple of 4 (the observation's 50 features; the
    magnitude branch's ``shared_h2`` + the direction Q)."""
    s, N = net.settings, net.num_atoms
    out = {"trunk.w1": ((s.state_dim, s.shared_h1), (padded(s.state_dim), s.shared_h1)),
           "value.w": ((s.shared_h2, N), (s.shared_h2, padded(N)))}
    for d, n in enumerate(net.sizes):
        out[f"branch{d}.w_out"] = ((s.adv_h, n * N), (s.adv_h, padded(n * N)))
        k = net.in_width[d]
        for w in ("w_gate", "w_val"):
            out[f"branch{d}.{w}"] = ((k, s.adv_h), (padded(k), s.adv_h))
    return {name: block for name, (shape, block) in out.items() if shape != block}


def _block(sub: Any, name: str, shape: Shape) -> Array:
    """The weight ``sub[name]`` as a ``shape`` block: its padded storage when the tree has it
    (a flat buffer's), else a zero-padded copy."""
    import cupy as cp

    w = sub[name]
    if tuple(w.shape) == shape:
        return w
    blk = storage_of(sub, name)
    if blk is not None and tuple(blk.shape) == shape:
        return blk
    blk = cp.zeros(shape, dtype=w.dtype)
    blk[: w.shape[0], : w.shape[1]] = w
    return blk


def _extra_inputs(net: Any, d: int, q: Array, extra_cols: list[Array]) -> Array | None:
    """The columns of branch ``d``'s input beyond ``z`` ([B, E], small), or None."""
    import cupy as cp

    parts = []
    if d == MAGNITUDE:
        n_dir = net.sizes[DIRECTION]
        parts.append(q[:, :n_dir] * (1.0 / net.q_scale))
    parts += [cols for st, cols in zip(net.branch_inputs, extra_cols) if d in st.branches]
    if not parts:
        return None
    return cp.ascontiguousarray(cp.concatenate(parts, axis=1) if len(parts) > 1 else parts[0])


def forward(net: Any, params: dict, obs: Array, keep_cache: bool,
            outputs: Sequence[str] = ALL_OUTPUTS) -> Any:
    import cupy as cp

    from .network import NetOutput, SigmoidGate

    p = params["core"]
    gp = params.get(net.gate.name, {})
    sigmoid_gate = isinstance(net.gate, SigmoidGate)
    B, N, A = obs.shape[0], net.num_atoms, net.num_actions
    H2, H = net.settings.shared_h2, net.settings.adv_h
    offs = net.offsets
    want = tuple(ALL_OUTPUTS if keep_cache else outputs)  # the backward reads probs and q
    z_sup = net.support(obs)
    S = obs.shape[1]
    x = obs
    if padded(S) != S:  # the observation with zero columns up to a multiple of 4
        x = cp.empty((B, padded(S)), dtype=cp.float32)
        x[:, :S] = obs
        x[:, S:] = 0.0
    h1 = mm(x, _block(p, "trunk.w1", (x.shape[1], net.settings.shared_h1)), bias=p["trunk.b1"], relu=True)
    h2 = mm(h1, p["trunk.w2"], bias=p["trunk.b2"], relu=True)
    mpre = mm(h2, p["vsn.w"], bias=p["vsn.b"])
    m, z = K.vsn_forward(h2, mpre, m=mpre, keep=keep_cache)
    Nv = padded(N)
    hcol = head_columns(offs, N, HEAD_ALIGN)  # each branch's block of the advantage row
    v = mm(z, _block(p, "value.w", (H2, Nv)))  # [B, Nv]; its bias is added by the dueling kernel

    extra_cols, extra_caches = [], []
    for st in net.branch_inputs:
        cols, c = st.forward(cp, params.get(st.name, {}), obs)
        extra_cols.append(cp.ascontiguousarray(cols))
        extra_caches.append(c)

    adv = cp.empty((B, hcol[-1]), dtype=cp.float32)
    adv_bias = cp.concatenate([p[f"branch{d}.b_out"] for d in range(len(net.sizes))]).reshape(A, N)
    log_probs = cp.empty((B, A, N), dtype=cp.float32) if "log_probs" in want else None
    probs = cp.empty((B, A, N), dtype=cp.float32) if "probs" in want else None
    q = cp.empty((B, A), dtype=cp.float32)
    var = cp.empty((B, A), dtype=cp.float32) if "var" in want else None
    outs = dict(log_probs=log_probs, probs=probs, q=q, var=var)

    def dueling(branches: tuple[int, int], want_here: tuple[str, ...]) -> None:
        K.dueling_softmax_forward(v, adv, z_sup, offs, branches=branches, v_bias=p["value.b"],
                                  adv_bias=adv_bias, want=want_here, **outs)

    branches: list[dict[str, Any]] = [dict() for _ in net.sizes]
    D = len(net.sizes)
    for d in (DIRECTION,) + tuple(i for i in range(D) if i != DIRECTION):
        wg, wv = p[f"branch{d}.w_gate"], p[f"branch{d}.w_val"]
        xe = _extra_inputs(net, d, q, extra_cols)
        pv = cp.empty((2, B, H), dtype=cp.float32)  # [z W_gate, z W_val]
        cublas.matmul_group([z, z], [wg[:H2], wv[:H2]], [pv[0], pv[1]])
        if sigmoid_gate:  # only h is written: the backward recomputes gate and value from pv
            gate, h = K.glu_forward(
                pv[0], pv[1], gate_bias=p[f"branch{d}.b_gate"], val_bias=p[f"branch{d}.b_val"],
                x_extra=xe, w_extra_gate=wg[H2:], w_extra_val=wv[H2:], keep=False)
            gcache, val = None, None
        else:
            pre, val = pv[0], pv[1]
            if xe is not None:
                mm(xe, wg[H2:], out=pre, beta=1.0)
                mm(xe, wv[H2:], out=val, beta=1.0)
            pre += p[f"branch{d}.b_gate"]
            val += p[f"branch{d}.b_val"]
            gate, gcache = net.gate.forward(cp, gp, d, pre)
            h = gate * val
        mm(h, _block(p, f"branch{d}.w_out", (H, hcol[d + 1] - hcol[d])), out=adv[:, hcol[d] : hcol[d + 1]])
        if d == DIRECTION:  # the magnitude branch reads the direction branch's expected Q
            dueling((0, 1), want + ("q",))
        if keep_cache:
            branches[d] = dict(xe=xe, pv=pv, gate=gate, gcache=gcache, val=val, h=h)
    dueling((1, D), want)
    cache = None
    if keep_cache:
        cache = dict(fused=True, x=x, h1=h1, h2=h2, m=m, z=z, branches=branches, q=q,
                     extra_cols=extra_cols, extra_caches=extra_caches)
    # The kernel returns normalised logits (log-probabilities); they differ from the raw dueling
    # logits by a per-distribution constant, which no consumer depends on.
    return NetOutput(log_probs, probs, log_probs, cache, q=q, var=var)


def backward(net: Any, params: dict, out: Any, dlogits: Array, grads_into: dict | None = None) -> dict:
    """Gradients of every parameter; ``grads_into`` (a tree of views, e.g. the optimizer's flat
    gradient buffer) receives the core's weight gradients in place when given."""
    import cupy as cp

    from .network import SigmoidGate

    c = out.cache
    p = params["core"]
    gp = params.get(net.gate.name, {})
    sigmoid_gate = isinstance(net.gate, SigmoidGate)
    B, A, N = dlogits.shape
    H2, H = net.settings.shared_h2, net.settings.adv_h
    offs = net.offsets
    D = len(net.sizes)
    z_sup = net.support(dlogits)
    dlogits = cp.ascontiguousarray(dlogits)
    slots = (grads_into or {}).get("core", {})
    g: dict[str, Array] = {}
    pending: list[tuple[Array, Array]] = []
    Nv = padded(N)
    hcol = head_columns(offs, N, HEAD_ALIGN)

    def slot(name: str) -> Array:
        s = slots.get(name)
        g[name] = s if s is not None else cp.empty(p[name].shape, dtype=cp.float32)
        return g[name]

    def slot_block(name: str, shape: Shape) -> Array:
        """Where a weight gradient of ``shape`` (padded) goes: the slot's padded storage, or a
        scratch block copied into the slot at the end."""
        s = slot(name)
        if tuple(s.shape) == shape:
            return s
        blk = storage_of(slots, name) if name in slots else None
        if blk is not None and tuple(blk.shape) == shape:
            return blk
        blk = cp.empty(shape, dtype=cp.float32)
        pending.append((s, blk))
        return blk

    ggate: dict[str, Array] = {}
    gextra: list[Any] = [None] * len(net.branch_inputs)
    z = c["z"]
    dz = cp.empty((B, H2), dtype=cp.float32)
    dz_started = False

    # Every branch but direction first: the magnitude branch's input gradient reaches the
    # direction branch's Q, which then enters the direction branch's logit gradient.
    dv, dadv = K.dueling_backward(dlogits, z_sup, offs, branches=(1, D), padded=True)

    def branch_backward(d: int) -> Array | None:
        nonlocal dz_started
        bc = c["branches"][d]
        wg, wv = p[f"branch{d}.w_gate"], p[f"branch{d}.w_val"]
        wide = (H, hcol[d + 1] - hcol[d])
        dh = dadv[:, hcol[d] : hcol[d + 1]]  # zeros in the padding
        dh_in = mm(dh, _block(p, f"branch{d}.w_out", wide).T)
        mm(bc["h"].T, dh, out=slot_block(f"branch{d}.w_out", wide))
        colsum(dh[:, : (offs[d + 1] - offs[d]) * N], slot(f"branch{d}.b_out"))
        if sigmoid_gate:  # [d pre_gate, d val], in place of the forward's [pre_gate, val]
            dpv = bc["pv"]
            K.glu_backward_recompute(
                dh_in, dpv[0], dpv[1], gate_bias=p[f"branch{d}.b_gate"], val_bias=p[f"branch{d}.b_val"],
                x_extra=bc["xe"], w_extra_gate=wg[H2:], w_extra_val=wv[H2:], dpre_gate=dpv[0], dval=dpv[1])
        else:
            dpv = cp.empty((2, B, H), dtype=cp.float32)  # [d pre_gate, d val]
            dpre, gg = net.gate.backward(cp, gp, d, bc["gcache"], dh_in * bc["val"])
            dpv[0] = dpre
            cp.multiply(dh_in, bc["gate"], out=dpv[1])
            for k, val in gg.items():
                ggate[k] = ggate[k] + val if k in ggate else val
        # Weight gradients reduce over the B rows into a small [K, H] output, which cuBLAS only
        # runs fast with split-K — which it never picks for a strided-batched call (measured:
        # ~0.6 ms for the pair against ~0.1 ms as two GEMMs at B = 65536). For the same reason
        # the branch's whole input is formed once rather than its few extra columns being a
        # separate product of their own.
        xe = bc["xe"]
        width = net.in_width[d]
        if xe is None and padded(width) == width:
            u = z
        else:  # [z, xe, zeros]: the input, padded to a multiple of 4 columns
            u = cp.empty((B, padded(width)), dtype=cp.float32)
            u[:, :H2] = z
            if xe is not None:
                u[:, H2:width] = xe
            u[:, width:] = 0.0
        mm(u.T, dpv[0], out=slot_block(f"branch{d}.w_gate", (padded(width), H)))
        mm(u.T, dpv[1], out=slot_block(f"branch{d}.w_val", (padded(width), H)))
        colsum(dpv[0], slot(f"branch{d}.b_gate"))
        colsum(dpv[1], slot(f"branch{d}.b_val"))
        mm(dpv[0], wg[:H2].T, out=dz, beta=1.0 if dz_started else 0.0)
        mm(dpv[1], wv[:H2].T, out=dz, beta=1.0)
        dz_started = True
        if xe is None:
            return None
        # The extra rows' input gradient, 4-wide where the weights are stored padded (aligned).
        dxe = mm(dpv[0], _block(p, f"branch{d}.w_gate", (padded(width), H))[H2:].T)
        mm(dpv[1], _block(p, f"branch{d}.w_val", (padded(width), H))[H2:].T, out=dxe, beta=1.0)
        return dxe[:, : width - H2]

    dxes: dict[int, Array | None] = {MAGNITUDE: branch_backward(MAGNITUDE)}
    n_dir = net.sizes[DIRECTION]
    dq = cp.zeros((B, A), dtype=cp.float32)  # the conditioning path into direction Q
    dq[:, :n_dir] = dxes[MAGNITUDE][:, :n_dir] * (1.0 / net.q_scale)
    K.dueling_backward(dlogits, z_sup, offs, branches=(0, 1), accumulate_dv=True, dq=dq,
                       probs=out.probs, q=c["q"], dv=dv, dadv=dadv, padded=True)
    for d in range(D):
        if d != MAGNITUDE:
            dxes[d] = branch_backward(d)
    for d, dxe in dxes.items():
        col = n_dir if d == MAGNITUDE else 0
        for i, st in enumerate(net.branch_inputs):
            if d in st.branches:
                dcols = dxe[:, col : col + st.width]
                gextra[i] = dcols if gextra[i] is None else gextra[i] + dcols
                col += st.width

    mm(dv, _block(p, "value.w", (H2, Nv)).T, out=dz, beta=1.0)
    mm(z.T, dv, out=slot_block("value.w", (H2, Nv)))
    colsum(dv[:, :N], slot("value.b"))
    dh2_mask, dmpre = K.vsn_backward(dz, c["h2"], c["m"])
    mm(c["h2"].T, dmpre, out=slot("vsn.w"))
    colsum(dmpre, slot("vsn.b"))
    dh2 = K.relu_backward(dh2_mask, c["h2"], addend=mm(dmpre, p["vsn.w"].T))
    mm(c["h1"].T, dh2, out=slot("trunk.w2"))
    colsum(dh2, slot("trunk.b2"))
    dh1 = K.relu_backward(mm(dh2, p["trunk.w2"].T), c["h1"])
    mm(c["x"].T, dh1, out=slot_block("trunk.w1", tuple(c["x"].shape[1:]) + (dh1.shape[1],)))
    colsum(dh1, slot("trunk.b1"))
    for dst, blk in pending:
        dst[...] = blk[: dst.shape[0], : dst.shape[1]]

    grads = {"core": g}
    if net.gate.name in params and net.gate.name != "core":
        grads[net.gate.name] = {k: ggate.get(k, cp.zeros_like(v)) for k, v in gp.items()}
    for i, st in enumerate(net.branch_inputs):
        if st.name in params:
            dcols = gextra[i] if gextra[i] is not None else cp.zeros_like(c["extra_cols"][i])
            grads[st.name] = st.backward(cp, params[st.name], c["extra_caches"][i], cp.ascontiguousarray(dcols))
    return grads
