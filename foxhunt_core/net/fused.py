"""The network's forward and backward on the GPU with fused kernels (CuPy, float32).

Same mathematics as :mod:`foxhunt_core.net.network` (its NumPy reference), arranged for the
device so that each activation makes as few trips through memory as possible, and a step needs
as few launches as possible:

* **Biases ride in the GEMMs.** Where a layer's input is written by one of our kernels, the
  input carries a column of ones (``[x, 0, ..., 0, 1]``, "augmented") and the layer's bias is
  the last row of its weight block in the flat parameter buffer (:func:`storage_shapes`). The
  backward's weight-gradient GEMM then writes the bias gradient in the same call: no
  column-sum kernels for the first trunk layer, the value head, the GLUs and the advantage
  layers. In the forward the GEMMs read that row as cuBLASLt's epilogue bias over K = 256 (an
  extra K column costs a whole extra k-step per tile), except the first trunk layer and the GEMM
  that needs the direction-Q columns anyway, which take the ones column. (The other two trunk
  layers take their input from a GEMM: their bias rides in the epilogue, its gradient is a gemv.)
* **One augmented z for every head.** ``z`` is written ``[z, q_dir / q_scale, 0, ..., 0, 1]``:
  the magnitude branch's input columns (the direction branch's E[Q], written there by the
  direction branch's dueling kernel) sit in ``z`` itself, so the magnitude branch's GEMMs are
  the same as every branch's. The other heads' weight blocks have zero rows there.
* **Each GLU's gate and value weights side by side** ``[W_gate | W_val]``: one GEMM computes
  both pre-activations; the backward has one weight-gradient GEMM and one input-gradient GEMM
  (K = 2H per branch, all of the augmented z's columns at once). The GLU kernel writes only the
  augmented ``h``; the backward recomputes gate and value from the GEMM output it keeps.
* **The value head in front of the direction branch's GLU** (:func:`value_joined`): both read z
  with the bias in the epilogue, so their weights share a block ``[W_v | W_gate | W_val]`` and
  one GEMM writes ``[v | pv]``; in the backward the value head's gradient is written in front of
  the direction branch's pre-activation gradients, and one input-gradient and one weight-gradient
  GEMM serve both (two GEMMs fewer each way, z read once less).
* **Aligned extents.** The 51-column value head and each branch's 153-column advantage block are
  computed 52 and 156 columns wide over zero-padded weights, every augmented input is a
  multiple of 4 wide: cuBLAS runs a GEMM on its aligned kernels only when every extent is a
  multiple of 4 floats (its ``align1`` kernels measured a third of the speed). The dueling kernels
  skip the padding columns, and the backward writes zeros into those of the gradients, so the
  padding of the weights stays zero.
* **Several forwards as one** (:func:`forward_segments`): the update's online forwards on s and
  s' share the weights, and with the target network's parameters in a stacked buffer
  (:meth:`foxhunt_core.gpu.flat.FlatTree.stacked`) its forward on s' runs in the same
  strided-batched GEMMs and kernels too (up to :data:`STACK_MAX_ROWS` rows; beyond, plain GEMMs
  are faster). Each forward (segment) writes only what its caller reads: the bootstrap needs
  only E[Q] from the online network, and from the target network only its heads, from which
  the C51 loss kernel forms the bootstrap actions' distributions.
* **The GLU as one kernel** (:func:`fused_glu`; TF32 on, one parameter tree per forward, GLUs a
  multiple of 128 wide, a Hopper GPU): ``glu_gemm`` runs the GEMM on the tensor cores (TMA
  loads, wgmma) and applies the gate in its epilogue, so ``h`` is written straight from the
  accumulators and the pre-activations reach memory only for the rows whose backward reads them
  (the online forward on s); the value head, where it shares the direction branch's block, is
  then a GEMM of its own. ``vsn_forward`` then writes z rounded to TF32 (every reader of z is a
  TF32 GEMM, which rounds it the same way), so ``glu_gemm`` need not round it again, and
  ``glu_gemm`` writes h so for the advantage heads, which ``linear_gemm`` then computes (one
  160-column tensor-core tile per head, four stages of loads in flight: the heads, K = 256, are
  bound by memory) with the dueling forward in the same kernel, on warps of its own that read the
  staged tiles while the next tile's products run (:func:`fused_heads_dueling`, where the heads'
  tiles fill the GPU): the advantage rows reach memory only for a caller that reads them (the
  target forward's heads).
  Otherwise (the stacked forwards of small batches, plugin gates, fp32) cuBLAS's GEMM writes
  every row's pre-activations and ``glu_forward`` reads them back.
* **One GEMM for several branches** (:func:`joint`): every GLU's weights share one block and every
  advantage layer's another, so the branches after the direction branch run their GLUs as one
  GEMM and one kernel, forward and backward; z's gradient from all of them and the value head is
  one GEMM (:func:`joint_dz`: the gradients lie where the forward's ``[v | pv]`` rows did, column
  for column with the block).
* The advantage GEMMs write straight into one advantage buffer; the backward accumulates input
  gradients in place (GEMMs with ``beta = 1``) and writes the weight gradients straight into the
  optimizer's flat gradient buffer (``grads_into``).
* **The GLU backward in one kernel per group** (:func:`fused_glu_backward`; the sigmoid gate,
  TF32 on, a Hopper GPU, a tile for every SM): ``glu_backward_gemm`` computes the GLU outputs'
  gradient from the heads' (``dadv Wo^T``, the heads' weights rounded to TF32 once per backward)
  on the tensor cores and applies the gate's backward in its epilogue, over the pre-activations
  in place: the GLU outputs' gradient never reaches memory. The magnitude branch's launch also
  takes the gradient of z's direction-Q columns (dq) from the pre-activation gradients in its
  registers (adv_h up to 256), where a separate product read them back.
* **The GLU blocks' and the heads' weight gradients on the tensor cores** (:func:`fused_wgrad`;
  TF32 on, a Hopper GPU, z 257 to 264 wide: the default trunk's 260; likewise h for the heads):
  ``wgrad_gemm`` reduces over the batch with z transposed once (both GLU groups read it) and the
  pre-activations' gradient as the register operand of its wgmma, the batch split over the SMs
  and the slices summed in order; ``wgrad_gemm_sets`` does the heads of a group in one launch,
  transposing h in shared memory (no pass writes h transposed).

Plugin stages (a gate activation, branch-input columns) run their own forward/backward here
exactly as in the reference, so they are captured in the same CUDA graph; with them each
forward runs on its own, and a branch with extra input columns forms its augmented input
explicitly. ``tests/gpu/test_update_gpu.py`` checks this path against the NumPy one, and
``tests/net/test_fused_arrangement.py`` runs this very code over NumPy twins of the kernels.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..gpu import cublas, streams
from ..gpu import kernels as K
from ..gpu.flat import storage_of
from ..gpu.launch import HEAD_ALIGN, head_columns, padded

Array = Any
Shape = tuple[int, ...]
DIRECTION, MAGNITUDE = 0, 1
ALL_OUTPUTS = ("log_probs", "probs", "q", "var")
# A segment may also ask for "heads": its value head and advantage row as the GEMMs wrote them
# (NetOutput.heads). A segment that asks for nothing else runs no dueling kernel past the
# direction branch's (whose Q the magnitude branch reads).
HEADS = "heads"


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


def joint(net: Any) -> bool:
    """Whether every branch's GLU weights share one block, and every branch's advantage weights
    another (no branch has extra input columns): one GEMM then serves several branches."""
    return not any(net.extra_width)


def value_joined(net: Any) -> bool:
    """Whether the value head's weights sit in the direction branch's GLU block, in front of its
    ``[W_gate | W_val]`` (the direction branch's input is the augmented z, as the value head's):
    one GEMM then computes the value head and the direction GLU's pre-activations, and the
    backward has one input-gradient and one weight-gradient GEMM for both."""
    return not net.extra_width[DIRECTION]


def value_width(net: Any) -> int:
    """Columns of the value head in its block: the atoms rounded up to 4, or with
    :func:`value_joined` to 16 (the GLU columns behind it then start 64-byte aligned)."""
    return padded(net.num_atoms, 16 if value_joined(net) else HEAD_ALIGN)


def pv_lead(net: Any) -> int:
    """Columns in front of the first branch's pre-activations in the forward's ``[v | pv]`` rows:
    the value head's when it is joined (:func:`value_joined`), else none."""
    return value_width(net) if value_joined(net) else 0


def glu_home(net: Any, d: int) -> tuple[str, int]:
    """The block holding branch ``d``'s ``[W_gate | W_val]`` and its first column there: behind the
    value head (:func:`value_joined`) in the block ``value.w`` when every branch shares it
    (:func:`joint`) or the branch is the direction branch; else the branch's own block."""
    if joint(net) or (d == DIRECTION and value_joined(net)):
        return "value.w", pv_lead(net) + (2 * net.settings.adv_h * d if joint(net) else 0)
    return f"branch{d}.w_gate", 0


def out_home(net: Any, d: int) -> tuple[str, int]:
    """The block holding branch ``d``'s advantage weights and its first column there."""
    if joint(net):
        return "branch0.w_out", head_columns(net.offsets, net.num_atoms, HEAD_ALIGN)[d]
    return f"branch{d}.w_out", 0


def blocks(net: Any) -> dict[str, tuple[Shape, list[tuple[str, int | None, int]]]]:
    """The core's weight blocks on this path: ``{block: (shape, [(tensor, row, col), ...])}``.
    The first tensor is the block's home (top-left corner); ``row`` None places a matrix at
    the top from column ``col``, an integer row places a vector (a bias: the block's last row,
    met by the input's ones column)."""
    s, N = net.settings, net.num_atoms
    H, D = s.adv_h, len(net.sizes)
    wx, wz, wh = x_width(net), z_width(net), h_width(net)
    hcol = head_columns(net.offsets, N, HEAD_ALIGN)
    glu_cols = 2 * H * (D if joint(net) else 1)  # of a GLU block
    value_cols = value_width(net) + (glu_cols if value_joined(net) else 0)
    out = {
        "trunk.w1": ((wx, s.shared_h1), [("trunk.w1", None, 0), ("trunk.b1", wx - 1, 0)]),
        "value.w": ((wz, value_cols), [("value.w", None, 0), ("value.b", wz - 1, 0)]),
    }
    for d in range(D):
        home, c = glu_home(net, d)
        r = glu_rows(net, d)
        out.setdefault(home, ((r, glu_cols), []))[1].extend([
            (f"branch{d}.w_gate", None, c), (f"branch{d}.w_val", None, c + H),
            (f"branch{d}.b_gate", r - 1, c), (f"branch{d}.b_val", r - 1, c + H)])
        home, c = out_home(net, d)
        shape = (wh, hcol[-1] if joint(net) else hcol[d + 1] - hcol[d])
        out.setdefault(home, (shape, []))[1].extend([
            (f"branch{d}.w_out", None, c), (f"branch{d}.b_out", wh - 1, c)])
    return out


def storage_shapes(net: Any) -> dict[str, Any]:
    """How this path wants the core's weights stored (a :class:`~foxhunt_core.gpu.flat.FlatTree`
    storage spec, ``{name: block shape or Shared(...)}``), from :func:`blocks`:

    * the first trunk layer [obs features + 1 rounded up to 4, H1] with ``b1`` in its last row;
    * the value head [z_width, N rounded up to 4] with its bias in the last row, and behind it
      (:func:`value_joined`; N then rounded up to 16) the direction branch's GLU block;
    * every GLU's gate and value weights side by side, [z_width, branches x 2 adv_h], the biases
      side by side in the last row: one GEMM for several branches (:func:`joint`; with a
      branch-input stage, one such block per branch, a branch with extra input columns its own
      input width + 1 rounded up to 4 rows);
    * every branch's advantage layer side by side, [adv_h + 1 rounded up to 4, the advantage
      row's width (each branch's n N rounded up to 4)], the biases in the last row (with a
      branch-input stage one block per branch).
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


# Up to this many rows per forward, forwards over stacked parameter trees run as strided-batched
# GEMMs; beyond it, the forwards of one tree run as one GEMM and the others apart, the target's
# on the side stream, where the GLUs and the heads run as glu_gemm and heads_dueling. On the H200,
# with the dueling forward's eight lanes per row in the heads' kernel, the update is faster apart
# from 2048 rows: 0.371 against 0.378 ms at 2048, 0.508 against 0.551 at 4096 (benchmarks/
# bench_update.py --stack-max, one run each: benchmarks/results/2026-12-01-h200). Smaller batches
# (the training default, 128) stay stacked: fewer launches, not measured apart.
STACK_MAX_ROWS = 1024
# From this many rows the advantage heads' weight gradients run as wgrad_gemm_sets (fused_wgrad with
# heads). Alone it beats cuBLAS's GEMMs at every size (35.5 / 73.7 / 213.8 against 46.4 / 93.9 /
# 296.4 us at 4096 / 16384 / 65536 rows), but on the side stream it takes every SM's shared memory
# for its time: at 4096 the update then took 0.569 ms against 0.552-0.556 without it, at 16384
# 1.388-1.391 against 1.387, at 65536 4.726-4.742 against 4.754 (benchmarks/bench_update.py, one
# run each way; benchmarks/results/2026-11-30-h200/round9).
WGRAD_HEADS_MIN_ROWS = 32768
# The rows from which the trunk's input gradients run as linear_gemm_relu_backward (the ReLU's
# backward in the GEMM's epilogue; fused_relu_backward). Alone it is faster from 16384 rows (55.3
# against 58.5 us for both layers there, 182.6 against 211.8 at 65536: benchmarks/bench_kernels.py),
# but it holds every SM, where cuBLAS's GEMM and relu_backward leave room for the side stream's
# weight gradients: in the update at 16384 it was 3-5 us slower (1.313 against 1.310 ms, 1.323
# against 1.318: two runs), at 65536 6-15 us faster (4.520 against 4.526, 4.487 against 4.502).
RELU_GEMM_MIN_ROWS = 32768
# The advantage heads with the dueling forward in their kernel (fused_heads_dueling, heads_dueling):
# off, the heads' GEMM writes the advantage rows and dueling_softmax_forward reads them back.
HEADS_DUELING = True
# z's gradient from every GLU group and the joined value head as one GEMM (joint_dz): with every
# GLU in the value head's block, the backward's [dv | dpv] rows and the block's rows of z are each
# one matrix, K = 2112 for the stage-0 network. Off, one GEMM per group (K = 1536 and 576 there).
JOINT_DZ = True


def stacks(net: Any, rows: int) -> bool:
    """Whether forwards of ``rows`` rows each over stacked parameter trees run as one
    (strided-batched GEMMs): with :func:`pairs` and up to :data:`STACK_MAX_ROWS` rows."""
    return pairs(net) and rows <= STACK_MAX_ROWS


def _stride(net: Any, trees: Sequence[dict]) -> int | None:
    """Elements between the weight blocks of consecutive parameter trees when they are one
    stacked allocation (the same distance for every block), 0 when all are the same tree, None
    otherwise."""
    if all(t is trees[0] for t in trees):
        return 0
    homes = set(blocks(net))
    stride = None
    for name in [*homes, "trunk.w2", "trunk.b2", "vsn.w", "vsn.b"]:
        arrays = [storage_of(t["core"], name) if name in homes else t["core"][name] for t in trees]
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
    (their rows one after another); parameter trees stacked in one allocation (equal row counts
    up to :data:`STACK_MAX_ROWS`) run as strided-batched GEMMs and segmented kernels; the rest
    separately. Without :func:`pairs` every segment runs on its own."""
    segs = list(segments)
    if not segs:
        return []
    if pairs(net):
        trees = [p for p, _, _ in segs]
        stride = _stride(net, trees)
        rows = {x.shape[0] for _, x, _ in segs}
        if stride is not None and (stride == 0 or (len(rows) == 1 and stacks(net, rows.pop()))) and len(segs) <= 3:
            return _forward_group(net, segs, keep_cache, stride)
    runs = []
    i = 0
    while i < len(segs):  # runs of one parameter tree, each as one forward
        j = i + 1
        while pairs(net) and j < len(segs) and j - i < 3 and segs[j][0] is segs[i][0]:
            j += 1
        runs.append((i, j))
        i = j
    outs: list = []
    # The runs after the first are independent of it: on the side stream they overlap it (the
    # update's target forward beside its online forwards, past the stacking threshold).
    side = pairs(net) and len(runs) > 1
    for i, j in runs[1:] if side else []:
        with streams.beside():
            outs.append((i, _forward_group(net, segs[i:j], False, 0)))
    for i, j in runs[: 1 if side else len(runs)]:
        outs.append((i, _forward_group(net, segs[i:j], keep_cache and i == 0, 0)))
    if side:
        streams.join()
    return [o for _, group in sorted(outs, key=lambda t: t[0]) for o in group]


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
    # With the GLUs in one kernel each, z is written rounded to TF32 (to nearest): its readers are
    # all TF32 GEMMs, which round it so anyway, and glu_gemm then takes its first H2 columns as
    # they are instead of rounding them in shared memory.
    z_tf32 = fused_glu(net, stack)
    m, z = K.vsn_forward(h2, mpre, width=z_width(net), keep_rows=keep, m=mpre[:keep] if keep else None, tf32=z_tf32)
    Wh, lead = h_width(net), pv_lead(net)
    # Each branch's [gate | value] pre-activations, behind the value head when it is joined (its
    # GEMM is then the direction branch's); else the value head on its own.
    pv_all = cp.empty((R, lead + D * 2 * H), dtype=cp.float32)
    if lead:
        v = pv_all[:, : padded(N)]
    else:
        vb = _block(p, net, "value.w")
        v = mm(z[:, :H2], vb[:H2], bias=vb[-1], stack=stack)  # [R, 52]; K = H2, the bias in the epilogue

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

    kernel_wants = [tuple(x for x in w if x != HEADS) for w in wants]
    needs = [bool(w) for w in kernel_wants]  # (E[Q] comes with any of the kernel's outputs)

    def dueling_scope(branches: tuple[int, int]) -> tuple[int, Array | None]:
        """The segments the dueling forward of ``branches`` covers (every one for the direction
        branch, whose Q the magnitude branch reads; past it only up to the last segment that
        wants something of it) and the direction Q's columns in z, where the magnitude branch
        reads them."""
        first = branches[0] == DIRECTION
        n = len(segs) if first else max((i + 1 for i, x in enumerate(needs) if x), default=0)
        return n, z[:, H2 : H2 + n_dir] if first and use_z[MAGNITUDE] else None

    def dueling(branches: tuple[int, int]) -> None:
        n, zq = dueling_scope(branches)
        if n and len(set(rows)) == 1:  # one launch, each segment writing what it wants
            r1 = starts[n]
            outs = {k: (a[:r1] if a is not None else None) for k, a in res.items()}
            K.dueling_softmax_forward(v[:r1], adv[:r1], z_sup, offs, branches=branches, segments=kernel_wants[:n],
                                      zq=zq, zq_scale=1.0 / net.q_scale, **outs)
            return
        for i, w in enumerate(kernel_wants[:n]):
            if not (w or branches[0] == DIRECTION):
                continue
            r0, r1 = starts[i], starts[i + 1]
            outs = {k: (a[r0:r1] if a is not None and (k in w or k == "q") else None) for k, a in res.items()}
            K.dueling_softmax_forward(v[r0:r1], adv[r0:r1], z_sup, offs, branches=branches, want=w,
                                      zq=None if zq is None else zq[r0:r1], zq_scale=1.0 / net.q_scale, **outs)

    heads_wanted = any(HEADS in w for w in wants)

    def heads_dueling(g: Sequence[int], h: Array) -> bool:
        """Branches ``g``'s advantage heads with their dueling forward in the GEMM's kernel
        (:func:`.kernels.heads_dueling`; the heads reach memory only where a segment wants them),
        where the heads run on the tensor cores, the rows' segments are of one size, the
        branches are one of the two dueling launches and their tiles fill the GPU
        (:func:`.kernels.heads_dueling_fills`); False (nothing run) otherwise."""
        span = (g[0], g[-1] + 1)
        n, zq = dueling_scope(span)
        if span not in ((DIRECTION, 1), (1, D)) or not n or len(set(rows)) != 1 \
                or not fused_heads_dueling(net) or not K.heads_dueling_fills(R, len(g)):
            return False
        r1 = starts[n]
        ins, wts, biases, outs = _advantage_sets(net, g, h, block, transposed, adv)
        K.heads_dueling(ins, wts, v, z_sup, offs, branches=span, segments=kernel_wants[:n], seg_rows=rows[0],
                        bias=biases, adv=outs if heads_wanted else None, zq=None if zq is None else zq[:r1],
                        zq_scale=1.0 / net.q_scale, rounded=H,
                        **{k: (a[:r1] if a is not None else None) for k, a in res.items()})
        return True

    h_all = cp.empty((R, D * Wh), dtype=cp.float32)  # each branch's augmented GLU output
    blk: dict[str, Array] = {}

    def block(home: str) -> Array:
        if home not in blk:
            blk[home] = _block(p, net, home)
        return blk[home]

    def transposed(home: str) -> Array:  # the block's weight rows transposed, rounded to TF32
        key = "T " + home
        if key not in blk:
            blk[key] = K.transpose(block(home)[:H])
        return blk[key]

    branches: list[dict[str, Any]] = [dict() for _ in net.sizes]
    done: set[tuple[int, int]] = set()  # the dueling forwards run in their heads' kernel
    for g in branch_groups(net):  # the direction branch first: the magnitude branch reads its Q
        d0, d1 = g[0], g[-1] + 1
        home, c0 = glu_home(net, d0)
        with_v = lead if d0 == DIRECTION else 0  # the value head's columns ride along
        wj = block(home)[:, c0 - with_v : c0 + 2 * H * len(g)]  # ([W_v] |) [W_gate | W_val] ... over their biases
        u = z if use_z[d0] else _branch_input(net, d0, z, res["q"], extra_cols, wj.shape[0])
        pv = pv_all[:, lead + 2 * H * d0 : lead + 2 * H * d1]
        out_cols = pv_all[:, lead + 2 * H * d0 - with_v : lead + 2 * H * d1]
        h = h_all[:, Wh * d0 : Wh * d1]
        no_tail = use_z[d0] and MAGNITUDE not in g  # K = H2, the biases in the epilogue (no K tail)
        tc = z_tf32 and use_z[d0]  # (z_tf32: fused_glu)
        if tc:
            # The GLU in one kernel: h from the GEMM's epilogue, pv only for the rows the backward
            # reads (the value head, when it rides along, as a GEMM of its own); h written rounded
            # to TF32 for the advantage heads' kernel (linear_gemm) to read as it is.
            if with_v:
                mm(z[:, :H2], wj[:H2, :with_v], out=pv_all[:, :with_v], bias=wj[-1, :with_v])
            wg = wj[:, with_v:]
            u_, w_ = (z[:, :H2], wg[:H2]) if no_tail else (z, wg)
            K.glu_gemm(u_, w_, bias=wg[-1] if no_tail else None, width=Wh, blocks=len(g), h=h,
                       pv=pv[:keep] if keep else None, wt=K.transpose(w_), rounded=H2 if z_tf32 else 0,
                       tf32_h=True)
        else:
            if no_tail:
                mm(z[:, :H2], wj[:H2], out=out_cols, bias=wj[-1], stack=stack)
            else:  # the direction Q and the ones column of the augmented input as well
                mm(u, wj, out=out_cols, stack=stack)
            if sigmoid_gate:  # only h is written: the backward recomputes gate and value from pv
                K.glu_forward(pv, width=Wh, blocks=len(g), h=h)
        for i, d in enumerate(g):
            gate = gcache = val = None
            if not sigmoid_gate:
                pre = cp.ascontiguousarray(pv[:, 2 * H * i : 2 * H * i + H])
                val = pv[:, 2 * H * i + H : 2 * H * (i + 1)]
                gate, gcache = net.gate.forward(cp, gp, d, pre)
                hd = h[:, Wh * i : Wh * (i + 1)]
                hd[...] = 0.0
                hd[:, :H] = gate * val
                hd[:, -1] = 1.0
            if keep_cache:  # the rows of the first segment (views; the backward writes over pv's)
                branches[d] = dict(u=None if use_z[d] else u[:B], gate=gate, gcache=gcache, val=val)
        if tc and heads_dueling(g, h):
            done.add((d0, d1))
        elif tc:
            _advantages_tc(net, g, h, block, transposed, adv)
        else:
            _advantages(net, g, h, block, adv, stack)
        if d0 == DIRECTION and (0, 1) not in done:
            dueling((0, 1))
    if (1, D) not in done:
        dueling((1, D))

    outs = []
    for i, w in enumerate(wants):
        r0, r1 = starts[i], starts[i + 1]

        def part(name: str, _w: tuple = w, _r0: int = r0, _r1: int = r1, _n: bool = needs[i]) -> Array | None:
            a = res[name]
            return a[_r0:_r1] if a is not None and (name in _w or (name == "q" and _n)) else None

        cache = None
        if keep_cache and i == 0:
            cache = dict(fused=True, x=x[:B], h1=h1[:B], h2=h2[:B], m=m, z=z[:B], pv=pv_all[:B], h=h_all[:B],
                         branches=branches, q=res["q"][:B], extra_cols=extra_cols, extra_caches=extra_caches)
        # The kernel returns normalised logits (log-probabilities); they differ from the raw
        # dueling logits by a per-distribution constant, which no consumer depends on.
        lp = part("log_probs")
        outs.append(NetOutput(lp, part("probs"), lp, cache, q=part("q"), var=part("var"),
                              heads=(v[r0:r1], adv[r0:r1]) if HEADS in w else None))
    return outs


def fused_glu(net: Any, stack: Any) -> bool:
    """Whether a forward's GLUs whose input is the augmented z run as one kernel each
    (:func:`foxhunt_core.gpu.kernels.glu_gemm`: the GEMM on the TF32 tensor cores with the gate in
    its epilogue, so that the pre-activations of rows no backward reads never reach memory):
    with the sigmoid gate, TF32 on, one parameter tree (no ``stack``) and a device and width it
    supports. Otherwise cuBLAS's GEMM writes every row's pre-activations and ``glu_forward``
    reads them back."""
    from .network import SigmoidGate

    return (isinstance(net.gate, SigmoidGate) and stack is None and cublas.tf32_enabled()
            and K.glu_gemm_supported(net.settings.adv_h))


def fused_heads_dueling(net: Any) -> bool:
    """Whether the advantage heads may run with the dueling forward in their kernel
    (:func:`.kernels.heads_dueling`): every branch's block of the advantage row within its tile
    and the branches' logits within the dueling warps' registers
    (:func:`.kernels.heads_dueling_supported`)."""
    hcol = head_columns(net.offsets, net.num_atoms, HEAD_ALIGN)
    return (HEADS_DUELING and max(b - a for a, b in zip(hcol[:-1], hcol[1:])) <= K.LINEAR_GEMM_COLS
            and K.heads_dueling_supported(net.offsets, net.num_atoms))


def joint_dz(net: Any) -> bool:
    """Whether the backward takes z's gradient in one GEMM over every group's pre-activation
    gradients and the value head's (:data:`JOINT_DZ`): every GLU in one block behind the value
    head (:func:`joint` and :func:`value_joined`), so that the gradients, written over the
    forward's ``[v | pv]`` rows, and the weights' rows of z line up column for column."""
    return JOINT_DZ and joint(net) and value_joined(net)


def fused_glu_backward(net: Any) -> bool:
    """Whether a GLU group's backward runs as :func:`foxhunt_core.gpu.kernels.glu_backward_gemm`
    (its heads' input gradient on the TF32 tensor cores, the sigmoid gate's backward in that GEMM's
    epilogue, so the GLU outputs' gradient never reaches memory): TF32 on and a device and GLU width
    it supports (the caller checks for the sigmoid gate)."""
    return cublas.tf32_enabled() and K.glu_gemm_supported(net.settings.adv_h)


def fused_wgrad(net: Any, heads: bool = False) -> bool:
    """Whether the weight gradients of the GLU blocks whose input is the augmented z run as
    :func:`foxhunt_core.gpu.kernels.wgrad_gemm` (the TF32 tensor cores, the batch split over the
    SMs, z transposed once for both), or with ``heads`` those of the advantage heads as
    :func:`~foxhunt_core.gpu.kernels.wgrad_gemm_sets` (h transposed in the kernel): TF32 on and a
    device and input width it supports (the network's default widths: z and h are 260 wide).
    Otherwise cuBLAS's GEMMs, whose kernels for products over the batch (both operands
    batch-major) are the older mma.sync ones."""
    return cublas.tf32_enabled() and K.wgrad_gemm_supported(h_width(net) if heads else z_width(net))


def fused_relu_backward(net: Any, rows: int) -> bool:
    """Whether the trunk's input gradients (through the VSN's weights into h2, through trunk.w2
    into h1) run as :func:`foxhunt_core.gpu.kernels.linear_gemm_relu_backward` (the GEMM on the
    TF32 tensor cores with the ReLU's backward in its epilogue, so the product never reaches
    memory): TF32 on, a device it supports, a tile for every SM over ``rows`` rows of either width,
    and at least :data:`RELU_GEMM_MIN_ROWS` rows. Otherwise cuBLAS's GEMM and ``relu_backward``."""
    s = net.settings
    return (rows >= RELU_GEMM_MIN_ROWS and cublas.tf32_enabled() and K.glu_gemm_supported()
            and all(K.linear_gemm_relu_backward_fills(rows, n) for n in (s.shared_h1, s.shared_h2)))


def branch_groups(net: Any) -> list[tuple[int, ...]]:
    """The branches whose GLUs run as one (one GEMM, one kernel), in forward order: the direction
    branch alone first (the magnitude branch reads its Q), then the others together when their
    weights share blocks (:func:`joint`), else one by one."""
    D = len(net.sizes)
    if joint(net):
        return [(DIRECTION,), tuple(d for d in range(D) if d != DIRECTION)]
    return [(DIRECTION,)] + [(d,) for d in range(D) if d != DIRECTION]


def _uniform(net: Any, g: Sequence[int]) -> bool:
    """Whether the branches ``g`` have advantage blocks of one width (one strided-batched GEMM)."""
    hcol = head_columns(net.offsets, net.num_atoms, HEAD_ALIGN)
    return joint(net) and len(g) > 1 and len({hcol[d + 1] - hcol[d] for d in g}) == 1


def _advantages(net: Any, g: Sequence[int], h: Array, block: Any, adv: Array, stack: Any) -> None:
    """The advantage GEMMs of branches ``g`` (their augmented GLU outputs ``h`` side by side)
    into their columns of ``adv``: one strided-batched GEMM over the branches where one set of
    parameters runs (no ``stack``) over at most :data:`STACK_MAX_ROWS` rows and their blocks are
    of one width (the launches it saves are what small batches cost), else one GEMM each, the bias
    in the epilogue (faster on large batches)."""
    hcol = head_columns(net.offsets, net.num_atoms, HEAD_ALIGN)
    Wh = h_width(net)
    if stack is None and _uniform(net, g) and h.shape[0] <= STACK_MAX_ROWS:
        d, w = g[0], hcol[g[0] + 1] - hcol[g[0]]
        home, c = out_home(net, d)
        mm(h[:, :Wh], block(home)[:, c : c + w], out=adv[:, hcol[d] : hcol[d] + w], batch=(len(g), Wh, w, w))
        return
    H = net.settings.adv_h
    for i, d in enumerate(g):  # K = H, the bias in the epilogue
        home, c = out_home(net, d)
        w = hcol[d + 1] - hcol[d]
        wo = block(home)
        mm(h[:, Wh * i : Wh * i + H], wo[:H, c : c + w], out=adv[:, hcol[d] : hcol[d + 1]], bias=wo[-1, c : c + w],
           stack=stack)


def _advantage_sets(net: Any, g: Sequence[int], h: Array, block: Any, transposed: Any,
                    adv: Array) -> tuple[list, list, list, list]:
    """Branches ``g``'s advantage layers as :func:`.kernels.linear_gemm`'s sets: their GLU
    outputs' columns of ``h``, transposed weights, biases and columns of ``adv``."""
    hcol = head_columns(net.offsets, net.num_atoms, HEAD_ALIGN)
    H, Wh = net.settings.adv_h, h_width(net)
    ins, wts, biases, outs = [], [], [], []
    for i, d in enumerate(g):
        home, c = out_home(net, d)
        w = hcol[d + 1] - hcol[d]
        ins.append(h[:, Wh * i : Wh * i + H])
        wts.append(transposed(home)[c : c + w])
        biases.append(block(home)[-1, c : c + w])
        outs.append(adv[:, hcol[d] : hcol[d + 1]])
    return ins, wts, biases, outs


def _advantages_tc(net: Any, g: Sequence[int], h: Array, block: Any, transposed: Any, adv: Array) -> None:
    """The advantage layers of branches ``g`` as one ``linear_gemm`` (the TF32 tensor cores, one
    160-column tile per branch; the bias in its epilogue), from their GLU outputs ``h`` as
    ``glu_gemm`` wrote them: rounded to TF32."""
    ins, wts, biases, outs = _advantage_sets(net, g, h, block, transposed, adv)
    K.linear_gemm(ins, wts, outs, bias=biases, rounded=net.settings.adv_h)


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

    gblocks: dict[str, Array] = {}
    pblocks: dict[str, Array] = {}

    def grad_block(home: str) -> Array:
        """Where block ``home``'s gradient goes: the gradient buffer's own block, or a scratch
        block whose parts are copied into the slots at the end."""
        if home in gblocks:
            return gblocks[home]
        shape, members = layout[home]
        views = [slot(n) for n, _, _ in members]
        blk = storage_of(slots, home)
        if not (blk is not None and tuple(blk.shape) == shape and all(n in slots for n, _, _ in members)
                and all(storage_of(slots, n) is blk for n, _, _ in members)):
            blk = cp.empty(shape, dtype=cp.float32)
            pending.extend((v, _placed(blk, m, v)) for v, m in zip(views, members))
        gblocks[home] = blk
        return blk

    def block(home: str) -> Array:
        if home not in pblocks:
            pblocks[home] = _block(p, net, home)
        return pblocks[home]

    def rounded_block(home: str) -> Array:  # the block's weight rows rounded to TF32 (glu_backward_gemm's wo)
        key = "TF32 " + home
        if key not in pblocks:
            pblocks[key] = K.round_tf32(block(home)[:H])
        return pblocks[key]

    ggate: dict[str, Array] = {}
    gextra: list[Any] = [None] * len(net.branch_inputs)
    z = c["z"]  # [B, Wz] augmented
    pv_all, h_all = c["pv"], c["h"]  # ([v] |) every branch's [gate | value] pre-activations, augmented h
    Wh, lead = h_width(net), pv_lead(net)
    # With the sigmoid gate under TF32 on Hopper, each GLU group's backward is one kernel from its
    # heads' gradients (glu_backward_gemm) where it has a tile for every SM; otherwise the GLU
    # outputs' gradient is written first.
    use_tc_dh = sigmoid_gate and fused_glu_backward(net)
    written_dh = not use_tc_dh or not all(K.glu_backward_gemm_fills(B, len(gr), H) for gr in branch_groups(net))
    dh_all = cp.empty((B, D * H), dtype=cp.float32) if written_dh else None  # every branch's GLU output gradient
    dz = (cp.zeros if net.branch_inputs else cp.empty)((B, z.shape[1]), dtype=cp.float32)
    # Whether z carries the direction-Q columns (the magnitude branch reads z): only the magnitude
    # branch's weights meet them, so every other weight gradient is zero over those rows. (The
    # weight gradients run beside the input gradients, on the side stream: see gpu/streams.py.)
    use_zq = not net.extra_width[MAGNITUDE]
    dq_z = cp.empty((B, -(-n_dir // 4) * 4), dtype=cp.float32) if use_zq else None  # d loss / d z's direction-Q columns
    dz_started = bool(net.branch_inputs)
    use_wgrad = fused_wgrad(net)
    use_wgrad_h = fused_wgrad(net, heads=True) and B >= WGRAD_HEADS_MIN_ROWS
    one_dz = joint_dz(net)  # z's gradient after the last group, in one GEMM
    zt: list[Array] = []  # z transposed and rounded to TF32 (wgrad_gemm's xt), made once for every group

    # Every branch but direction first: the magnitude branch's input gradient reaches the
    # direction branch's Q, which then enters the direction branch's logit gradient.
    # (A joined value head's gradient goes where its forward output was, in front of the
    # direction branch's pre-activations: one GEMM each way serves both. The columns behind its
    # 4-aligned width hold the forward's zeros: its weights there are zero.)
    dv, dadv = K.dueling_backward(dlogits, z_sup, offs, branches=(1, D), padded=True,
                                  dv=pv_all[:, : padded(N)] if lead else None)

    def group_backward(g: tuple[int, ...]) -> Array | None:
        """The gradients of branches ``g`` (one GLU group); returns the gradient of the extra
        input columns of a branch that has them, or None (the input is z: its gradient is in dz)."""
        nonlocal dz_started
        d0, d1, n = g[0], g[-1] + 1, len(g)
        tc_dh = use_tc_dh and K.glu_backward_gemm_fills(B, n, H)
        # The advantage layers: input gradients (one strided-batched GEMM where the blocks are of
        # one width; with tc_dh, inside glu_backward_gemm below), weight and (ones column) bias
        # gradients one branch each (split-K).
        if _uniform(net, g) and not tc_dh:
            w = hcol[d0 + 1] - hcol[d0]
            home, col = out_home(net, d0)
            mm(dadv[:, hcol[d0] : hcol[d0] + w], block(home)[:H, col : col + w].T, out=dh_all[:, H * d0 : H * (d0 + 1)],
               batch=(n, w, w, H))
        wgrads = []
        for d in g:
            home, col = out_home(net, d)
            w = hcol[d + 1] - hcol[d]
            dh = dadv[:, hcol[d] : hcol[d + 1]]  # zeros in the padding
            if not (_uniform(net, g) or tc_dh):
                mm(dh, block(home)[:H, col : col + w].T, out=dh_all[:, H * d : H * (d + 1)])
            wgrads.append((h_all[:, Wh * d : Wh * (d + 1)].T, dh, grad_block(home)[:, col : col + w]))
        with streams.beside():
            if use_wgrad_h and len({dy.shape[1] for _, dy, _ in wgrads}) == 1 \
                    and len({gw_out.strides for _, _, gw_out in wgrads}) == 1:
                # One launch, h transposed in the kernel (wgrad_gemm_sets).
                K.wgrad_gemm_sets([x.T for x, _, _ in wgrads], [dy for _, dy, _ in wgrads],
                                  [gw_out for _, _, gw_out in wgrads])
            else:
                # One GEMM each: cuBLAS splits their long K = B reduction, which it never does inside a
                # strided batch (one batched GEMM measured 1.5-3x slower: benchmarks/bench_stack.py).
                for x, dy, gw_out in wgrads:
                    mm(x, dy, out=gw_out)
        dpv = pv_all[:, lead + 2 * H * d0 : lead + 2 * H * d1]  # [d pre_gate | d val] ..., over the forward's
        ghome, gcol = glu_home(net, d0)
        # dq (below) in glu_backward_gemm's epilogue, from the magnitude branch's gradients there.
        dq_in_gemm = (tc_dh and use_zq and MAGNITUDE in g and H <= K.GLU_BACKWARD_GEMM_DQ_H
                      and n_dir <= K.GLU_BACKWARD_GEMM_DQ_COLS)
        if tc_dh:  # dh never reaches memory: the gate's backward in the epilogue of dh's GEMM
            for i in range(0, n, K.GLU_BACKWARD_GEMM_SETS):
                part = g[i : i + K.GLU_BACKWARD_GEMM_SETS]
                wos = []
                for d in part:
                    home, col = out_home(net, d)
                    wos.append(rounded_block(home)[:, col : col + hcol[d + 1] - hcol[d]])
                q_kw = {}
                if dq_in_gemm and MAGNITUDE in part:
                    c0 = gcol + 2 * H * g.index(MAGNITUDE)
                    q_kw = {"dq": dq_z[:, :n_dir], "wq": block(ghome)[H2 : H2 + n_dir, c0 : c0 + 2 * H],
                            "dq_set": part.index(MAGNITUDE)}
                K.glu_backward_gemm([dadv[:, hcol[d] : hcol[d + 1]] for d in part], wos,
                                    dpv[:, 2 * H * i : 2 * H * (i + len(part))], **q_kw)
        elif sigmoid_gate:
            K.glu_backward(dh_all[:, H * d0 : H * d1], dpv, blocks=n, dpv=dpv)
        else:
            for d in g:
                bc, dh_in = c["branches"][d], dh_all[:, H * d : H * (d + 1)]
                dpre, gg = net.gate.backward(cp, gp, d, bc["gcache"], dh_in * bc["val"])
                cp.multiply(dh_in, bc["gate"], out=pv_all[:, lead + 2 * H * d + H : lead + 2 * H * (d + 1)])
                pv_all[:, lead + 2 * H * d : lead + 2 * H * d + H] = dpre
                for k, val in gg.items():
                    ggate[k] = ggate[k] + val if k in ggate else val
        with_v = lead if d0 == DIRECTION else 0  # the joined value head's gradient rides along
        wj = block(ghome)[:, gcol - with_v : gcol + 2 * H * n]
        gw = grad_block(ghome)[:, gcol - with_v : gcol + 2 * H * n]
        dy = pv_all[:, lead + 2 * H * d0 - with_v : lead + 2 * H * d1]  # ([dv] |) dpv
        bu = c["branches"][d0]["u"]  # (a branch with extra input columns is a group of its own)
        with streams.beside():
            if bu is None and use_wgrad:
                # Weights and (ones column) biases; the direction-Q rows zero but the magnitude branch's.
                if not zt:
                    zt.append(K.transpose(z))
                keep = (0, 0)
                if use_zq and MAGNITUDE in g:
                    i = g.index(MAGNITUDE)
                    keep = (with_v + 2 * H * i, with_v + 2 * H * (i + 1))
                K.wgrad_gemm(zt[0], dy, out=gw, zero_rows=(H2, H2 + n_dir) if use_zq else (0, 0), keep_cols=keep)
            else:
                mm(z.T if bu is None else bu.T, dy, out=gw)  # weights and (ones column) biases
            if bu is None and use_zq and not use_wgrad:
                # The direction-Q columns of z meet only the magnitude branch's weights: the other
                # branches' (and the value head's) gradients over those rows of the block are zero.
                if with_v:
                    gw[H2 : H2 + n_dir, :with_v] = 0.0
                for i, d in enumerate(g):
                    if d != MAGNITUDE:
                        gw[H2 : H2 + n_dir, with_v + 2 * H * i : with_v + 2 * H * (i + 1)] = 0.0
        if bu is None:  # K = n 2H (+ the value head's): every branch's gate and value at once, into dz
            # Only z's first H2 columns' gradient goes on (vsn_backward reads it): N = 256 where the
            # whole row's 260 took a third more tiles. The direction-Q columns' (dq, which the
            # direction branch's dueling backward reads) comes from the magnitude branch's
            # pre-activation gradients alone: only its weights meet those columns (done above where
            # glu_backward_gemm had them in its registers).
            if use_zq and MAGNITUDE in g and not dq_in_gemm:
                c0 = with_v + 2 * H * g.index(MAGNITUDE)
                mm(dy[:, c0 : c0 + 2 * H], wj[H2 : H2 + n_dir, c0 : c0 + 2 * H].T, out=dq_z[:, :n_dir])
            if not one_dz:
                mm(dy, wj[:H2].T, out=dz[:, :H2], beta=1.0 if dz_started else 0.0)
                dz_started = True
            return None
        mm(dpv, wj[:H2].T, out=dz[:, :H2], beta=1.0)
        return mm(dpv, wj[H2:].T)[:, : net.in_width[d0] - H2]  # 4-aligned over the block's rows

    groups = branch_groups(net)
    first = next(gr for gr in groups if MAGNITUDE in gr)
    dxes: dict[int, Array | None] = {first[0]: group_backward(first)}
    # The conditioning path into the direction branch's Q: d loss / d (q_dir / q_scale), the
    # direction-Q columns' gradient (dq_z, or the extra columns' gradient), read by the kernel as it is.
    dxq = dxes[first[0]]
    dq = dq_z[:, :n_dir] if dxq is None else dxq[:, :n_dir]
    K.dueling_backward(dlogits, z_sup, offs, branches=(0, 1), accumulate_dv=True, dq=dq, dq_scale=1.0 / net.q_scale,
                       probs=out.probs, q=c["q"], dv=dv, dadv=dadv, padded=True)
    for gr in groups:
        if gr is not first:
            dxes[gr[0]] = group_backward(gr)
    if one_dz:  # every group's [dv | dpv] and the value head's block: K = lead + D 2H
        mm(pv_all, block("value.w")[:H2].T, out=dz[:, :H2], beta=1.0 if dz_started else 0.0)
    for d, dxe in dxes.items():
        col = n_dir if d == MAGNITUDE else 0
        for i, st in enumerate(net.branch_inputs):
            if d in st.branches:
                dcols = dxe[:, col : col + st.width]
                gextra[i] = dcols if gextra[i] is None else gextra[i] + dcols
                col += st.width

    if not lead:  # the value head on its own (with it joined, the direction branch's GEMMs did this)
        mm(dv, block("value.w")[:H2].T, out=dz[:, :H2], beta=1.0)
        gv = grad_block("value.w")
        with streams.beside():
            mm(z.T, dv, out=gv)  # weights and (ones column) bias
            if use_zq:
                gv[H2 : H2 + n_dir] = 0.0
    tc_relu = fused_relu_backward(net, B)  # (dmpre then written rounded to TF32: read as it is)
    dh2_mask, dmpre = K.vsn_backward(dz[:, :H2], c["h2"], c["m"], tf32=tc_relu)
    gm, gmb = slot("vsn.w"), slot("vsn.b")
    with streams.beside():
        mm(c["h2"].T, dmpre, out=gm)
        colsum(dmpre, gmb)
    if tc_relu:  # dh2 written rounded to TF32: the next one reads it as it is
        dh2 = K.linear_gemm_relu_backward(dmpre, K.round_tf32(p["vsn.w"]), c["h2"], addend=dh2_mask,
                                          rounded=dmpre.shape[1], tf32_out=True)
    else:
        dh2 = K.relu_backward(dh2_mask, c["h2"], addend=mm(dmpre, p["vsn.w"].T))
    g2, g2b = slot("trunk.w2"), slot("trunk.b2")
    with streams.beside():
        mm(c["h1"].T, dh2, out=g2)
        colsum(dh2, g2b)
    if tc_relu:
        dh1 = K.linear_gemm_relu_backward(dh2, K.round_tf32(p["trunk.w2"]), c["h1"], rounded=dh2.shape[1])
    else:
        dh1 = K.relu_backward(mm(dh2, p["trunk.w2"].T), c["h1"])
    mm(c["x"].T, dh1, out=grad_block("trunk.w1"))  # weights and (ones column) bias
    streams.join()  # the weight gradients above ran beside the input gradients
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
