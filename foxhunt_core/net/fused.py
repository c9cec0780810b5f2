"""The network's forward and backward on the GPU with fused kernels (CuPy, float32).

Same mathematics as :mod:`foxhunt_core.net.network` (its NumPy reference), arranged for the
device so that each activation makes as few trips through memory as possible:

* GEMMs through cuBLASLt (:mod:`foxhunt_core.gpu.cublas`) with the trunk's bias + ReLU and the
  VSN bias fused into the GEMM's epilogue; the VSN mask, the GLU and dueling
  aggregation + log-softmax + E[Q] + Var[Q] each in one kernel (:mod:`foxhunt_core.gpu.kernels`);
* each GLU's gate and value weights sit side by side in one [K, 2H] block of the flat parameter
  buffer (their biases in one [2H] vector): one GEMM computes both pre-activations, and the
  backward has one weight-gradient GEMM, one bias column sum and one input-gradient GEMM
  (K = 2H) per branch;
* a branch's input columns beyond the shared features ``z`` (the magnitude branch's direction Q,
  branch-input stages) are never concatenated to ``z``: their rank-E share of the
  pre-activations is added inside the GLU kernel, and their gradients come from small GEMMs;
* the GLU forward writes only its output ``h``: the backward recomputes the gate and the value
  from the GEMM output it keeps (and writes their gradients over it);
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


def storage_shapes(net: Any) -> dict[str, Any]:
    """How this path wants the core's weights stored (a :class:`~foxhunt_core.gpu.flat.FlatTree`
    storage spec, ``{name: block shape or Shared(...)}``):

    * zero-padded blocks for the value head's and each branch's output columns (51 -> 52,
      153 -> 156) and the trunk's input rows (the observation's 50 features -> 52), so that cuBLAS
      runs those GEMMs on its aligned kernels;
    * each GLU's gate and value weights side by side in one [K, 2 adv_h] block (K the branch's
      input width rounded up to 4: the magnitude branch's ``shared_h2`` + the direction Q), and
      its two biases in one [2 adv_h] vector: one GEMM computes both pre-activations, and the
      backward has one input-gradient GEMM (K = 2 adv_h), one weight-gradient GEMM and one
      bias column sum per branch instead of two each.
    """
    from ..gpu.flat import Shared

    s, N = net.settings, net.num_atoms
    out: dict[str, Any] = {}
    for name, shape, block in (("trunk.w1", (s.state_dim, s.shared_h1), (padded(s.state_dim), s.shared_h1)),
                               ("value.w", (s.shared_h2, N), (s.shared_h2, padded(N)))):
        if shape != block:
            out[name] = block
    for d, n in enumerate(net.sizes):
        if padded(n * N) != n * N:
            out[f"branch{d}.w_out"] = (s.adv_h, padded(n * N))
        out[f"branch{d}.w_gate"] = (padded(net.in_width[d]), 2 * s.adv_h)
        out[f"branch{d}.w_val"] = Shared(f"branch{d}.w_gate", s.adv_h)
        out[f"branch{d}.b_gate"] = (2 * s.adv_h,)
        out[f"branch{d}.b_val"] = Shared(f"branch{d}.b_gate", s.adv_h)
    return out


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


def _glu_joint(sub: Any, d: int, rows: int) -> tuple[Array, Array]:
    """Branch ``d``'s GLU weights ``[W_gate | W_val]`` [rows, 2H] and biases ``[b_gate | b_val]``
    [2H]: the flat buffer's joint blocks when the tree has them, else joined copies."""
    import cupy as cp

    wg, wv = sub[f"branch{d}.w_gate"], sub[f"branch{d}.w_val"]
    H = wg.shape[1]
    w, b = storage_of(sub, f"branch{d}.w_gate"), storage_of(sub, f"branch{d}.b_gate")
    if w is None or tuple(w.shape) != (rows, 2 * H) or storage_of(sub, f"branch{d}.w_val") is not w:
        w = cp.zeros((rows, 2 * H), dtype=wg.dtype)
        w[: wg.shape[0], :H] = wg
        w[: wv.shape[0], H:] = wv
    if b is None or tuple(b.shape) != (2 * H,) or storage_of(sub, f"branch{d}.b_val") is not b:
        b = cp.concatenate([sub[f"branch{d}.b_gate"], sub[f"branch{d}.b_val"]])
    return w, b


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


def pairs(net: Any) -> bool:
    """Whether :func:`forward` can carry the rows of ``next_obs`` along: with the sigmoid gate
    and no branch-input stages (plugin stages keep per-call caches of their own rows)."""
    from .network import SigmoidGate

    return isinstance(net.gate, SigmoidGate) and not net.branch_inputs


def forward(net: Any, params: dict, obs: Array, keep_cache: bool,
            outputs: Sequence[str] = ALL_OUTPUTS, next_obs: Array | None = None) -> Any:
    """The forward for ``obs`` [B, S]. With ``next_obs`` [B', S] (the update: its online forwards
    on s and s' share the weights) and :func:`pairs`, the rows of ``next_obs`` are carried along
    in the same GEMMs and kernels — half the launches of two forwards, which is what limits
    small batches — and only their E[Q] is written (``NetOutput.q_next``); the cache keeps the
    rows of ``obs`` alone (the hand-written backward never touches the others, so they cost no
    backward work)."""
    import cupy as cp

    from .network import NetOutput, SigmoidGate

    p = params["core"]
    gp = params.get(net.gate.name, {})
    sigmoid_gate = isinstance(net.gate, SigmoidGate)
    if next_obs is not None and not pairs(net):
        next_obs = None
    B, N, A = obs.shape[0], net.num_atoms, net.num_actions
    R = B + (0 if next_obs is None else next_obs.shape[0])  # rows through the network
    H2, H = net.settings.shared_h2, net.settings.adv_h
    offs = net.offsets
    want = tuple(ALL_OUTPUTS if keep_cache else outputs)  # the backward reads probs and q
    z_sup = net.support(obs)
    S = obs.shape[1]
    x = obs
    if padded(S) != S or R > B:  # the observations (both sets), zero columns up to a multiple of 4
        x = cp.empty((R, padded(S)), dtype=cp.float32)
        x[:B, :S] = obs
        if R > B:
            x[B:, :S] = next_obs
        if padded(S) != S:
            x[:, S:] = 0.0
    h1 = mm(x, _block(p, "trunk.w1", (x.shape[1], net.settings.shared_h1)), bias=p["trunk.b1"], relu=True)
    h2 = mm(h1, p["trunk.w2"], bias=p["trunk.b2"], relu=True)
    mpre = mm(h2, p["vsn.w"], bias=p["vsn.b"])
    m, z = K.vsn_forward(h2, mpre, m=mpre, keep=keep_cache)
    Nv = padded(N)
    hcol = head_columns(offs, N, HEAD_ALIGN)  # each branch's block of the advantage row
    v = mm(z, _block(p, "value.w", (H2, Nv)))  # [R, Nv]; its bias is added by the dueling kernel

    extra_cols, extra_caches = [], []
    for st in net.branch_inputs:
        cols, c = st.forward(cp, params.get(st.name, {}), obs)
        extra_cols.append(cp.ascontiguousarray(cols))
        extra_caches.append(c)

    adv = cp.empty((R, hcol[-1]), dtype=cp.float32)
    adv_bias = cp.concatenate([p[f"branch{d}.b_out"] for d in range(len(net.sizes))]).reshape(A, N)
    log_probs = cp.empty((B, A, N), dtype=cp.float32) if "log_probs" in want else None
    probs = cp.empty((B, A, N), dtype=cp.float32) if "probs" in want else None
    q = cp.empty((R, A), dtype=cp.float32)
    var = cp.empty((B, A), dtype=cp.float32) if "var" in want else None
    outs = dict(log_probs=log_probs, probs=probs, q=q[:B], var=var)

    def dueling(branches: tuple[int, int], want_here: tuple[str, ...]) -> None:
        K.dueling_softmax_forward(v[:B], adv[:B], z_sup, offs, branches=branches, v_bias=p["value.b"],
                                  adv_bias=adv_bias, want=want_here, **outs)
        if R > B:  # the rows of next_obs: E[Q] only
            K.dueling_softmax_forward(v[B:], adv[B:], z_sup, offs, branches=branches, v_bias=p["value.b"],
                                      adv_bias=adv_bias, want=("q",), q=q[B:])

    branches: list[dict[str, Any]] = [dict() for _ in net.sizes]
    D = len(net.sizes)
    for d in (DIRECTION,) + tuple(i for i in range(D) if i != DIRECTION):
        width = net.in_width[d]
        wj, bj = _glu_joint(p, d, padded(width))  # [W_gate | W_val], [b_gate | b_val]
        xe = _extra_inputs(net, d, q, extra_cols)
        pv = mm(z, wj[:H2])  # [z W_gate | z W_val], [R, 2H]
        if sigmoid_gate:  # only h is written: the backward recomputes gate and value from pv
            h = K.glu_forward(pv, bias=bj, x_extra=xe, w_extra=wj[H2:width] if xe is not None else None)
            gate = gcache = val = None
        else:
            if xe is not None:
                mm(xe, wj[H2:width], out=pv, beta=1.0)
            pv += bj
            pre, val = pv[:, :H], pv[:, H:]
            gate, gcache = net.gate.forward(cp, gp, d, pre)
            h = gate * val
        mm(h, _block(p, f"branch{d}.w_out", (H, hcol[d + 1] - hcol[d])), out=adv[:, hcol[d] : hcol[d + 1]])
        if d == DIRECTION:  # the magnitude branch reads the direction branch's expected Q
            dueling((0, 1), want + ("q",))
        if keep_cache:  # the rows of obs (views; the backward writes over pv's)
            branches[d] = dict(xe=None if xe is None else xe[:B], pv=pv[:B], gate=gate, gcache=gcache,
                               val=val, h=h[:B])
    dueling((1, D), want)
    cache = None
    if keep_cache:
        cache = dict(fused=True, x=x[:B], h1=h1[:B], h2=h2[:B], m=m[:B], z=z[:B], branches=branches,
                     q=q[:B], extra_cols=extra_cols, extra_caches=extra_caches)
    # The kernel returns normalised logits (log-probabilities); they differ from the raw dueling
    # logits by a per-distribution constant, which no consumer depends on.
    return NetOutput(log_probs, probs, log_probs, cache, q=q[:B], var=var, q_next=q[B:] if R > B else None)


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

    def glu_grad_blocks(d: int, rows: int) -> tuple[Array, Array]:
        """Where branch ``d``'s joint GLU gradients go: the gradient buffer's joint blocks, or
        scratch blocks whose halves are copied into the slots at the end."""
        names = (f"branch{d}.w_gate", f"branch{d}.w_val", f"branch{d}.b_gate", f"branch{d}.b_val")
        sg, sv, sbg, sbv = (slot(n) for n in names)
        w, b = storage_of(slots, names[0]), storage_of(slots, names[2])
        if (w is None or tuple(w.shape) != (rows, 2 * H) or storage_of(slots, names[1]) is not w
                or names[0] not in slots):
            w = cp.empty((rows, 2 * H), dtype=cp.float32)
            pending.extend([(sg, w[:, :H]), (sv, w[:, H:])])
        if b is None or tuple(b.shape) != (2 * H,) or storage_of(slots, names[3]) is not b or names[2] not in slots:
            b = cp.empty(2 * H, dtype=cp.float32)
            pending.extend([(sbg, b[:H]), (sbv, b[H:])])
        return w, b

    def branch_backward(d: int) -> Array | None:
        nonlocal dz_started
        bc = c["branches"][d]
        width = net.in_width[d]
        wj, bj = _glu_joint(p, d, padded(width))
        wide = (H, hcol[d + 1] - hcol[d])
        dh = dadv[:, hcol[d] : hcol[d + 1]]  # zeros in the padding
        dh_in = mm(dh, _block(p, f"branch{d}.w_out", wide).T)
        mm(bc["h"].T, dh, out=slot_block(f"branch{d}.w_out", wide))
        colsum(dh[:, : (offs[d + 1] - offs[d]) * N], slot(f"branch{d}.b_out"))
        xe = bc["xe"]
        dpv = bc["pv"]  # [d pre_gate | d val], written over the forward's [pre_gate | val]
        if sigmoid_gate:
            K.glu_backward(dh_in, dpv, bias=bj, x_extra=xe, w_extra=wj[H2:width] if xe is not None else None,
                           dpv=dpv)
        else:
            dpre, gg = net.gate.backward(cp, gp, d, bc["gcache"], dh_in * bc["val"])
            cp.multiply(dh_in, bc["gate"], out=dpv[:, H:])
            dpv[:, :H] = dpre
            for k, val in gg.items():
                ggate[k] = ggate[k] + val if k in ggate else val
        # The weight gradient reduces over the B rows into a small [K, 2H] output (split-K in
        # cuBLAS), so the branch's whole input is formed once, padded to a multiple of 4
        # columns, rather than its few extra columns being a product of their own.
        if xe is None and padded(width) == width:
            u = z
        else:  # [z, xe, zeros]
            u = cp.empty((B, padded(width)), dtype=cp.float32)
            u[:, :H2] = z
            if xe is not None:
                u[:, H2:width] = xe
            u[:, width:] = 0.0
        gw, gb = glu_grad_blocks(d, padded(width))
        mm(u.T, dpv, out=gw)
        colsum(dpv, gb)
        mm(dpv, wj[:H2].T, out=dz, beta=1.0 if dz_started else 0.0)  # K = 2H: gate and value at once
        dz_started = True
        if xe is None:
            return None
        # The extra rows' input gradient, 4 wide over the block's padded rows (aligned).
        return mm(dpv, wj[H2:].T)[:, : width - H2]

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
        dst[...] = blk[tuple(slice(0, n) for n in dst.shape)]

    grads = {"core": g}
    if net.gate.name in params and net.gate.name != "core":
        grads[net.gate.name] = {k: ggate.get(k, cp.zeros_like(v)) for k, v in gp.items()}
    for i, st in enumerate(net.branch_inputs):
        if st.name in params:
            dcols = gextra[i] if gextra[i] is not None else cp.zeros_like(c["extra_cols"][i])
            grads[st.name] = st.backward(cp, params[st.name], c["extra_caches"][i], cp.ascontiguousarray(dcols))
    return grads
