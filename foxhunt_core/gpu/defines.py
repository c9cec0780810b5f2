"""The compile-time constants that the core's kernels and their launch wrappers share: one table.

Every ``#define`` that both a ``.cu`` file and Python read (a tile's rows, a block's threads, the
network's default sizes, a kernel variant's default) is an entry of :data:`TABLE`. The kernels
read them from ``kernels/defines.cuh``, which is generated from this table (``python -m
foxhunt_core.gpu.defines`` rewrites it; ``tests/test_kernels_compile.py`` checks that it is the
table's rendering); the wrappers read the same values from here. Each entry is a default: a
launch's ``#define`` preamble (:func:`foxhunt_core.backend.load_module`) overrides the variant
settings (stages, cluster sizes, the network's sizes), which the header only supplies when a file
is compiled on its own (``nvcc -ptx``).

Nothing here imports CuPy.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

HEADER = Path(__file__).resolve().parent.parent / "kernels" / "defines.cuh"


@dataclass(frozen=True)
class Define:
    """One shared constant: its name, its value (as the preprocessor reads it), what it is."""

    name: str
    value: int | str
    meaning: str


def _entries() -> list[tuple[str, list[Define]]]:
    tc_bm, tc_bk, consumer_warps = 128, 32, 8
    tc_threads = 32 * consumer_warps + 32
    dueling_warps = 7
    wg_n, wg_nt = 256, 8
    gb_bh = 128
    return [
        ("the network's sizes (NetSettings' defaults; a launch passes its own, launch.branch_defines)", [
            Define("NUM_ATOMS", 51, "N, atoms per distribution"),
            Define("NUM_ACTIONS", 12, "A, actions over all branches"),
            Define("NUM_BRANCHES", 4, "D"),
            Define("BRANCH_OFFSETS", "{0,3,6,9,12}", "{o_0, ..., o_D}: branch d owns actions [o_d, o_{d+1})"),
            Define("MAX_BRANCH_SIZE", 3, "the largest o_{d+1} - o_d"),
            Define("BRANCH_OF_ACTION", "{0,0,0,1,1,1,2,2,2,3,3,3}", "{d(0), ..., d(A-1)}: the branch of each action"),
            Define("ATTN_DIM", 8, "the attention's token width k"),
            Define("ADV_COLUMNS", "{0,153,306,459,612}",
                   "{c_0, ..., c_D}: where branch d's block of an advantage row starts; c_D its width"),
            Define("V_COLUMNS", 51, "the value head's width (N, or N padded to a multiple of 4)"),
        ]),
        ("blocks of the grid-stride kernels", [
            Define("BLOCK_THREADS", 256, "threads per block of the elementwise, dueling, loss, Adam and "
                                         "statistics kernels"),
            Define("DUELING_BLOCKS_PER_SM", 4, "blocks of the dueling row kernels resident per SM (a launch "
                                               "passes its layout's: launch.dueling_blocks_per_sm)"),
        ]),
        ("attention.cu", [
            Define("ATT_SLOTS", 16, "token slots (threads) per sample: at most 16 actions"),
            Define("ATT_SAMPLES", 16, "samples per block (two per warp)"),
            Define("ATT_FORWARD_BLOCKS", 3, "attention_forward's blocks per SM (__launch_bounds__)"),
            Define("ATT_BACKWARD_BLOCKS", 2, "attention_backward's blocks per SM (__launch_bounds__)"),
            Define("ATT_REDUCE_WARPS", 32, "attention_grad_reduce's warps per block"),
            Define("ATT_MAX_DIM", 16, "the widest attn_dim the kernels take"),
        ]),
        ("tc_gemm.cuh: the tensor-core GEMMs' tile and warps", [
            Define("TC_BM", tc_bm, "rows per tile (two consumer warpgroups of 64)"),
            Define("TC_BK", tc_bk, "k per stage and per TMA box: one 128-byte swizzle row"),
            Define("TC_CONSUMER_WARPS", consumer_warps, "the two consumer warpgroups' warps"),
            Define("TC_THREADS", tc_threads, "the consumers and the producer warp"),
        ]),
        ("glu_gemm.cu", [
            Define("GW_BH", 128, "GLU columns per tile (the gate's and the value's, each)"),
            Define("GW_STAGES", 4, "shared-memory stages of the ring (variant)"),
            Define("GW_STAGED_BOXES", 2, "boxes of h (32 columns x 128 rows) the staging buffer holds (variant)"),
            Define("GW_STORE_BOXES", 1, "boxes handed to the TMA unit at a time (variant)"),
            Define("GW_CLUSTER", 2, "CTAs per cluster: row tiles sharing one weight load (variant)"),
            Define("GW_PV_TMA", 0, "1: pv leaves through the staging buffer by TMA (variant, set per call)"),
            Define("GW_ROUND_H", 0, "1: h written rounded to TF32 (variant)"),
            Define("GW_TAIL_STEPS", 4, "k steps of 8 in the last chunk, (K - 1) % 32 / 8 + 1 (variant)"),
        ]),
        ("linear_gemm.cu (and heads_dueling's dueling warps, dueling_row.cuh)", [
            Define("LG_BN", 160, "columns per tile: the wgmma's N (variant)"),
            Define("LG_STAGES", 4, "shared-memory stages of the ring (variant)"),
            Define("LG_CLUSTER", 1, "CTAs per cluster (variant)"),
            Define("LG_TAIL_STEPS", 4, "k steps of 8 in the last chunk (variant)"),
            Define("LG_RELU", 0, "1: ReLU in the epilogue (variant)"),
            Define("LG_ROUND_OUT", 0, "1: out written rounded to TF32 (variant)"),
            Define("LG_DRELU", 0, "1: the ReLU's backward in the epilogue (variant)"),
            Define("LG_DUELING", 0, "1: the dueling forward on warps beside the products (variant)"),
            Define("LG_BRANCHES", 4, "operand sets per launch, at most"),
            Define("LG_DUELING_WARPS", dueling_warps, "the dueling warps beside the consumers and the producer"),
            Define("LG_DUELING_THREADS", tc_threads + 32 * dueling_warps, "threads of the dueling variant"),
            Define("DG_LANES", 8, "lanes per row of the dueling warps"),
            Define("DG_BUDGET", 24, "a branch's logits per lane, at most"),
        ]),
        ("glu_backward_gemm.cu", [
            Define("GB_BH", gb_bh, "GLU columns per tile: the wgmma's N"),
            Define("GB_SETS", 3, "branches per launch, at most"),
            Define("GB_PARTS", gb_bh // 32, "the staging buffer's parts: a gate box and its value box"),
            Define("GB_THREADS", tc_threads - 32 + 128, "the consumers and a whole warpgroup of loaders and a storer "
                                                        "(setmaxnreg works per warpgroup)"),
            Define("GB_NQ_MAX", 4, "dq's columns, at most"),
            Define("GB_GATE_TERMS_MAX", 9, "a gate's parameter-gradient terms per unit, at most (kan_gate's 8 "
                                           "bases and residual: the consumers' sums then fit their 232 registers)"),
            Define("GB_STAGES", 3, "shared-memory stages of the ring (variant)"),
            Define("GB_NQ", 0, "dq's columns (0: no dq; variant)"),
            Define("GB_TAIL_STEPS", 4, "k steps of 8 in the last chunk (variant)"),
        ]),
        ("gate.cuh and gate_glu.cu (a gate's fragment in the GLU kernels)", [
            Define("GATE_MAX_SETS", 8, "branches of one launch whose gate parameters it reads, at most"),
            Define("GG_UNIT_TILE", 32, "gate_glu_backward's block: units ..."),
            Define("GG_ROW_THREADS", 8, "... by threads down the rows"),
            Define("GG_ROW_BATCH", 8, "... each loading this many rows before it computes (gate_glu.cu)"),
            Define("GT_ROW_THREADS", 32, "gate_terms_reduce's block: GG_UNIT_TILE units by this many threads "
                                         "down the (CTA, warp) pairs ..."),
            Define("GT_IN_FLIGHT", 8, "... each with this many loads issued before it adds them"),
        ]),
        ("wgrad_gemm.cu", [
            Define("WG_N", wg_n, "the main wgmma's N: xt's rows 0..255"),
            Define("WG_NT", wg_nt, "the tail wgmma's N: xt's rows 256..263"),
            Define("WG_ROWS", wg_n + wg_nt, "xt's rows per stage: the widest layer input"),
            Define("WG_BOX_ROWS", 88, "xt's rows per TMA box (11 KiB: each box starts 1024-aligned)"),
            Define("WG_THREADS", tc_threads - 32 + 128, "the consumers and a whole producer warpgroup"),
            Define("WG_STAGES", 4, "shared-memory stages of the ring (variant)"),
            Define("WT_SETS", 4, "wgrad_gemm_tx's operand sets per launch, at most"),
            Define("WT_STAGES", 3, "wgrad_gemm_tx's shared-memory stages"),
        ]),
    ]


SECTIONS: list[tuple[str, list[Define]]] = _entries()
TABLE: dict[str, Define] = {d.name: d for _, group in SECTIONS for d in group}
# The network's default sizes as a launch preamble takes them (strings), for the compile checks.
NETWORK = ("NUM_ATOMS", "NUM_ACTIONS", "NUM_BRANCHES", "BRANCH_OFFSETS", "MAX_BRANCH_SIZE", "BRANCH_OF_ACTION",
           "ATTN_DIM", "ADV_COLUMNS", "V_COLUMNS")
DEFAULT_DEFINES: dict[str, str] = {name: str(TABLE[name].value) for name in NETWORK}


def value(name: str) -> int:
    """An integer entry of the table."""
    v = TABLE[name].value
    if not isinstance(v, int):
        raise TypeError(f"{name} is not an integer: {v!r}")
    return v


def render_header() -> str:
    """``kernels/defines.cuh`` as the table gives it: each entry a default (``#ifndef``)."""
    lines = ["// Generated from foxhunt_core/gpu/defines.py (python -m foxhunt_core.gpu.defines): do not edit.",
             "// The constants the kernels share with their launch wrappers; a launch's #define preamble",
             "// overrides the variant settings and the network's sizes.",
             "#pragma once"]
    for title, group in SECTIONS:
        lines.append("")
        lines.append(f"// {title}")
        for d in group:
            lines += [f"#ifndef {d.name}", f"#define {d.name} {d.value}  // {d.meaning}", "#endif"]
    return "\n".join(lines) + "\n"


def main() -> int:
    HEADER.write_text(render_header())
    print(f"wrote {HEADER}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
