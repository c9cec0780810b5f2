"""The network's forward and backward on the GPU with fused kernels (CuPy, float32).

Same mathematics as :mod:`foxhunt_core.net.network` (its NumPy reference), arranged for the
device so that each activation makes as few trips through memory as possible, and a step needs
as few launches as possible:

* **Biases ride in the GEMMs.** Where a layer's input is written by one of our kernels, the
  input carries a column of ones (``[x, 0, ..., 0, 1]``, "augmented") and the layer's bias is
  the last row of its weight block in the flat parameter buffer (:func:`storage_shapes`). The
  forward GEMM then adds the bias, and the backward's weight-gradient GEMM writes the bias
  gradient in the same call: no column-sum kernels and no bias reads in the kernels for the
  first trunk layer, the value head, the GLUs and the advantage layers. (The other two trunk
  layers take their input from a GEMM: their bias rides in cuBLASLt's epilogue.)
* **One augmented z for every head.** ``z`` is written ``[z, q_dir / q_scale, 0, ..., 0, 1]``:
  the magnitude branch's input columns (the direction branch's E[Q], written there by the
  direction branch's dueling kernel) sit in ``z`` itself, so the magnitude branch's GEMMs are
  the same as every branch's. The other heads' weight blocks have zero rows there.
* **Each GLU's gate and value weights side by side** in one [K, 2H] block: one GEMM computes both
  pre-activations; the backward has one weight-gradient GEMM and one input-gradient GEMM
  (K = 2H, all of the augmented z's columns at once) per branch. The GLU kernel writes only
  the augmented ``h``; the backward recomputes gate and value from the GEMM output it keeps.
* **Aligned extents.** The 51-column value head and each branch's 153-column advantage block are
  computed 52 and 156 columns wide over zero-padded weights, every augmented input is a
  multiple of 4 wide: cuBLAS runs a GEMM on its aligned kernels only when every extent is a
  multiple of 4 floats (its ``align1`` kernels measured a third of the speed). The dueling kernels
  skip the padding columns, and the backward writes zeros into those of the gradients, so the
  padding of the weights stays zero.
* **Several forwards as one** (:func:`forward_segments`): the update's online forwards on s and
  s' share the weights, and with the target network's parameters in a stacked buffer
  (:meth:`foxhunt_core.gpu.flat.FlatTree.stacked`) its forward on s' runs in the same
  strided-batched GEMMs and kernels too. Each forward (segment) writes only what its caller
  reads: the bootstrap needs only E[Q] from the online network and the probabilities from the
  target network.
* The advantage GEMMs write straight into one advantage buffer; the backward accumulates input
  gradients in place (GEMMs with ``beta = 1``) and writes the weight gradients straight into the
  optimizer's flat gradient buffer (``grads_into``).

Plugin stages (a gate activation, branch-input columns) run their own forward/backward here
exactly as in the reference, so they are captured in the same CUDA graph; with them each
forward runs on its own, and a branch with extra input columns forms its augmented input
explicitly. ``tests/gpu/test_update_gpu.py`` checks this path against the NumPy one, and
``tests/net/test_fused_arrangement.py`` runs this very code over NumPy twins of the kernels.
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


def mm(a: Array, b: Array, out: Array | None = None, beta: float = 0.0, **kw: Any) -> Array:
    """``a @ b`` through :func:`foxhunt_core.gpu.cublas.matmul` (``bias`` and ``relu`` fused into
    the GEMM where cuBLASLt can; ``stack`` for stacked parameter trees)."""
    return cublas.matmul(a, b, out=out, beta=beta, **kw)


def colsum(x: Array, out: Array) -> Array:
    """Column sums of ``x`` [B, H] (any row stride) into ``out`` [H]: a GEMM with a ones row,
    which cuBLAS runs as a gemv (for the two trunk layers whose input has no ones column)."""
    return mm(cublas.ones_row(x.shape[0], x.dtype), x, out=out.reshape(1, -1))


# ------------------------------------------------------------------ layout
def x_width(net: Any) -> int:
    """Width of the augmented observation ``[obs, 0, ..., 0, 1]``."""
    return padded(net.settings.state_dim + 1)


def z_width(net: Any) -> int:
    """Width of the augmented ``z`` = ``[z, q_dir / q_scale, 0, ..., 0, 1]``."""
    return padded(net.settings.shared_h2 + net.sizes[DIRECTION] + 1)


def h_width(net: Any) -> int:
    """Width of a GLU's augmented output ``[h, 0, ..., 0, 1]``."""
    return padded(net.settings.adv_h + 1)


def glu_rows(net: Any, d: int) -> int:
    """Rows of branch ``d``'s GLU block: the augmented z's width, or for a branch with extra input
    columns its own augmented input ``[z, (q_dir), extra columns, 0, ..., 0, 1]``."""
    if not net.extra_width[d]:
        return z_width(net)
    return padded(net.in_width[d] + 1)


def blocks(net: Any) -> dict[str, tuple[Shape, list[tuple[str, int | None, int]]]]:
    """The core's weight blocks on this path: ``{block: (shape, [(tensor, row, col), ...])}``.
    The first tensor is the block's home (top-left corner); ``row`` None places a matrix at
    the top from column ``col``, an integer row places a vector (a bias: the block's last row,
    met by the input's ones column)."""
    s, N = net.settings, net.num_atoms
    H = s.adv_h
    wx, wz, wh = x_width(net), z_width(net), h_width(net)
    hcol = head_columns(net.offsets, N, HEAD_ALIGN)
    out = {
        "trunk.w1": ((wx, s.shared_h1), [("trunk.w1", None, 0), ("trunk.b1", wx - 1, 0)]),
        "value.w": ((wz, padded(N)), [("value.w", None, 0), ("value.b", wz - 1, 0)]),
    }
    for d in range(len(net.sizes)):
        r = glu_rows(net, d)
        out[f"branch{d}.w_gate"] = ((r, 2 * H), [
            (f"branch{d}.w_gate", None, 0), (f"branch{d}.w_val", None, H),
            (f"branch{d}.b_gate", r - 1, 0), (f"branch{d}.b_val", r - 1, H)])
        out[f"branch{d}.w_out"] = ((wh, hcol[d + 1] - hcol[d]), [
            (f"branch{d}.w_out", None, 0), (f"branch{d}.b_out", wh - 1, 0)])
    return out


def storage_shapes(net: Any) -> dict[str, Any]:
    """How this path wants the core's weights stored (a :class:`~foxhunt_core.gpu.flat.FlatTree`
    storage spec, ``{name: block shape or Shared(...)}``), from :func:`blocks`:

    * the first trunk layer [obs features + 1 rounded up to 4, H1] with ``b1`` in its last row;
    * the value head [z_width, N rounded up to 4] with its bias in the last row;
    * each GLU's gate and value weights side by side, [z_width, 2 adv_h], the two biases side by
      side in the last row (a branch with extra input columns: its own input width + 1,
      rounded up to 4);
    * each branch's advantage layer [adv_h + 1 rounded up to 4, n N rounded up to 4] with its
      bias in the last row.
    """
    from ..gpu.flat import Shared

    out: dict[str, Any] = {}
    for home, (shape, members) in blocks(net).items():
        out[home] = shape
        for name, row, col in members[1:]:
            out[name] = Shared(home, col, row)
    return out


def _placed(blk: Array, name_row_col: tuple[str, int | None, int], like: Array) -> Array:
    """The part of ``blk`` where a tensor shaped like ``like`` lives."""
    _, row, col = name_row_col
    if row is not None:
        return blk[row, col : col + like.shape[0]]
    return blk[: like.shape[0], col : col + like.shape[1]]


def _block(sub: Any, net: Any, home: str) -> Array:
    """Weight block ``home`` (:func:`blocks`) of the parameters ``sub``: the flat buffer's own
    block when ``sub`` has it, else a zero block with the tensors copied in."""
    import cupy as cp

    shape, members = blocks(net)[home]
    blk = storage_of(sub, home)
    if blk is not None and tuple(blk.shape) == shape and all(storage_of(sub, n) is blk for n, _, _ in members):
        return blk
    blk = cp.zeros(shape, dtype=sub[home].dtype)
    for m in members:
        _placed(blk, m, sub[m[0]])[...] = sub[m[0]]
    return blk


def pairs(net: Any) -> bool:
    """Whether several forwards can run as one (:func:`forward_segments`): with the sigmoid gate
    and no branch-input stages (plugin stages keep per-call caches of their own rows)."""
    from .network import SigmoidGate

    return isinstance(net.gate, SigmoidGate) and not net.branch_inputs


def _stride(net: Any, trees: Sequence[dict]) -> int | None:
    """Elements between the weight blocks of consecutive parameter trees when they are one
    stacked allocation (the same distance for every block), 0 when all are the same tree, None
    otherwise."""
    if all(t is trees[0] for t in trees):
        return 0
    names = list(blocks(net)) + ["trunk.w2", "trunk.b2", "vsn.w", "vsn.b"]
    stride = None
    for name in names:
        arrays = [storage_of(t["core"], name) if name in blocks(net) else t["core"][name] for t in trees]
        if any(a is None or a.shape != arrays[0].shape or a.strides != arrays[0].strides for a in arrays):
            return None
        ptrs = [_address(a) for a in arrays]
        step = ptrs[1] - ptrs[0]
        if step <= 0 or step % arrays[0].itemsize or any(p - ptrs[0] != i * step for i, p in enumerate(ptrs)):
            return None
        step //= arrays[0].itemsize
        if stride is not None and step != stride:
            return None
        stride = step
    return stride


def _address(a: Array) -> int:
    """Device (or host, for the NumPy check of this module) address of an array's first element."""
    ptr = getattr(a.data, "ptr", None)
    return int(ptr) if ptr is not None else int(a.__array_interface__["data"][0])


def forward(net: Any, params: dict, obs: Array, keep_cache: bool,
            outputs: Sequence[str] = ALL_OUTPUTS, next_obs: Array | None = None) -> Any:
    """The forward for ``obs`` [B, S]. With ``next_obs`` [B', S] (and :func:`pairs`) the rows of
    ``next_obs`` ride along in the same GEMMs and kernels and only their E[Q] is written
    (``NetOutput.q_next``); the cache keeps the rows of ``obs`` alone."""
    if next_obs is None or not pairs(net):
        return forward_segments(net, [(params, obs, outputs)], keep_cache)[0]
    out, nxt = forward_segments(net, [(params, obs, outputs), (params, next_obs, ("q",))], keep_cache)
    out.q_next = nxt.q
    return out


def forward_segments(net: Any, segments: Sequence[tuple[dict, Array, Sequence[str]]], keep_cache: bool) -> list:
    """Several forwards ``(params, obs, outputs)``, as few launches as the parameters allow; one
    :class:`~foxhunt_core.net.network.NetOutput` each, the first with its cache when
    ``keep_cache`` (it then has every output). Segments of one parameter tree run as one
    (their rows one after another); parameter trees stacked in one allocation (equal row counts)
    run as strided-batched GEMMs and segmented kernels; the rest separately. Without
    :func:`pairs` every segment runs on its own."""
    segs = list(segments)
    if not segs:
        return []
    if pairs(net):
        trees = [p for p, _, _ in segs]
        stride = _stride(net, trees)
        if stride is not None and (stride == 0 or len({x.shape[0] for _, x, _ in segs}) == 1) and len(segs) <= 3:
            return _forward_group(net, segs, keep_cache, stride)
    outs: list = []
    i = 0
    while i < len(segs):  # runs of one parameter tree, each as one forward
        j = i + 1
        while pairs(net) and j < len(segs) and j - i < 3 and segs[j][0] is segs[i][0]:
            j += 1
        outs += _forward_group(net, segs[i:j], keep_cache and i == 0, 0)
        i = j
    return outs


def _forward_group(net: Any, segs: Sequence[tuple[dict, Array, Sequence[str]]], keep_cache: bool,
                   stride: int) -> list:
    """Forwards that run as one: one tree (``stride`` 0) or stacked trees ``stride`` apart."""
    import cupy as cp

    from .network import NetOutput, SigmoidGate

    params = segs[0][0]
    p = params["core"]
    gp = params.get(net.gate.name, {})
    sigmoid_gate = isinstance(net.gate, SigmoidGate)
    xs = [x for _, x, _ in segs]
    rows = [x.shape[0] for x in xs]
    starts = [sum(rows[:i]) for i in range(len(rows) + 1)]
    B, R = rows[0], starts[-1]
    wants = [tuple(ALL_OUTPUTS) if keep_cache and i == 0 else tuple(w) for i, (_, _, w) in enumerate(segs)]
    stack = (len(segs), stride) if stride else None
    N, D = net.num_atoms, len(net.sizes)
    H2, H = net.settings.shared_h2, net.settings.adv_h
    n_dir = net.sizes[DIRECTION]
    offs = net.offsets
    z_sup = net.support(xs[0])
    hcol = head_columns(offs, N, HEAD_ALIGN)  # each branch's block of the advantage row

    x = K.pack_rows(xs, x_width(net))  # [R, Wx] = [obs, 0, ..., 0, 1]
    h1 = mm(x, _block(p, net, "trunk.w1"), relu=True, stack=stack)
    h2 = mm(h1, p["trunk.w2"], bias=p["trunk.b2"], relu=True, stack=stack)
    mpre = mm(h2, p["vsn.w"], bias=p["vsn.b"], stack=stack)
    keep = B if keep_cache else 0
    m, z = K.vsn_forward(h2, mpre, width=z_width(net), keep_rows=keep, m=mpre[:keep] if keep else None)
    v = mm(z, _block(p, net, "value.w"), stack=stack)  # [R, 52], bias included

    extra_cols, extra_caches = [], []
    for st in net.branch_inputs:  # (single segments only: pairs() is False with them)
        cols, c = st.forward(cp, params.get(st.name, {}), xs[0])
        extra_cols.append(cp.ascontiguousarray(cols))
        extra_caches.append(c)

    adv = cp.empty((R, hcol[-1]), dtype=cp.float32)
    A = net.num_actions

    def rows_of(name: str) -> int:  # an output's rows: up to the last segment that wants it
        return max((starts[i + 1] for i, w in enumerate(wants) if name in w), default=0)

    res: dict[str, Any] = {name: cp.empty((rows_of(name), A, N), dtype=cp.float32) if rows_of(name) else None
                           for name in ("log_probs", "probs")}
    res["var"] = cp.empty((rows_of("var"), A), dtype=cp.float32) if rows_of("var") else None
    res["q"] = cp.empty((R, A), dtype=cp.float32)
    use_z = [not net.extra_width[d] for d in range(D)]  # the branch's input is the augmented z

    def dueling(branches: tuple[int, int]) -> None:
        zq = z[:, H2 : H2 + n_dir] if branches[0] == DIRECTION and use_z[MAGNITUDE] else None
        if len(set(rows)) == 1:  # one launch, each segment writing what it wants
            K.dueling_softmax_forward(v, adv, z_sup, offs, branches=branches, segments=wants, zq=zq,
                                      zq_scale=1.0 / net.q_scale, **res)
            return
        for i, w in enumerate(wants):
            r0, r1 = starts[i], starts[i + 1]
            outs = {k: (a[r0:r1] if a is not None and (k in w or k == "q") else None) for k, a in res.items()}
            K.dueling_softmax_forward(v[r0:r1], adv[r0:r1], z_sup, offs, branches=branches, want=w,
                                      zq=None if zq is None else zq[r0:r1], zq_scale=1.0 / net.q_scale, **outs)

    branches: list[dict[str, Any]] = [dict() for _ in net.sizes]
    for d in (DIRECTION,) + tuple(i for i in range(D) if i != DIRECTION):
        wj = _block(p, net, f"branch{d}.w_gate")  # [W_gate | W_val] over [b_gate | b_val]
        u = z if use_z[d] else _branch_input(net, d, z, res["q"], extra_cols, wj.shape[0])
        pv = mm(u, wj, stack=stack)  # [R, 2H]: the gate's and the value's pre-activations
        gate = gcache = val = None
        if sigmoid_gate:  # only h is written: the backward recomputes gate and value from pv
            h = K.glu_forward(pv, width=h_width(net))
        else:
            pre, val = pv[:, :H], pv[:, H:]
            gate, gcache = net.gate.forward(cp, gp, d, pre)
            h = cp.zeros((R, h_width(net)), dtype=cp.float32)
            h[:, :H] = gate * val
            h[:, -1] = 1.0
        mm(h, _block(p, net, f"branch{d}.w_out"), out=adv[:, hcol[d] : hcol[d + 1]], stack=stack)
        if d == DIRECTION:  # the magnitude branch reads the direction branch's expected Q
            dueling((0, 1))
        if keep_cache:  # the rows of the first segment (views; the backward writes over pv's)
            branches[d] = dict(u=None if use_z[d] else u[:B], pv=pv[:B], gate=gate, gcache=gcache, val=val, h=h[:B])
    dueling((1, D))

    outs = []
    for i, w in enumerate(wants):
        r0, r1 = starts[i], starts[i + 1]

        def part(name: str, _w: tuple = w, _r0: int = r0, _r1: int = r1) -> Array | None:
            a = res[name]
            return a[_r0:_r1] if a is not None and (name in _w or name == "q") else None

        cache = None
        if keep_cache and i == 0:
            cache = dict(fused=True, x=x[:B], h1=h1[:B], h2=h2[:B], m=m, z=z[:B], branches=branches,
                         q=res["q"][:B], extra_cols=extra_cols, extra_caches=extra_caches)
        # The kernel returns normalised logits (log-probabilities); they differ from the raw
        # dueling logits by a per-distribution constant, which no consumer depends on.
        lp = part("log_probs")
        outs.append(NetOutput(lp, part("probs"), lp, cache, q=part("q"), var=part("var")))
    return outs


def _branch_input(net: Any, d: int, z: Array, q: Array, extra_cols: list[Array], width: int) -> Array:
    """Branch ``d``'s augmented input ``[z, (q_dir / q_scale), extra columns, 0, ..., 0, 1]``
    [R, width] (a branch with branch-input columns)."""
    import cupy as cp

    H2 = net.settings.shared_h2
    u = cp.zeros((z.shape[0], width), dtype=cp.float32)
    u[:, :H2] = z[:, :H2]
    col = H2
    if d == MAGNITUDE:
        n_dir = net.sizes[DIRECTION]
        u[:, col : col + n_dir] = q[:, :n_dir] * (1.0 / net.q_scale)
        col += n_dir
    for st, cols in zip(net.branch_inputs, extra_cols):
        if d in st.branches:
            u[:, col : col + st.width] = cols
            col += st.width
    u[:, -1] = 1.0
    return u


def backward(net: Any, params: dict, out: Any, dlogits: Array, grads_into: dict | None = None) -> dict:
    """Gradients of every parameter; ``grads_into`` (a tree of views, e.g. the optimizer's flat
    gradient buffer) receives the core's weight gradients in place when given. The backward
    consumes the forward's cache (it writes its gradients over parts of it): once per forward."""
    import cupy as cp

    from .network import SigmoidGate

    c = out.cache
    p = params["core"]
    gp = params.get(net.gate.name, {})
    sigmoid_gate = isinstance(net.gate, SigmoidGate)
    B, A, N = dlogits.shape
    H2, H = net.settings.shared_h2, net.settings.adv_h
    n_dir = net.sizes[DIRECTION]
    offs = net.offsets
    D = len(net.sizes)
    z_sup = net.support(dlogits)
    dlogits = cp.ascontiguousarray(dlogits)
    slots = (grads_into or {}).get("core", {})
    g: dict[str, Array] = {}
    pending: list[tuple[Array, Array]] = []
    hcol = head_columns(offs, N, HEAD_ALIGN)
    layout = blocks(net)

    def slot(name: str) -> Array:
        s = slots.get(name)
        g[name] = s if s is not None else cp.empty(p[name].shape, dtype=cp.float32)
        return g[name]

    def grad_block(home: str) -> Array:
        """Where block ``home``'s gradient goes: the gradient buffer's own block, or a scratch
        block whose parts are copied into the slots at the end."""
        shape, members = layout[home]
        views = [slot(n) for n, _, _ in members]
        blk = storage_of(slots, home)
        if (blk is not None and tuple(blk.shape) == shape and all(n in slots for n, _, _ in members)
                and all(storage_of(slots, n) is blk for n, _, _ in members)):
            return blk
        blk = cp.empty(shape, dtype=cp.float32)
        pending.extend((v, _placed(blk, m, v)) for v, m in zip(views, members))
        return blk

    ggate: dict[str, Array] = {}
    gextra: list[Any] = [None] * len(net.branch_inputs)
    z = c["z"]  # [B, Wz] augmented
    dz = (cp.zeros if net.branch_inputs else cp.empty)((B, z.shape[1]), dtype=cp.float32)
    dz_started = bool(net.branch_inputs)

    # Every branch but direction first: the magnitude branch's input gradient reaches the
    # direction branch's Q, which then enters the direction branch's logit gradient.
    dv, dadv = K.dueling_backward(dlogits, z_sup, offs, branches=(1, D), padded=True)

    def branch_backward(d: int) -> Array | None:
        """Branch ``d``'s gradients; returns the gradient of its extra input columns (a branch
        with branch-input columns) or None (its input is z: the gradient is in dz)."""
        nonlocal dz_started
        bc = c["branches"][d]
        wj = _block(p, net, f"branch{d}.w_gate")
        wout = _block(p, net, f"branch{d}.w_out")
        dh = dadv[:, hcol[d] : hcol[d + 1]]  # zeros in the padding
        dh_in = mm(dh, wout[:H].T)  # [B, H]
        mm(bc["h"].T, dh, out=grad_block(f"branch{d}.w_out"))  # the ones column: b_out's gradient
        dpv = bc["pv"]  # [d pre_gate | d val], written over the forward's [pre_gate | val]
        if sigmoid_gate:
            K.glu_backward(dh_in, dpv, dpv=dpv)
        else:
            dpre, gg = net.gate.backward(cp, gp, d, bc["gcache"], dh_in * bc["val"])
            cp.multiply(dh_in, bc["gate"], out=dpv[:, H:])
            dpv[:, :H] = dpre
            for k, val in gg.items():
                ggate[k] = ggate[k] + val if k in ggate else val
        u = z if bc["u"] is None else bc["u"]
        mm(u.T, dpv, out=grad_block(f"branch{d}.w_gate"))  # weights and (ones column) biases
        if bc["u"] is None:  # K = 2H: gate and value at once, into every column of dz
            mm(dpv, wj.T, out=dz, beta=1.0 if dz_started else 0.0)
            dz_started = True
            return None
        mm(dpv, wj[:H2].T, out=dz[:, :H2], beta=1.0)
        return mm(dpv, wj[H2:].T)[:, : net.in_width[d] - H2]  # 4-aligned over the block's rows

    dxes: dict[int, Array | None] = {MAGNITUDE: branch_backward(MAGNITUDE)}
    dq = cp.zeros((B, A), dtype=cp.float32)  # the conditioning path into direction Q
    if dxes[MAGNITUDE] is None:
        dq[:, :n_dir] = dz[:, H2 : H2 + n_dir] * (1.0 / net.q_scale)
        # Only the magnitude branch's weights see the direction-Q columns of z: the other
        # heads' gradients over those rows of their blocks must stay zero.
        z[:, H2 : H2 + n_dir] = 0.0
    else:
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

    wv = _block(p, net, "value.w")
    mm(dv, wv.T, out=dz, beta=1.0)
    mm(z.T, dv, out=grad_block("value.w"))  # weights and (ones column) bias
    dh2_mask, dmpre = K.vsn_backward(dz[:, :H2], c["h2"], c["m"])
    mm(c["h2"].T, dmpre, out=slot("vsn.w"))
    colsum(dmpre, slot("vsn.b"))
    dh2 = K.relu_backward(dh2_mask, c["h2"], addend=mm(dmpre, p["vsn.w"].T))
    mm(c["h1"].T, dh2, out=slot("trunk.w2"))
    colsum(dh2, slot("trunk.b2"))
    dh1 = K.relu_backward(mm(dh2, p["trunk.w2"].T), c["h1"])
    mm(c["x"].T, dh1, out=grad_block("trunk.w1"))  # weights and (ones column) bias
    for dst, blk in pending:
        dst[...] = blk

    grads = {"core": g}
    if net.gate.name in params and net.gate.name != "core":
        grads[net.gate.name] = {k: ggate.get(k, cp.zeros_like(v)) for k, v in gp.items()}
    for i, st in enumerate(net.branch_inputs):
        if st.name in params:
            dcols = gextra[i] if gextra[i] is not None else cp.zeros_like(c["extra_cols"][i])
            grads[st.name] = st.backward(cp, params[st.name], c["extra_caches"][i], cp.ascontiguousarray(dcols))
    return grads
