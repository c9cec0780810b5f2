"""Where the fused network keeps its weights and activations: widths, weight blocks, storage.

The GPU network stores its weights in padded, joined blocks (see :mod:`foxhunt_core.net.fused`):
the biases in each block's last row, every GLU's gate and value weights side by side behind the
value head, the advantage layers side by side. This module says which block holds which tensor
and how wide every augmented activation is; it depends on the network's shapes and stages only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...gpu.flat import storage_of
from ...gpu.launch import HEAD_ALIGN, head_columns, padded

Array = Any
Shape = tuple[int, ...]
DIRECTION, MAGNITUDE = 0, 1


def x_width(net: Any) -> int:
    """Width of the augmented observation ``[obs, 0, ..., 0, 1]``."""
    return padded(net.settings.state_dim + 1)


def columns_in_z(net: Any) -> bool:
    """Whether the branch-input columns ride in the augmented z (:func:`z_width`): there are some,
    and every stage declares them columns of the observation (``observation_columns``), which the
    forward copies into z; its branches' GLUs then read z like every other."""
    return bool(net.branch_inputs) and all(getattr(st, "observation_columns", None) is not None
                                           for st in net.branch_inputs)


def z_input(net: Any, d: int) -> bool:
    """Whether branch ``d``'s GLU input is the augmented z (no extra columns, or the columns in z)."""
    return not net.extra_width[d] or columns_in_z(net)


def z_width(net: Any) -> int:
    """Width of the augmented ``z`` = ``[z, q_dir / q_scale, extra columns, 0, ..., 0, 1]`` (the
    branch-input columns where :func:`columns_in_z`, each branch's after the previous branch's)."""
    extra = sum(net.extra_width) if columns_in_z(net) else 0
    return padded(net.settings.shared_h2 + net.sizes[DIRECTION] + extra + 1)


def z_extra_col(net: Any, d: int) -> int:
    """First column of branch ``d``'s branch-input columns in the augmented z (:func:`columns_in_z`)."""
    return net.settings.shared_h2 + net.sizes[DIRECTION] + sum(net.extra_width[:d])


def h_width(net: Any) -> int:
    """Width of a GLU's augmented output ``[h, 0, ..., 0, 1]``."""
    return padded(net.settings.adv_h + 1)


def glu_rows(net: Any, d: int) -> int:
    """Rows of branch ``d``'s GLU block: the augmented z's width, or for a branch with extra input
    columns its own augmented input ``[z, (q_dir), extra columns, 0, ..., 0, 1]``."""
    if z_input(net, d):
        return z_width(net)
    return padded(net.in_width[d] + 1)


def joint(net: Any) -> bool:
    """Whether every branch's GLU weights share one block, and every branch's advantage weights
    another (every branch reads the augmented z): one GEMM then serves several branches."""
    return all(z_input(net, d) for d in range(len(net.sizes)))


def value_joined(net: Any) -> bool:
    """Whether the value head's weights sit in the direction branch's GLU block, in front of its
    ``[W_gate | W_val]`` (the direction branch's input is the augmented z, as the value head's):
    one GEMM then computes the value head and the direction GLU's pre-activations, and the
    backward has one input-gradient and one weight-gradient GEMM for both."""
    return z_input(net, DIRECTION)


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
    the top from column ``col``, an integer row places a matrix from that row down (the rows
    reading branch-input columns) or a vector (a bias: the block's last row, met by the input's
    ones column)."""
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
        members = [(f"branch{d}.w_gate", None, c), (f"branch{d}.w_val", None, c + H),
                   (f"branch{d}.b_gate", r - 1, c), (f"branch{d}.b_val", r - 1, c + H)]
        if net.extra_width[d]:  # the rows reading the branch-input columns: where they are in the input
            at = z_extra_col(net, d) if columns_in_z(net) else net.base_width(d)
            members += [(f"branch{d}.w_gate_in", at, c), (f"branch{d}.w_val_in", at, c + H)]
        out.setdefault(home, ((r, glu_cols), []))[1].extend(members)
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
    from ...gpu.flat import Shared

    out: dict[str, Any] = {}
    for home, (shape, members) in blocks(net).items():
        out[home] = shape
        for name, row, col in members[1:]:
            out[name] = Shared(home, col, row)
    return out


def placed(blk: Array, name_row_col: tuple[str, int | None, int], like: Array) -> Array:
    """The part of ``blk`` where a tensor shaped like ``like`` lives."""
    _, row, col = name_row_col
    if row is not None and like.ndim == 1:
        return blk[row, col : col + like.shape[0]]
    r0 = row or 0
    return blk[r0 : r0 + like.shape[0], col : col + like.shape[1]]


def block_of(sub: Any, net: Any, home: str, xp: Any) -> Array:
    """Weight block ``home`` (:func:`blocks`) of the parameters ``sub``: the flat buffer's own
    block when ``sub`` has it, else a zero block (of the array module ``xp``) with the tensors
    copied in."""
    shape, members = blocks(net)[home]
    blk = storage_of(sub, home)
    if blk is not None and tuple(blk.shape) == shape and all(storage_of(sub, n) is blk for n, _, _ in members):
        return blk
    blk = xp.zeros(shape, dtype=sub[home].dtype)
    for m in members:
        placed(blk, m, sub[m[0]])[...] = sub[m[0]]
    return blk


def branch_groups(net: Any) -> list[tuple[int, ...]]:
    """The branches whose GLUs run as one (one GEMM, one kernel), in forward order: the direction
    branch alone first (the magnitude branch reads its Q), then the others together when their
    weights share blocks (:func:`joint`), else one by one."""
    D = len(net.sizes)
    if joint(net):
        return [(DIRECTION,), tuple(d for d in range(D) if d != DIRECTION)]
    return [(DIRECTION,)] + [(d,) for d in range(D) if d != DIRECTION]


def uniform(net: Any, g: Sequence[int]) -> bool:
    """Whether the branches ``g`` have advantage blocks of one width (one strided-batched GEMM)."""
    hcol = head_columns(net.offsets, net.num_atoms, HEAD_ALIGN)
    return joint(net) and len(g) > 1 and len({hcol[d + 1] - hcol[d] for d in g}) == 1


def tree_stride(net: Any, trees: Sequence[dict]) -> int | None:
    """Elements between the weight blocks of consecutive parameter trees when they are one
    stacked allocation (the same distance for every block), 0 when all are the same tree, None
    otherwise."""
    if all(t is trees[0] for t in trees):
        return 0
    homes = list(blocks(net))
    stride = None
    for name in [*homes, "trunk.w2", "trunk.b2", "vsn.w", "vsn.b"]:
        arrays = [storage_of(t["core"], name) if name in homes else t["core"][name] for t in trees]
        if any(a is None or a.shape != arrays[0].shape or a.strides != arrays[0].strides for a in arrays):
            return None
        ptrs = [address(a) for a in arrays]
        step = ptrs[1] - ptrs[0]
        if step <= 0 or step % arrays[0].itemsize or any(p - ptrs[0] != i * step for i, p in enumerate(ptrs)):
            return None
        step //= arrays[0].itemsize
        if stride is not None and step != stride:
            return None
        stride = step
    return stride


def address(a: Array) -> int:
    """Device (or host, for the NumPy check of this module) address of an array's first element."""
    ptr = getattr(a.data, "ptr", None)
    return int(ptr) if ptr is not None else int(a.__array_interface__["data"][0])
