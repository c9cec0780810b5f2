// Generated from foxhunt_core/gpu/defines.py (python -m foxhunt_core.gpu.defines): do not edit.
// The constants the kernels share with their launch wrappers; a launch's #define preamble
// overrides the variant settings and the network's sizes.
#pragma once

// the network's sizes (NetSettings' defaults; a launch passes its own, launch.branch_defines)
#ifndef NUM_ATOMS
#define NUM_ATOMS 51  // N, atoms per distribution
#endif
#ifndef NUM_ACTIONS
#define NUM_ACTIONS 12  // A, actions over all branches
#endif
#ifndef NUM_BRANCHES
#define NUM_BRANCHES 4  // D
#endif
#ifndef BRANCH_OFFSETS
#define BRANCH_OFFSETS {0,3,6,9,12}  // {o_0, ..., o_D}: branch d owns actions [o_d, o_{d+1})
#endif
#ifndef MAX_BRANCH_SIZE
#define MAX_BRANCH_SIZE 3  // the largest o_{d+1} - o_d
#endif
#ifndef BRANCH_OF_ACTION
#define BRANCH_OF_ACTION {0,0,0,1,1,1,2,2,2,3,3,3}  // {d(0), ..., d(A-1)}: the branch of each action
#endif
#ifndef ATTN_DIM
#define ATTN_DIM 8  // the attention's token width k
#endif
#ifndef ADV_COLUMNS
#define ADV_COLUMNS {0,153,306,459,612}  // {c_0, ..., c_D}: where branch d's block of an advantage row starts; c_D its width
#endif
#ifndef V_COLUMNS
#define V_COLUMNS 51  // the value head's width (N, or N padded to a multiple of 4)
#endif

// blocks of the grid-stride kernels
#ifndef BLOCK_THREADS
#define BLOCK_THREADS 256  // threads per block of the elementwise, dueling, loss, Adam and statistics kernels
#endif
#ifndef DUELING_BLOCKS_PER_SM
#define DUELING_BLOCKS_PER_SM 4  // blocks of the dueling row kernels resident per SM (a launch passes its layout's: launch.dueling_blocks_per_sm)
#endif

// attention.cu
#ifndef ATT_SLOTS
#define ATT_SLOTS 16  // token slots (threads) per sample: at most 16 actions
#endif
#ifndef ATT_SAMPLES
#define ATT_SAMPLES 16  // samples per block (two per warp)
#endif
#ifndef ATT_FORWARD_BLOCKS
#define ATT_FORWARD_BLOCKS 3  // attention_forward's blocks per SM (__launch_bounds__)
#endif
#ifndef ATT_BACKWARD_BLOCKS
#define ATT_BACKWARD_BLOCKS 2  // attention_backward's blocks per SM (__launch_bounds__)
#endif
#ifndef ATT_REDUCE_WARPS
#define ATT_REDUCE_WARPS 32  // attention_grad_reduce's warps per block
#endif
#ifndef ATT_MAX_DIM
#define ATT_MAX_DIM 16  // the widest attn_dim the kernels take
#endif

// tc_gemm.cuh: the tensor-core GEMMs' tile and warps
#ifndef TC_BM
#define TC_BM 128  // rows per tile (two consumer warpgroups of 64)
#endif
#ifndef TC_BK
#define TC_BK 32  // k per stage and per TMA box: one 128-byte swizzle row
#endif
#ifndef TC_CONSUMER_WARPS
#define TC_CONSUMER_WARPS 8  // the two consumer warpgroups' warps
#endif
#ifndef TC_THREADS
#define TC_THREADS 288  // the consumers and the producer warp
#endif

// glu_gemm.cu
#ifndef GW_BH
#define GW_BH 128  // GLU columns per tile (the gate's and the value's, each)
#endif
#ifndef GW_STAGES
#define GW_STAGES 4  // shared-memory stages of the ring (variant)
#endif
#ifndef GW_STAGED_BOXES
#define GW_STAGED_BOXES 2  // boxes of h (32 columns x 128 rows) the staging buffer holds (variant)
#endif
#ifndef GW_STORE_BOXES
#define GW_STORE_BOXES 1  // boxes handed to the TMA unit at a time (variant)
#endif
#ifndef GW_CLUSTER
#define GW_CLUSTER 2  // CTAs per cluster: row tiles sharing one weight load (variant)
#endif
#ifndef GW_PV_TMA
#define GW_PV_TMA 0  // 1: pv leaves through the staging buffer by TMA (variant, set per call)
#endif
#ifndef GW_ROUND_H
#define GW_ROUND_H 0  // 1: h written rounded to TF32 (variant)
#endif
#ifndef GW_TAIL_STEPS
#define GW_TAIL_STEPS 4  // k steps of 8 in the last chunk, (K - 1) % 32 / 8 + 1 (variant)
#endif

// linear_gemm.cu (and heads_dueling's dueling warps, dueling_row.cuh)
#ifndef LG_BN
#define LG_BN 160  // columns per tile: the wgmma's N (variant)
#endif
#ifndef LG_STAGES
#define LG_STAGES 4  // shared-memory stages of the ring (variant)
#endif
#ifndef LG_CLUSTER
#define LG_CLUSTER 1  // CTAs per cluster (variant)
#endif
#ifndef LG_TAIL_STEPS
#define LG_TAIL_STEPS 4  // k steps of 8 in the last chunk (variant)
#endif
#ifndef LG_RELU
#define LG_RELU 0  // 1: ReLU in the epilogue (variant)
#endif
#ifndef LG_ROUND_OUT
#define LG_ROUND_OUT 0  // 1: out written rounded to TF32 (variant)
#endif
#ifndef LG_DRELU
#define LG_DRELU 0  // 1: the ReLU's backward in the epilogue (variant)
#endif
#ifndef LG_DUELING
#define LG_DUELING 0  // 1: the dueling forward on warps beside the products (variant)
#endif
#ifndef LG_BRANCHES
#define LG_BRANCHES 4  // operand sets per launch, at most
#endif
#ifndef LG_DUELING_WARPS
#define LG_DUELING_WARPS 7  // the dueling warps beside the consumers and the producer
#endif
#ifndef LG_DUELING_THREADS
#define LG_DUELING_THREADS 512  // threads of the dueling variant
#endif
#ifndef DG_LANES
#define DG_LANES 8  // lanes per row of the dueling warps
#endif
#ifndef DG_BUDGET
#define DG_BUDGET 24  // a branch's logits per lane, at most
#endif

// glu_backward_gemm.cu
#ifndef GB_BH
#define GB_BH 128  // GLU columns per tile: the wgmma's N
#endif
#ifndef GB_SETS
#define GB_SETS 3  // branches per launch, at most
#endif
#ifndef GB_PARTS
#define GB_PARTS 4  // the staging buffer's parts: a gate box and its value box
#endif
#ifndef GB_THREADS
#define GB_THREADS 384  // the consumers and a whole warpgroup of loaders and a storer (setmaxnreg works per warpgroup)
#endif
#ifndef GB_NQ_MAX
#define GB_NQ_MAX 4  // dq's columns, at most
#endif
#ifndef GB_GATE_TERMS_MAX
#define GB_GATE_TERMS_MAX 9  // a gate's parameter-gradient terms per unit, at most (kan_gate's 8 bases and residual: the consumers' sums then fit their 232 registers)
#endif
#ifndef GB_STAGES
#define GB_STAGES 3  // shared-memory stages of the ring (variant)
#endif
#ifndef GB_NQ
#define GB_NQ 0  // dq's columns (0: no dq; variant)
#endif
#ifndef GB_TAIL_STEPS
#define GB_TAIL_STEPS 4  // k steps of 8 in the last chunk (variant)
#endif

// gate.cuh and gate_glu.cu (a gate's fragment in the GLU kernels)
#ifndef GATE_MAX_SETS
#define GATE_MAX_SETS 8  // branches of one launch whose gate parameters it reads, at most
#endif
#ifndef GG_UNIT_TILE
#define GG_UNIT_TILE 32  // gate_glu_backward's block: units ...
#endif
#ifndef GG_ROW_THREADS
#define GG_ROW_THREADS 8  // ... by threads down the rows
#endif
#ifndef GG_ROW_BATCH
#define GG_ROW_BATCH 8  // ... each loading this many rows before it computes (gate_glu.cu)
#endif
#ifndef GT_ROW_THREADS
#define GT_ROW_THREADS 32  // gate_terms_reduce's block: GG_UNIT_TILE units by this many threads down the (CTA, warp) pairs ...
#endif
#ifndef GT_IN_FLIGHT
#define GT_IN_FLIGHT 8  // ... each with this many loads issued before it adds them
#endif

// wgrad_gemm.cu
#ifndef WG_N
#define WG_N 256  // the main wgmma's N: xt's rows 0..255
#endif
#ifndef WG_NT
#define WG_NT 8  // the tail wgmma's N: xt's rows 256..263
#endif
#ifndef WG_ROWS
#define WG_ROWS 264  // xt's rows per stage: the widest layer input
#endif
#ifndef WG_BOX_ROWS
#define WG_BOX_ROWS 88  // xt's rows per TMA box (11 KiB: each box starts 1024-aligned)
#endif
#ifndef WG_THREADS
#define WG_THREADS 384  // the consumers and a whole producer warpgroup
#endif
#ifndef WG_STAGES
#define WG_STAGES 4  // shared-memory stages of the ring (variant)
#endif
#ifndef WT_SETS
#define WT_SETS 4  // wgrad_gemm_tx's operand sets per launch, at most
#endif
#ifndef WT_STAGES
#define WT_STAGES 3  // wgrad_gemm_tx's shared-memory stages
#endif
