"""The update's own (non-GEMM) kernels at the update's shapes, each timed alone.

    python benchmarks/bench_kernels.py [--batches 16384 65536] [--repeats 30] [--only NAME] [--glu-cluster C]
        [--glu-ring S [B [H]]] [--glu-pv-registers] [--linear-cluster C] [--linear-stages S] [--wgrad-stages S]

For each batch size B of the stage-0 network (12 actions in 4 branches of 3, 51 atoms), the
median µs per call, replayed from a captured CUDA graph (benchmarks/bench_stack.py's
``graph_us``), of:

- the dueling forward as the update runs it: the direction branch and then the other three over
  the online s rows (every output), the online s' rows (E[Q] only) and the target s' rows
  (probabilities only), as one launch each over the 3 B rows (``segments``);
- the C51 projection and loss over B rows and 4 branches, reading whole [B, 12, 51] outputs at
  the chosen actions and writing the gradient over all actions;
- the cross-branch attention forward and backward over B rows;
- the GLU layers over the 2 B rows of the online forwards (the direction branch's: K = 256 with
  the bias in the epilogue; the other three branches' at once: K = 260, the bias in the ones
  column), as cuBLASLt's GEMM (autotuned) followed by ``glu_forward``, and as ``glu_gemm``
  (one launch, the gate in the GEMM's epilogue; what the update runs), writing h alone or h and
  the first B rows' pv, with the transposed weights it reads made in the call or before, and
  with u's first 256 columns rounded to TF32 in the kernel or taken as their writer rounded them
  (``rounded``: the network's z, as ``vsn_forward`` writes it);
- the four advantage heads over the 2 B rows ([2 B, 256] x [256, 156] each, the bias in the
  epilogue, h as ``glu_gemm`` writes it: rounded to TF32), as four cuBLASLt GEMMs (autotuned) and
  as one ``linear_gemm``;
- the weight gradients of the GLU blocks over the B rows of s (the joint branches' [260, B] x
  [B, 1536] and the direction branch's with the value head, [260, B] x [B, 576]), as cuBLASLt's
  GEMM (autotuned) over z's transpose view, and as ``wgrad_gemm`` (with z transposed and rounded
  in the call, as the update runs it, and given); the heads' weight gradients (4 x [260, B] x
  [B, 156]) as cuBLASLt's GEMMs (in both orientations) and as ``wgrad_gemm_sets``;
- the GLUs' backward from their heads' gradients over the B rows of s (dh = dadv Wo^T, then the
  gate's backward over pv, in place), as cuBLASLt's GEMM and ``glu_backward``, and as one
  ``glu_backward_gemm``; the joint branches' with the direction-Q gradient (dq = dpv_mag Wq^T,
  [B, 512] x [512, 3]) as a separate cuBLASLt product or in ``glu_backward_gemm``'s epilogue;
- the trunk's input gradients over the B rows of s (dh2 = (dh2' + dmpre Wv^T) * (h2 > 0), then
  dh1 = (dh2 W2^T) * (h1 > 0)), as cuBLASLt's GEMM and ``relu_backward``, and as one
  ``linear_gemm_relu_backward`` each (the ReLU's backward in the GEMM's epilogue).

The inputs are random and fixed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from bench_stack import graph_us  # noqa: E402

OFFSETS = (0, 3, 6, 9, 12)
N, A, D = 51, 12, 4


def configured(cfg: Any) -> Any:
    """The kernel wrappers with the tensor-core kernels built as ``cfg`` says (its ``glu``,
    ``linear``, ``wgrad`` configs: the command line's --glu-*, --linear-*, --wgrad-* options)."""
    import functools
    import types

    from foxhunt_core.gpu import kernels as K

    bound = {"glu_gemm": cfg.glu, "linear_gemm": cfg.linear, "heads_dueling": cfg.linear,
             "linear_gemm_relu_backward": cfg.linear, "wgrad_gemm": cfg.wgrad, "wgrad_gemm_sets": cfg.wgrad}
    wrappers = {name: getattr(K, name) for name in K.__all__}
    wrappers.update({name: functools.partial(getattr(K, name), config=c) for name, c in bound.items()})
    return types.SimpleNamespace(**wrappers)


def dueling_cases(B: int, cfg: Any) -> dict:
    import cupy as cp

    K = configured(cfg)
    from foxhunt_core.gpu.launch import head_columns, padded

    R = 3 * B
    W = head_columns(OFFSETS, N, 4)[-1]
    v = cp.random.standard_normal((R, padded(N)), dtype=cp.float32)
    adv = cp.random.standard_normal((R, W), dtype=cp.float32)
    z = cp.linspace(-10.0, 10.0, N, dtype=cp.float32)
    zwide = cp.zeros((R, 260), dtype=cp.float32)
    wants = [("log_probs", "probs", "q", "var"), ("q",), ("probs",)]
    outs = dict(log_probs=cp.empty((B, A, N), cp.float32), probs=cp.empty((R, A, N), cp.float32),
                q=cp.empty((R, A), cp.float32), var=cp.empty((B, A), cp.float32))

    def run() -> None:
        K.dueling_softmax_forward(v, adv, z, OFFSETS, branches=(0, 1), segments=wants, zq=zwide[:, 256:259],
                                  zq_scale=0.1, **outs)
        K.dueling_softmax_forward(v, adv, z, OFFSETS, branches=(1, D), segments=wants, **outs)

    return {"dueling fwd (2 launches)": run}


def c51_case(B: int, cfg: Any) -> dict:
    import cupy as cp

    K = configured(cfg)

    rng = cp.random.default_rng(0)
    logits = rng.standard_normal((B, A, N), dtype=cp.float32)
    lp = logits - cp.log(cp.exp(logits).sum(-1, keepdims=True))
    p_next = cp.exp(lp[::-1].copy())
    base = cp.asarray(OFFSETS[:-1])
    act = rng.integers(0, 3, (B, D)) + base
    nxt = rng.integers(0, 3, (B, D)) + base
    reward = rng.standard_normal(B, dtype=cp.float32)
    disc = cp.full(B, 0.9, dtype=cp.float32)
    z = cp.linspace(-10.0, 10.0, N, dtype=cp.float32)
    dl = cp.empty((B, A, N), cp.float32)
    loss, ent, mm = (cp.empty((B, D), cp.float32) for _ in range(3))
    coeff = cp.full((1,), 1e-3, dtype=cp.float32)

    def run() -> None:
        K.c51_target_loss(p_next, reward, disc, lp, z, coeff, next_action=nxt, action=act, offsets=OFFSETS,
                          dlogits_full=True, dlogits=dl, loss=loss, entropy=ent, write_m=False, m_mean=mm)

    return {"c51 projection + loss": run}


def attention_cases(B: int, cfg: Any) -> dict:
    import cupy as cp

    from foxhunt_core.gpu import qkernels as Q

    k = 8
    q = cp.random.standard_normal((B, A), dtype=cp.float32)
    dqc = cp.random.standard_normal((B, A), dtype=cp.float32)
    emb = cp.random.standard_normal((A, k), dtype=cp.float32)
    wq = cp.random.standard_normal((k + 1, k), dtype=cp.float32) * 0.3
    wk = cp.random.standard_normal((k + 1, k), dtype=cp.float32) * 0.3
    gate = cp.random.standard_normal(A, dtype=cp.float32)
    qc = cp.empty((B, A), cp.float32)
    grads = dict(demb=cp.empty_like(emb), dwq=cp.empty_like(wq), dwk=cp.empty_like(wk), dgate=cp.empty_like(gate),
                 workspace=Q.attention_workspace(A, k))
    return {
        "attention fwd": lambda: Q.attention_forward(q, emb, wq, wk, gate, qc=qc),
        "attention bwd (+ its reductions)": lambda: Q.attention_backward(q, dqc, emb, wq, wk, gate, **grads),
    }


def glu_cases(B: int, cfg: Any) -> dict:
    import cupy as cp

    from foxhunt_core.gpu import cublas, cublaslt
    K = configured(cfg)

    cublas.set_tf32(True)
    cublaslt.set_autotune(True)
    R, H, Wz, Wh = 2 * B, 256, 260, 260
    rng = cp.random.default_rng(0)
    u = rng.standard_normal((R, Wz), dtype=cp.float32)
    # The first H columns TF32 values, as vsn_forward writes the network's z (``rounded`` cases).
    u[:, :H] = ((u[:, :H].view(cp.uint32) + cp.uint32(0x1000)) & cp.uint32(0xFFFFE000)).view(cp.float32)
    w = rng.standard_normal((Wz, 8 * H), dtype=cp.float32) * 0.05
    pv = cp.empty((R, 8 * H), cp.float32)
    h = cp.empty((R, 4 * Wh), cp.float32)
    wd, bd, wj = w[:H, : 2 * H], w[-1, : 2 * H], w[:, 2 * H :]
    wjt = K.transpose(wj)
    return {
        "GLU direction: GEMM + glu_forward": lambda: (
            cublas.matmul(u[:, :H], wd, out=pv[:, : 2 * H], bias=bd),
            K.glu_forward(pv[:, : 2 * H], width=Wh, h=h[:, :Wh])),
        "GLU direction: glu_gemm (h)": lambda: K.glu_gemm(u[:, :H], wd, bias=bd, width=Wh, h=h[:, :Wh]),
        "GLU direction: glu_gemm (h, pv of B rows)": lambda: K.glu_gemm(
            u[:, :H], wd, bias=bd, width=Wh, h=h[:, :Wh], pv=pv[:B, : 2 * H]),
        "GLU direction: glu_gemm (h, u rounded by its writer)": lambda: K.glu_gemm(
            u[:, :H], wd, bias=bd, width=Wh, h=h[:, :Wh], rounded=H),
        "GLU direction: glu_gemm (h, pv of B rows, u rounded by its writer)": lambda: K.glu_gemm(
            u[:, :H], wd, bias=bd, width=Wh, h=h[:, :Wh], pv=pv[:B, : 2 * H], rounded=H),
        "GLU 3 branches: GEMM + glu_forward": lambda: (
            cublas.matmul(u, wj, out=pv[:, 2 * H :]),
            K.glu_forward(pv[:, 2 * H :], width=Wh, blocks=3, h=h[:, Wh:])),
        "GLU 3 branches: glu_gemm (h)": lambda: K.glu_gemm(u, wj, width=Wh, blocks=3, h=h[:, Wh:]),
        "GLU 3 branches: glu_gemm (h, weights transposed before)": lambda: K.glu_gemm(
            u, wj, width=Wh, blocks=3, h=h[:, Wh:], wt=wjt),
        "GLU 3 branches: glu_gemm (h, pv of B rows)": lambda: K.glu_gemm(
            u, wj, width=Wh, blocks=3, h=h[:, Wh:], pv=pv[:B, 2 * H :]),
        "GLU 3 branches: glu_gemm (h, u's first 256 columns rounded by its writer)": lambda: K.glu_gemm(
            u, wj, width=Wh, blocks=3, h=h[:, Wh:], rounded=H),
        "GLU 3 branches: glu_gemm (h, pv of B rows, u's first 256 columns rounded by its writer)": lambda: K.glu_gemm(
            u, wj, width=Wh, blocks=3, h=h[:, Wh:], pv=pv[:B, 2 * H :], rounded=H),
    }


def heads_cases(B: int, cfg: Any) -> dict:
    import cupy as cp

    from foxhunt_core.gpu import cublas, cublaslt
    K = configured(cfg)

    cublas.set_tf32(True)
    cublaslt.set_autotune(True)
    R, H, Wh, N = 2 * B, 256, 260, 156
    rng = cp.random.default_rng(1)
    h = rng.standard_normal((R, 4 * Wh), dtype=cp.float32)
    h = ((h.view(cp.uint32) + cp.uint32(0x1000)) & cp.uint32(0xFFFFE000)).view(cp.float32)  # as glu_gemm writes it
    w = rng.standard_normal((Wh, 4 * N), dtype=cp.float32) * 0.05
    adv = cp.empty((R, 4 * N), cp.float32)
    wt = K.transpose(w[:H])
    ins = [h[:, Wh * i : Wh * i + H] for i in range(4)]
    outs = [adv[:, N * i : N * (i + 1)] for i in range(4)]
    return {
        "heads (4 x K = 256, N = 156): cuBLASLt GEMMs, bias in the epilogue": lambda: [
            cublas.matmul(ins[i], w[:H, N * i : N * (i + 1)], out=outs[i], bias=w[-1, N * i : N * (i + 1)])
            for i in range(4)],
        "heads (4 x K = 256, N = 156): linear_gemm": lambda: K.linear_gemm(
            ins, [wt[N * i : N * (i + 1)] for i in range(4)], outs, bias=[w[-1, N * i : N * (i + 1)] for i in range(4)],
            rounded=H),
        **heads_dueling_cases(B, ins, wt, w, adv, cfg),
    }


def heads_dueling_cases(B: int, ins: list, wt: Any, w: Any, adv: Any, cfg: Any) -> dict:
    """The update's online forwards' heads (2 B rows: s with every output, s' with E[Q]) and their
    dueling forward: linear_gemm then dueling_softmax_forward (the heads' round trip through
    memory) against heads_dueling (the dueling forward in the GEMM's epilogue)."""
    import cupy as cp

    K = configured(cfg)
    from foxhunt_core.gpu.launch import padded

    R, H, Nh = 2 * B, 256, 156
    v = cp.random.standard_normal((R, padded(N)), dtype=cp.float32)
    outs = [adv[:, Nh * i : Nh * (i + 1)] for i in range(4)]
    z = cp.linspace(-10.0, 10.0, N, dtype=cp.float32)
    zwide = cp.zeros((R, 260), dtype=cp.float32)
    wants = [("log_probs", "probs", "q", "var"), ("q",)]
    res = dict(log_probs=cp.empty((B, A, N), cp.float32), probs=cp.empty((B, A, N), cp.float32),
               q=cp.empty((R, A), cp.float32), var=cp.empty((B, A), cp.float32))
    wts = [wt[Nh * i : Nh * (i + 1)] for i in range(4)]
    bias = [w[-1, Nh * i : Nh * (i + 1)] for i in range(4)]

    def apart() -> None:
        K.linear_gemm(ins[:1], wts[:1], outs[:1], bias=bias[:1], rounded=H)
        K.dueling_softmax_forward(v, adv, z, OFFSETS, branches=(0, 1), segments=wants, zq=zwide[:, 256:259],
                                  zq_scale=0.1, **res)
        K.linear_gemm(ins[1:], wts[1:], outs[1:], bias=bias[1:], rounded=H)
        K.dueling_softmax_forward(v, adv, z, OFFSETS, branches=(1, D), segments=wants, **res)

    def fused() -> None:
        K.heads_dueling(ins[:1], wts[:1], v, z, OFFSETS, branches=(0, 1), segments=wants, seg_rows=B,
                        bias=bias[:1], zq=zwide[:, 256:259], zq_scale=0.1, rounded=H, **res)
        K.heads_dueling(ins[1:], wts[1:], v, z, OFFSETS, branches=(1, D), segments=wants, seg_rows=B,
                        bias=bias[1:], rounded=H, **res)

    def straight() -> None:  # the distributions straight from the lanes to memory, not through the staging buffer
        K.heads_dueling(ins[:1], wts[:1], v, z, OFFSETS, branches=(0, 1), segments=wants, seg_rows=B,
                        bias=bias[:1], zq=zwide[:, 256:259], zq_scale=0.1, rounded=H, straight=True, **res)
        K.heads_dueling(ins[1:], wts[1:], v, z, OFFSETS, branches=(1, D), segments=wants, seg_rows=B,
                        bias=bias[1:], rounded=H, straight=True, **res)

    def fused_as(segments: list, seg_rows: int) -> Any:  # heads_dueling over other segments (where the time goes)
        r1 = len(segments) * seg_rows
        wanted = {o for w in segments for o in w}
        out = {k: (x[:r1] if x is not None and (k == "q" or k in wanted) else None) for k, x in res.items()}
        return lambda: [K.heads_dueling(ins[a:b], wts[a:b], v, z, OFFSETS, branches=(a, b), segments=segments,
                                        seg_rows=seg_rows, bias=bias[a:b], rounded=H,
                                        zq=zwide[:r1, 256:259] if a == 0 else None, zq_scale=0.1, **out)
                        for a, b in ((0, 1), (1, D))]

    return {"heads + dueling fwd (s: all, s': E[Q]): linear_gemm, then dueling_softmax_forward": apart,
            "heads + dueling fwd (s: all, s': E[Q]): heads_dueling": fused,
            "heads + dueling fwd (s: all, s': E[Q]): heads_dueling, distributions straight out": straight,
            "heads + dueling fwd (s, s': E[Q] only): heads_dueling": fused_as([("q",), ("q",)], B),
            "heads + dueling fwd (one row: the GEMM alone, nothing written): heads_dueling": fused_as([("q",)], 1)}


def glu_backward_cases(B: int, cfg: Any) -> dict:
    import cupy as cp

    from foxhunt_core.gpu import cublas, cublaslt
    K = configured(cfg)

    cublas.set_tf32(True)
    cublaslt.set_autotune(True)
    H, W = 256, 156
    rng = cp.random.default_rng(3)
    dadv = rng.standard_normal((B, 4 * W), dtype=cp.float32)
    wo = rng.standard_normal((H, 4 * W), dtype=cp.float32) * 0.05
    wo_r = K.round_tf32(wo)
    pv = rng.standard_normal((B, 8 * H), dtype=cp.float32)
    dh = cp.empty((B, 4 * H), cp.float32)
    wq = rng.standard_normal((3, 2 * H), dtype=cp.float32) * 0.05  # the direction-Q rows over branch 1's columns
    dq = cp.empty((B, 4), cp.float32)
    return {
        "GLU backward 3 branches: cuBLASLt dh GEMM (strided batch) + glu_backward": lambda: (
            cublas.matmul(dadv[:, W : 2 * W], wo[:, W : 2 * W].T, out=dh[:, H : 2 * H], batch=(3, W, W, H)),
            K.glu_backward(dh[:, H:], pv[:, 2 * H :], blocks=3, dpv=pv[:, 2 * H :])),
        "GLU backward 3 branches: glu_backward_gemm": lambda: K.glu_backward_gemm(
            [dadv[:, W * i : W * (i + 1)] for i in (1, 2, 3)], [wo_r[:, W * i : W * (i + 1)] for i in (1, 2, 3)],
            pv[:, 2 * H :]),
        "GLU backward 3 branches + dq: glu_backward_gemm, then the dq product (cuBLASLt)": lambda: (
            K.glu_backward_gemm([dadv[:, W * i : W * (i + 1)] for i in (1, 2, 3)],
                                [wo_r[:, W * i : W * (i + 1)] for i in (1, 2, 3)], pv[:, 2 * H :]),
            cublas.matmul(pv[:, 2 * H : 4 * H], wq.T, out=dq[:, :3])),
        "GLU backward 3 branches + dq: glu_backward_gemm with dq in its epilogue": lambda: K.glu_backward_gemm(
            [dadv[:, W * i : W * (i + 1)] for i in (1, 2, 3)], [wo_r[:, W * i : W * (i + 1)] for i in (1, 2, 3)],
            pv[:, 2 * H :], dq=dq[:, :3], wq=wq, dq_set=0),
        "GLU backward direction: cuBLASLt dh GEMM + glu_backward": lambda: (
            cublas.matmul(dadv[:, :W], wo[:, :W].T, out=dh[:, :H]),
            K.glu_backward(dh[:, :H], pv[:, : 2 * H], blocks=1, dpv=pv[:, : 2 * H])),
        "GLU backward direction: glu_backward_gemm": lambda: K.glu_backward_gemm([dadv[:, :W]], [wo_r[:, :W]],
                                                                                 pv[:, : 2 * H]),
    }


def wgrad_cases(B: int, cfg: Any) -> dict:
    import cupy as cp

    from foxhunt_core.gpu import cublas, cublaslt
    K = configured(cfg)

    cublas.set_tf32(True)
    cublaslt.set_autotune(True)
    Wz, lead, H = 260, 64, 256
    rng = cp.random.default_rng(2)
    z = rng.standard_normal((B, Wz), dtype=cp.float32)
    dpv = rng.standard_normal((B, lead + 8 * H), dtype=cp.float32)  # [dv | d pre-activations of 4 GLUs]
    g = cp.empty((Wz, lead + 8 * H), cp.float32)
    zt = K.transpose(z)
    cases = {}
    for label, c0, c1 in (("joint (M = 1536)", lead + 2 * H, lead + 8 * H), ("direction + value (M = 576)", 0,
                                                                              lead + 2 * H)):
        cases[f"GLU weight gradient {label}: cuBLASLt GEMM"] = (
            lambda c0=c0, c1=c1: cublas.matmul(z.T, dpv[:, c0:c1], out=g[:, c0:c1]))
        cases[f"GLU weight gradient {label}: transpose + wgrad_gemm"] = (
            lambda c0=c0, c1=c1: K.wgrad_gemm(K.transpose(z), dpv[:, c0:c1], out=g[:, c0:c1]))
        cases[f"GLU weight gradient {label}: wgrad_gemm (z transposed before)"] = (
            lambda c0=c0, c1=c1: K.wgrad_gemm(zt, dpv[:, c0:c1], out=g[:, c0:c1]))
    cases["z transposed and rounded (transpose)"] = lambda: K.transpose(z)
    # The advantage heads' weight gradients ([260, B] x [B, 156] per branch), as the update runs them
    # and in the other orientation ([156, B] x [B, 260]: the gradient's transpose).
    h = rng.standard_normal((B, 4 * Wz), dtype=cp.float32)
    dadv = rng.standard_normal((B, 4 * 156), dtype=cp.float32)
    gh = cp.empty((Wz, 4 * 156), cp.float32)
    ght = cp.empty((4 * 156, Wz), cp.float32)
    hs = [h[:, Wz * i : Wz * (i + 1)] for i in range(4)]
    ds = [dadv[:, 156 * i : 156 * (i + 1)] for i in range(4)]
    cases["heads weight gradients (4 x [260, B] x [B, 156]): cuBLASLt GEMMs"] = lambda: [
        cublas.matmul(hs[i].T, ds[i], out=gh[:, 156 * i : 156 * (i + 1)]) for i in range(4)]
    cases["heads weight gradients transposed (4 x [156, B] x [B, 260]): cuBLASLt GEMMs"] = lambda: [
        cublas.matmul(ds[i].T, hs[i], out=ght[156 * i : 156 * (i + 1)]) for i in range(4)]
    cases["heads weight gradients (4 x [260, B] x [B, 156]): wgrad_gemm_sets (3 + 1, as the update)"] = lambda: (
        K.wgrad_gemm_sets(hs[1:], ds[1:], [gh[:, 156 * i : 156 * (i + 1)] for i in (1, 2, 3)]),
        K.wgrad_gemm_sets(hs[:1], ds[:1], [gh[:, :156]]))
    return cases


def trunk_backward_cases(B: int, cfg: Any) -> dict:
    import cupy as cp

    from foxhunt_core.gpu import cublas, cublaslt
    K = configured(cfg)

    cublas.set_tf32(True)
    cublaslt.set_autotune(True)
    H = 256
    rng = cp.random.default_rng(4)
    dmpre, dh2_mask, dh2, h1, h2 = (rng.standard_normal((B, H), dtype=cp.float32) for _ in range(5))
    wv, w2 = (rng.standard_normal((H, H), dtype=cp.float32) * 0.06 for _ in range(2))
    out = cp.empty((B, H), cp.float32)
    dmpre_r = K.round_tf32(dmpre)  # (vsn_backward writes it so for linear_gemm_relu_backward)
    return {
        "trunk backward dh2 (VSN): cuBLASLt dgrad GEMM + relu_backward": lambda: K.relu_backward(
            dh2_mask, h2, addend=cublas.matmul(dmpre, wv.T), out=out),
        "trunk backward dh2 (VSN): linear_gemm_relu_backward (weights rounded in the call)": lambda: (
            K.linear_gemm_relu_backward(dmpre_r, K.round_tf32(wv), h2, addend=dh2_mask, out=out, rounded=H,
                                        tf32_out=True)),
        "trunk backward dh1 (trunk.w2): cuBLASLt dgrad GEMM + relu_backward": lambda: K.relu_backward(
            cublas.matmul(dh2, w2.T), h1, out=out),
        "trunk backward dh1 (trunk.w2): linear_gemm_relu_backward (weights rounded in the call)": lambda: (
            K.linear_gemm_relu_backward(dh2, K.round_tf32(w2), h1, out=out, rounded=H)),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batches", type=int, nargs="+", default=[16384, 65536])
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--only", default="", help="run only the kernels whose name contains this")
    ap.add_argument("--glu-cluster", type=int, choices=(1, 2, 4), default=None,
                    help="glu_gemm's cluster size (CTAs sharing their weight loads; default: the kernel's)")
    ap.add_argument("--glu-ring", type=int, nargs="+", default=None, metavar="N",
                    help="glu_gemm's ring and staging: stages [staged boxes [boxes per hand-off]] "
                         "(kernels.GluGemmConfig.ring; 3 alone: the whole tile's h staged at once; default: the "
                         "table's)")
    ap.add_argument("--glu-pv-registers", action="store_true",
                    help="glu_gemm stores pv from the registers rather than by TMA (GluGemmConfig's pv_tma off)")
    ap.add_argument("--linear-cluster", type=int, choices=(1, 2, 4), default=None,
                    help="linear_gemm's cluster size (default: the kernel's)")
    ap.add_argument("--linear-stages", type=int, choices=(3, 4, 5), default=None,
                    help="linear_gemm's shared-memory stages (5 fits 128-column tiles only: --only trunk; default: the "
                         "kernel's)")
    ap.add_argument("--wgrad-stages", type=int, choices=(3, 4), default=None,
                    help="wgrad_gemm's shared-memory stages (default: the kernel's)")
    args = ap.parse_args()
    import types

    import cupy as cp

    from foxhunt_core.gpu import kernels as KM

    glu = dict(pv_tma=not args.glu_pv_registers)
    if args.glu_cluster is not None:
        glu["cluster"] = args.glu_cluster
    linear = {k: v for k, v in (("cluster", args.linear_cluster), ("stages", args.linear_stages)) if v is not None}
    cfg = types.SimpleNamespace(
        glu=KM.GluGemmConfig.ring(*args.glu_ring, **glu) if args.glu_ring else KM.GluGemmConfig(**glu),
        linear=KM.LinearGemmConfig(**linear),
        wgrad=KM.WgradGemmConfig(**({"stages": args.wgrad_stages} if args.wgrad_stages else {})))

    print(f"GPU: {cp.cuda.runtime.getDeviceProperties(0)['name'].decode()}; µs per call (median of {args.repeats})")
    print("| B | kernel | µs |")
    print("|---|---|---|")
    for B in args.batches:
        cases = {**dueling_cases(B, cfg), **c51_case(B, cfg), **attention_cases(B, cfg), **glu_cases(B, cfg),
                 **heads_cases(B, cfg), **glu_backward_cases(B, cfg), **wgrad_cases(B, cfg),
                 **trunk_backward_cases(B, cfg)}
        for name, fn in cases.items():
            if args.only not in name:
                continue
            print(f"| {B} | {name} | {graph_us(fn, args.repeats):.1f} |", flush=True)


if __name__ == "__main__":
    main()
