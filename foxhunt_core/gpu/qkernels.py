"""Launch wrappers of the Q-pipeline kernels: cross-branch attention, Q-statistics, Boltzmann.

=====================  ===============================  ==================================  =====================
wrapper                kernels (file)                   NumPy twin                          thread mapping
=====================  ===============================  ==================================  =====================
``attention_forward``  attention_forward                ``attention.forward``               16 threads per sample
                       (``attention.cu``)                                                   (one per token)
``attention_backward`` attention_backward               ``attention.backward``              16 threads per sample;
                       (or attention_backward_dq),                                          block partials, then
                       attention_grad_reduce                                                thread per entry
``q_stats_reduce``     q_stats_partial,                 ``qpipe.q_statistics``              thread per sample and
                       q_stats_finalize (``qstats.cu``)                                     warp per 4 (b, a) rows;
                                                                                            warp per entry
``boltzmann_select``   boltzmann_select,                ``explore.boltzmann_select`` with   thread per sample
                       counter_advance                  :func:`.philox.boltzmann_uniforms`
                       (``boltzmann.cu``)
=====================  ===============================  ==================================  =====================

The reductions are deterministic: each block writes one row of partial sums (float64) into a
workspace and a second kernel adds the rows in a fixed order. Workspaces come from the
``*_workspace`` helpers (allocate once, before graph capture). Like every wrapper here, these
never synchronize with the host; :func:`q_stats_record` is the one explicit host read.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..backend import check_array
from .defines import value
from .launch import (
    MAX_PARTIALS,
    THREADS,
    blocks_for,
    branch_defines,
    f32,
    i32,
    output,
    reduction_blocks,
    sm_count,
    validate_offsets,
)
from .launch import get_kernel as _kernel
from .philox import split64

Array = Any
F32 = np.float32
F64 = np.float64
ATT_SLOTS = value("ATT_SLOTS")  # token slots per sample in attention.cu (so at most 16 actions)
ATT_SAMPLES = value("ATT_SAMPLES")  # samples per block in attention.cu
# Blocks per SM that the kernels' __launch_bounds__ guarantee
ATT_FORWARD_BLOCKS = value("ATT_FORWARD_BLOCKS")
ATT_BACKWARD_BLOCKS = value("ATT_BACKWARD_BLOCKS")
ATT_REDUCE_THREADS = 32 * value("ATT_REDUCE_WARPS")  # attention_grad_reduce
MAX_ATTN_DIM = value("ATT_MAX_DIM")


# ------------------------------------------------------------------ attention.cu
def attention_params_size(num_actions: int, dim: int) -> int:
    """Entries of one partial row of the attention backward (see attention.cu): a block's share of
    the four parameter gradients, ``[demb | dwq | dwk | dgate]``."""
    return num_actions * dim + 2 * (dim + 1) * dim + num_actions


def _attention_setup(k: str, q: Array, emb: Array, wq: Array, wk: Array, gate: Array) -> tuple[int, int, int, dict]:
    check_array(k, "q", q, F32, (None, None))
    B, A = q.shape
    check_array(k, "emb", emb, F32, (A, None))
    K = emb.shape[1]
    if not (1 <= A <= ATT_SLOTS and 1 <= K <= MAX_ATTN_DIM):
        raise ValueError(
            f"{k}: supports at most {ATT_SLOTS} actions and attn_dim {MAX_ATTN_DIM} (at least 1 each), got {A}, {K}"
        )
    if (B + ATT_SAMPLES) * A >= 2**31:
        raise ValueError(f"{k}: {B} samples of {A} actions are too many for 32-bit indices")
    check_array(k, "wq", wq, F32, (K + 1, K))
    check_array(k, "wk", wk, F32, (K + 1, K))
    check_array(k, "gate", gate, F32, (A,))
    return B, A, K, {"NUM_ACTIONS": A, "ATTN_DIM": K}


def attention_forward(
    q: Array, emb: Array, wq: Array, wk: Array, gate: Array, *, qc: Array | None = None, attn: Array | None = None
) -> Array:
    """Coordinated Q [B, A] from Q [B, A] (parameters as ``attention.init_params``, float32).

    ``attn`` [B, A, A], when given, receives the attention weights (for inspection and tests).
    """
    k = "attention_forward"
    B, A, K, defs = _attention_setup(k, q, emb, wq, wk, gate)
    qc = output(k, "qc", qc, (B, A))
    if attn is not None:
        check_array(k, "attn", attn, F32, (B, A, A))
    grid = blocks_for(B, ATT_SAMPLES, ATT_FORWARD_BLOCKS * sm_count())
    _kernel("attention.cu", k, defs)((grid,), (ATT_SLOTS * ATT_SAMPLES,), (q, emb, wq, wk, gate, qc, attn, i32(B)))
    return qc


def attention_workspace(num_actions: int, dim: int) -> Array:
    """Workspace of :func:`attention_backward`: ``MAX_PARTIALS`` partial rows (float64)."""
    import cupy

    return cupy.empty((MAX_PARTIALS, attention_params_size(num_actions, dim)), dtype=F64)


def attention_backward(
    q: Array,
    dqc: Array,
    emb: Array,
    wq: Array,
    wk: Array,
    gate: Array,
    *,
    dq: Array | None = None,
    need_dq: bool = False,
    demb: Array | None = None,
    dwq: Array | None = None,
    dwk: Array | None = None,
    dgate: Array | None = None,
    workspace: Array | None = None,
) -> tuple[Array | None, dict[str, Array]]:
    """Gradients of the attention from ``dloss/dqc`` [B, A]; the forward is recomputed from ``q``.

    Returns ``(dq, grads)`` with ``grads`` keyed like ``attention.init_params``
    (``attn.emb``, ``attn.wq``, ``attn.wk``, ``attn.gate``); the gradient outputs can be views
    of a flat gradient buffer. ``dq`` is computed only when it is given or ``need_dq`` is set (the
    training step stops the gradient at the raw Q, so it usually is not; the kernel without it,
    ``attention_backward``, is the lighter one).
    """
    k = "attention_backward"
    B, A, K, defs = _attention_setup(k, q, emb, wq, wk, gate)
    check_array(k, "dqc", dqc, F32, (B, A))
    if dq is not None or need_dq:
        dq = output(k, "dq", dq, (B, A))
    demb = output(k, "demb", demb, (A, K))
    dwq = output(k, "dwq", dwq, (K + 1, K))
    dwk = output(k, "dwk", dwk, (K + 1, K))
    dgate = output(k, "dgate", dgate, (A,))
    P = attention_params_size(A, K)
    if workspace is None:
        workspace = attention_workspace(A, K)
    else:
        check_array(k, "workspace", workspace, F64, (MAX_PARTIALS, P))
    grid = reduction_blocks(B, ATT_SAMPLES, blocks_per_sm=ATT_BACKWARD_BLOCKS)
    block = (ATT_SLOTS * ATT_SAMPLES,)
    if dq is None:
        _kernel("attention.cu", k, defs)((grid,), block, (q, dqc, emb, wq, wk, gate, workspace, i32(B)))
    else:
        _kernel("attention.cu", "attention_backward_dq", defs)(
            (grid,), block, (q, dqc, emb, wq, wk, gate, dq, workspace, i32(B))
        )
    _kernel("attention.cu", "attention_grad_reduce", defs)(
        (blocks_for(P, 32),), (ATT_REDUCE_THREADS,), (workspace, i32(grid), demb, dwq, dwk, dgate)
    )
    return dq, {"attn.emb": demb, "attn.wq": dwq, "attn.wk": dwk, "attn.gate": dgate}


# ------------------------------------------------------------------ qstats.cu
def q_stats_keys(num_branches: int) -> list[str]:
    """Names of the entries of :func:`q_stats_reduce`'s output, in order (as ``qpipe.q_statistics``)."""
    return (
        ["q_min", "q_max", "q_mean", "q_var", "raw_q_mean", "atom_entropy", "atom_utilization"]
        + [f"q_gap_{d}" for d in range(num_branches)]
        + ["avg_max_q"]
    )


def q_stats_workspace(num_branches: int) -> Array:
    """Workspace of :func:`q_stats_reduce` (``MAX_PARTIALS`` rows of ``7 + 2 D`` partial sums)."""
    import cupy

    return cupy.empty((MAX_PARTIALS, 7 + 2 * num_branches), dtype=F64)


def q_stats_reduce(
    q_coord: Array,
    q_raw: Array,
    probs: Array,
    offsets: Sequence[int],
    mass_threshold: float,
    *,
    out: Array | None = None,
    workspace: Array | None = None,
) -> Array:
    """Every statistic of ``qpipe.q_statistics`` in one reduction; returns ``out`` [8 + D] float64.

    ``mass_threshold`` is the run's ``atom_mass_threshold`` (an atom counts as used when its
    probability is at least ``mass_threshold / N``). The result stays on the device; read it with
    :func:`q_stats_record` once per stats interval.
    """
    k = "q_stats_reduce"
    check_array(k, "probs", probs, F32, (None, None, None))
    B, A, N = probs.shape
    offs = validate_offsets(k, offsets, A, min_size=2)
    D = len(offs) - 1
    P = 7 + 2 * D
    if P > 32:
        raise ValueError(f"{k}: at most 12 branches, got {D}")
    check_array(k, "q_coord", q_coord, F32, (B, A))
    check_array(k, "q_raw", q_raw, F32, (B, A))
    out = output(k, "out", out, (8 + D,), F64)
    if workspace is None:
        workspace = q_stats_workspace(D)
    else:
        check_array(k, "workspace", workspace, F64, (MAX_PARTIALS, P))
    defs = branch_defines(offs, N)
    # 8 warps x 4 rows per block; ~80 registers x 256 threads: 3 blocks per SM
    grid = reduction_blocks(B * A, 32, blocks_per_sm=3)
    _kernel("qstats.cu", "q_stats_partial", defs)(
        (grid,), (THREADS,), (q_coord, q_raw, probs, f32(mass_threshold / N), workspace, i32(B))
    )
    _kernel("qstats.cu", "q_stats_finalize", defs)((1,), (32 * P,), (workspace, i32(grid), i32(B), out))
    return out


def q_stats_record(out: Array, num_branches: int) -> dict[str, float]:
    """The statistics as a ``{name: float}`` record: one device-to-host copy (this synchronizes)."""
    host = out.get() if hasattr(out, "get") else np.asarray(out)
    return {name: float(v) for name, v in zip(q_stats_keys(num_branches), host)}


# ------------------------------------------------------------------ boltzmann.cu
def boltzmann_select(
    values: Array,
    offsets: Sequence[int],
    temps: Array,
    seed: int,
    counter: int | Array,
    *,
    actions: Array | None = None,
    advance: bool = True,
) -> Array:
    """Per-branch Boltzmann draw by inverse CDF: actions [B, D] int32.

    The uniform of sample ``b``, branch ``d`` is Philox4x32-10 keyed by ``(seed, counter, b)``
    (see :mod:`.philox`; exact twin: ``explore.boltzmann_select(values, offsets, temps,
    philox.boltzmann_uniforms(seed, counter, B, D))``).

    Args:
        values: [B, A] selection values; temps: [D] per-branch temperatures (on the device, so a
            captured graph sees updated temperatures).
        seed: a 64-bit run seed.
        counter: a 64-bit draw counter: a Python int, or a CuPy uint64 array of shape (1,) read
            on the device; with ``advance`` the array is incremented after the draw, so replaying
            a captured graph draws fresh numbers each time.
    """
    k = "boltzmann_select"
    check_array(k, "values", values, F32, (None, None))
    B, A = values.shape
    offs = validate_offsets(k, offsets, A)
    D = len(offs) - 1
    check_array(k, "temps", temps, F32, (D,))
    actions = output(k, "actions", actions, (B, D), np.int32)
    s_lo, s_hi = split64(seed)
    if isinstance(counter, (int, np.integer)):
        split64(int(counter))  # range check
        c_dev, c_host = None, np.uint64(int(counter))
    else:
        check_array(k, "counter", counter, np.uint64, (1,))
        c_dev, c_host = counter, np.uint64(0)
    defs = branch_defines(offs)
    grid = blocks_for(B, THREADS, 16 * sm_count())
    _kernel("boltzmann.cu", k, defs)(
        (grid,), (THREADS,), (values, temps, np.uint32(s_lo), np.uint32(s_hi), c_dev, c_host, actions, i32(B))
    )
    if c_dev is not None and advance:
        _kernel("boltzmann.cu", "counter_advance", defs)((1,), (1,), (c_dev, np.uint64(1)))
    return actions
