"""The network's forward and backward on the GPU with fused kernels (CuPy, float32).

Same mathematics as :mod:`foxhunt_core.net.network` (its NumPy reference), arranged for the
device: GEMMs through cuBLAS (:mod:`foxhunt_core.gpu.cublas`), bias + activation, the VSN mask,
the GLU, and dueling aggregation + log-softmax + expected Q + Var[Q] each in one kernel
(:mod:`foxhunt_core.gpu.kernels`). Plugin stages (a gate activation, branch-input columns) run
their own forward/backward here exactly as in the reference, so they are captured in the same
CUDA graph. ``tests/gpu/test_update_gpu.py`` checks this path against the NumPy one.
"""

from __future__ import annotations

from typing import Any

from ..gpu import kernels as K
from .layers import matmul as mm

Array = Any
DIRECTION, MAGNITUDE = 0, 1
_ONES: dict[tuple[int, int, str], Array] = {}


def colsum(x: Array) -> Array:
    """Column sums of ``x`` [B, H] as a GEMM with a ones row (CuPy's axis-0 reduction is slow)."""
    import cupy as cp

    key = (cp.cuda.Device().id, x.shape[0], str(x.dtype))
    ones = _ONES.get(key)
    if ones is None:
        ones = _ONES[key] = cp.ones((1, x.shape[0]), dtype=x.dtype)
    return mm(ones, x)[0]


def forward(net: Any, params: dict, obs: Array, keep_cache: bool) -> Any:
    import cupy as cp

    from .network import NetOutput, SigmoidGate

    p = params["core"]
    gp = params.get(net.gate.name, {})
    sigmoid_gate = isinstance(net.gate, SigmoidGate)
    B, N, A = obs.shape[0], net.num_atoms, net.num_actions
    offs = net.offsets
    z_sup = net.support(obs)
    h1 = K.bias_relu_forward(mm(obs, p["trunk.w1"]), p["trunk.b1"])
    h2 = K.bias_relu_forward(mm(h1, p["trunk.w2"]), p["trunk.b2"])
    m, z = K.vsn_forward(h2, mm(h2, p["vsn.w"]), bias=p["vsn.b"])
    v = mm(z, p["value.w"])
    v += p["value.b"]

    extra_cols, extra_caches = [], []
    for st in net.branch_inputs:
        cols, c = st.forward(cp, params.get(st.name, {}), obs)
        extra_cols.append(cols)
        extra_caches.append(c)

    adv = cp.empty((B, A, N), dtype=cp.float32)
    log_probs = cp.empty((B, A, N), dtype=cp.float32)
    probs = cp.empty_like(log_probs)
    q = cp.empty((B, A), dtype=cp.float32)
    var = cp.empty_like(q)
    branches: list[dict[str, Any]] = [dict() for _ in net.sizes]
    D = len(net.sizes)
    for d in (DIRECTION,) + tuple(i for i in range(D) if i != DIRECTION):
        parts = [z]
        if d == MAGNITUDE:
            parts.append(q[:, offs[0] : offs[1]] / net.q_scale)
        parts += [cols for st, cols in zip(net.branch_inputs, extra_cols) if d in st.branches]
        u = cp.concatenate(parts, axis=1) if len(parts) > 1 else z
        pre = mm(u, p[f"branch{d}.w_gate"])
        val = mm(u, p[f"branch{d}.w_val"])
        if sigmoid_gate:
            gate, h = K.glu_forward(pre, val, gate_bias=p[f"branch{d}.b_gate"], val_bias=p[f"branch{d}.b_val"])
            gcache = None
        else:
            pre += p[f"branch{d}.b_gate"]
            val += p[f"branch{d}.b_val"]
            gate, gcache = net.gate.forward(cp, gp, d, pre)
            h = gate * val
        out = mm(h, p[f"branch{d}.w_out"])
        out += p[f"branch{d}.b_out"]
        adv[:, offs[d] : offs[d + 1]] = out.reshape(B, net.sizes[d], N)
        if d == DIRECTION:  # the magnitude branch reads the direction branch's expected Q
            K.dueling_softmax_forward(v, adv, z_sup, offs, branches=(0, 1),
                                      log_probs=log_probs, probs=probs, q=q, var=var)
        branches[d] = dict(u=u, gate=gate, gcache=gcache, val=val, h=h)
    K.dueling_softmax_forward(v, adv, z_sup, offs, branches=(1, D), log_probs=log_probs, probs=probs, q=q, var=var)
    cache = None
    if keep_cache:
        cache = dict(fused=True, obs=obs, h1=h1, h2=h2, m=m, z=z, branches=branches, q=q,
                     extra_cols=extra_cols, extra_caches=extra_caches)
    # The kernel returns normalised logits (log-probabilities); they differ from the raw dueling
    # logits by a per-distribution constant, which no consumer depends on.
    return NetOutput(log_probs, probs, log_probs, cache, q=q, var=var)


def backward(net: Any, params: dict, out: Any, dlogits: Array) -> dict:
    import cupy as cp

    from .network import SigmoidGate

    c = out.cache
    p = params["core"]
    gp = params.get(net.gate.name, {})
    sigmoid_gate = isinstance(net.gate, SigmoidGate)
    B, H2 = dlogits.shape[0], net.settings.shared_h2
    offs = net.offsets
    z_sup = net.support(dlogits)
    g: dict[str, Array] = {}
    ggate: dict[str, Array] = {}
    gextra: list[Any] = [None] * len(net.branch_inputs)
    dq = cp.zeros((B, net.num_actions), dtype=cp.float32)  # conditioning path into direction Q

    def branch_backward(d: int, dadv_d: Array) -> Array:
        bc = c["branches"][d]
        dh = dadv_d.reshape(B, -1)
        dh_in = mm(dh, p[f"branch{d}.w_out"].T)
        g[f"branch{d}.w_out"] = mm(bc["h"].T, dh)
        g[f"branch{d}.b_out"] = colsum(dh)
        if sigmoid_gate:
            dpre, dval = K.glu_backward(dh_in, bc["gate"], bc["val"])
        else:
            dgate, dval = dh_in * bc["val"], dh_in * bc["gate"]
            dpre, gg = net.gate.backward(cp, gp, d, bc["gcache"], dgate)
            for k, val in gg.items():
                ggate[k] = ggate[k] + val if k in ggate else val
        u = bc["u"]
        du = mm(dpre, p[f"branch{d}.w_gate"].T)
        du += mm(dval, p[f"branch{d}.w_val"].T)
        g[f"branch{d}.w_gate"] = mm(u.T, dpre)
        g[f"branch{d}.b_gate"] = colsum(dpre)
        g[f"branch{d}.w_val"] = mm(u.T, dval)
        g[f"branch{d}.b_val"] = colsum(dval)
        return du

    # Magnitude first: its input gradient reaches the direction branch's Q.
    dl_mag = dlogits[:, offs[MAGNITUDE] : offs[MAGNITUDE + 1]]
    du_mag = branch_backward(MAGNITUDE, dl_mag - dl_mag.mean(axis=1, keepdims=True))
    n_dir = net.sizes[DIRECTION]
    dq[:, offs[0] : offs[1]] = du_mag[:, H2 : H2 + n_dir] / net.q_scale
    dlogits = cp.ascontiguousarray(dlogits)
    dv, dadv = K.dueling_backward(dlogits, z_sup, offs, dq=dq, probs=out.probs, q=c["q"])
    dz = du_mag[:, :H2].copy()
    dus = {MAGNITUDE: du_mag}
    for d in range(len(net.sizes)):
        if d == MAGNITUDE:
            continue
        du = branch_backward(d, dadv[:, offs[d] : offs[d + 1]])
        dus[d] = du
        dz += du[:, :H2]
    for d, du in dus.items():
        col = H2 + (n_dir if d == MAGNITUDE else 0)
        for i, st in enumerate(net.branch_inputs):
            if d in st.branches:
                dcols = du[:, col : col + st.width]
                gextra[i] = dcols if gextra[i] is None else gextra[i] + dcols
                col += st.width

    dz += mm(dv, p["value.w"].T)
    g["value.w"] = mm(c["z"].T, dv)
    g["value.b"] = colsum(dv)
    dh2_mask, dmpre = K.vsn_backward(dz, c["h2"], c["m"])
    g["vsn.w"] = mm(c["h2"].T, dmpre)
    g["vsn.b"] = colsum(dmpre)
    dh2 = K.relu_backward(dh2_mask, c["h2"], addend=mm(dmpre, p["vsn.w"].T))
    g["trunk.w2"] = mm(c["h1"].T, dh2)
    g["trunk.b2"] = colsum(dh2)
    dh1 = K.relu_backward(mm(dh2, p["trunk.w2"].T), c["h1"])
    g["trunk.w1"] = mm(c["obs"].T, dh1)
    g["trunk.b1"] = colsum(dh1)

    grads = {"core": g}
    if net.gate.name in params and net.gate.name != "core":
        grads[net.gate.name] = {k: ggate.get(k, cp.zeros_like(v)) for k, v in gp.items()}
    for i, st in enumerate(net.branch_inputs):
        if st.name in params:
            dcols = gextra[i] if gextra[i] is not None else cp.zeros_like(c["extra_cols"][i])
            grads[st.name] = st.backward(cp, params[st.name], c["extra_caches"][i], dcols)
    return grads
