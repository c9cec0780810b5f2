"""Parity of the kernel features the fused update relies on, against their NumPy twins.

Dueling forward with the biases added on read and outputs skipped, and with segments (several
forwards in one launch, each writing what it wants) and the direction Q written into the
augmented z; the dueling backward in two branch passes with ``dv`` accumulated; the C51 loss
reading whole [B, A, N] outputs at given actions (or forming the bootstrap distributions from the
target's heads) and writing the gradient over all actions; cuBLAS products into strided views, with
``beta``, with epilogues, and stacked (strided-batched over parameter trees in one allocation).
Fresh random inputs, outputs poisoned with NaN.

Tolerance: ``||out - ref|| / ||ref|| < 1e-5`` for the kernels (float32 against float64 of the same
inputs); 1e-6 for the fp32 GEMMs (TF32 off).
"""

from __future__ import annotations

import numpy as np
import pytest
from gpu_parity import assert_close, check_c51_indexed, check_three_segments, host64, nan_like, to_dev

from foxhunt_core.gpu import kernels as K
from foxhunt_core.gpu import reference as R
from foxhunt_core.gpu.launch import head_columns, padded
from foxhunt_core.net import layers as L

pytestmark = pytest.mark.gpu
TOL = 1e-5
LAYOUTS = [(51, (0, 3, 6, 9, 12)), (21, (0, 2, 5, 7)), (101, (0, 4, 6, 9, 12))]


@pytest.mark.parametrize("N,offsets", LAYOUTS)
def test_dueling_forward_with_biases_and_skipped_outputs(cp, rng, N, offsets):
    B, A = 211, offsets[-1]
    v = rng.normal(size=(B, N)).astype(np.float32)
    adv = rng.normal(size=(B, A, N)).astype(np.float32)
    vb = rng.normal(size=N).astype(np.float32)
    ab = rng.normal(size=(A, N)).astype(np.float32)
    z = np.linspace(-10.0, 10.0, N, dtype=np.float32)
    ref = R.dueling_softmax_forward(host64(v), host64(adv), host64(z), offsets, host64(vb), host64(ab))
    outs = dict(log_probs=nan_like(cp, (B, A, N)), probs=nan_like(cp, (B, A, N)),
                q=nan_like(cp, (B, A)), var=nan_like(cp, (B, A)))
    dv, dadv, dz, dvb, dab = (to_dev(cp, x) for x in (v, adv, z, vb, ab))
    got = K.dueling_softmax_forward(dv, dadv, dz, offsets, v_bias=dvb, adv_bias=dab, **outs)
    for name, g, r in zip(("log_probs", "probs", "q", "var"), got, ref):
        assert_close(name, g, r, TOL)
    # Only q and probs asked for: log_probs and var are neither returned nor written.
    outs = dict(log_probs=nan_like(cp, (B, A, N)), probs=nan_like(cp, (B, A, N)),
                q=nan_like(cp, (B, A)), var=nan_like(cp, (B, A)))
    lp, p, q, var = K.dueling_softmax_forward(dv, dadv, dz, offsets, v_bias=dvb, adv_bias=dab,
                                              want=("probs",), **outs)
    assert lp is None and var is None
    assert_close("probs", p, ref[1], TOL)
    assert_close("q", q, ref[2], TOL)
    assert np.isnan(host64(outs["log_probs"])).all() and np.isnan(host64(outs["var"])).all()


@pytest.mark.parametrize("N,offsets", LAYOUTS)
def test_dueling_backward_in_two_branch_passes(cp, rng, N, offsets):
    B, A = 173, offsets[-1]
    D = len(offsets) - 1
    z = np.linspace(-10.0, 10.0, N, dtype=np.float32)
    _, probs, q, _ = R.dueling_softmax_forward(rng.normal(size=(B, N)), rng.normal(size=(B, A, N)), z, offsets)
    probs, q = probs.astype(np.float32), q.astype(np.float32)
    dlogits = rng.normal(size=(B, A, N)).astype(np.float32)
    dq = np.zeros((B, A), np.float32)
    dq[:, : offsets[1]] = rng.normal(size=(B, offsets[1]))
    ddl, dzz = to_dev(cp, dlogits), to_dev(cp, z)
    dv, dadv = nan_like(cp, (B, N)), nan_like(cp, (B, A, N))
    K.dueling_backward(ddl, dzz, offsets, branches=(1, D), dv=dv, dadv=dadv)
    assert np.isnan(host64(dadv)[:, : offsets[1]]).all()  # the direction branch is not touched yet
    K.dueling_backward(ddl, dzz, offsets, branches=(0, 1), accumulate_dv=True, dq=to_dev(cp, dq),
                       probs=to_dev(cp, probs), q=to_dev(cp, q), dv=dv, dadv=dadv)
    rdv, rdadv = R.dueling_backward(host64(dlogits), offsets, host64(dq), host64(probs), host64(q), host64(z))
    assert_close("dv", dv, rdv, TOL)
    assert_close("dadv", dadv, rdadv, TOL)


@pytest.mark.parametrize("N,offsets", LAYOUTS)
def test_dueling_in_the_padded_layout(cp, rng, N, offsets):
    """The GPU network's layout: ``v`` [B, N rounded up to 4] and ``adv`` [B, W] with each
    branch's block padded to 4 floats. The forward must not read the padding (it holds NaN here);
    the backward must write zeros into the padding of ``dv`` and ``dadv``."""
    B, A = 149, offsets[-1]
    D = len(offsets) - 1
    Nv, W = padded(N), head_columns(offsets, N, 4)[-1]
    v = rng.normal(size=(B, N)).astype(np.float32)
    adv = rng.normal(size=(B, A, N)).astype(np.float32)
    z = np.linspace(-10.0, 10.0, N, dtype=np.float32)
    vb, ab = rng.normal(size=N).astype(np.float32), rng.normal(size=(A, N)).astype(np.float32)
    v_pad = np.full((B, Nv), np.nan, np.float32)
    v_pad[:, :N] = v
    adv_pad = R.columns_from_adv(adv, offsets)
    adv_pad[adv_pad == 0.0] = np.nan  # only the padding is exactly zero
    assert np.isnan(adv_pad).sum() == B * (W - A * N)
    ref = R.dueling_softmax_forward(host64(v), host64(adv), host64(z), offsets, host64(vb), host64(ab))
    outs = dict(log_probs=nan_like(cp, (B, A, N)), probs=nan_like(cp, (B, A, N)),
                q=nan_like(cp, (B, A)), var=nan_like(cp, (B, A)))
    got = K.dueling_softmax_forward(to_dev(cp, v_pad), to_dev(cp, adv_pad), to_dev(cp, z), offsets,
                                    v_bias=to_dev(cp, vb), adv_bias=to_dev(cp, ab), **outs)
    for name, g, r in zip(("log_probs", "probs", "q", "var"), got, ref):
        assert_close(name, g, r, TOL)

    _, probs, q, _ = ref
    dlogits = rng.normal(size=(B, A, N)).astype(np.float32)
    dq = np.zeros((B, A), np.float32)
    dq[:, : offsets[1]] = rng.normal(size=(B, offsets[1]))
    ddl, dzz = to_dev(cp, dlogits), to_dev(cp, z)
    dv, dadv = nan_like(cp, (B, Nv)), nan_like(cp, (B, W))
    K.dueling_backward(ddl, dzz, offsets, branches=(1, D), dv=dv, dadv=dadv, padded=True)
    K.dueling_backward(ddl, dzz, offsets, branches=(0, 1), accumulate_dv=True, dq=to_dev(cp, dq),
                       probs=to_dev(cp, probs.astype(np.float32)), q=to_dev(cp, q.astype(np.float32)),
                       dv=dv, dadv=dadv, padded=True)
    rdv, rdadv = R.dueling_backward(host64(dlogits), offsets, host64(dq), probs, q, host64(z))
    rdv_pad = np.zeros((B, Nv))
    rdv_pad[:, :N] = rdv
    assert_close("dv", dv, rdv_pad, TOL)
    assert_close("dadv", dadv, R.columns_from_adv(rdadv, offsets), TOL)
    assert not host64(dv)[:, N:].any()
    pad = R.columns_from_adv(np.ones((1, A, N)), offsets)[0] == 0.0  # the padding columns
    assert pad.sum() == W - A * N and not host64(dadv)[:, pad].any()


@pytest.mark.parametrize("N,offsets", [(51, (0, 3, 6, 9, 12)), (21, (0, 2, 5, 7))])
def test_c51_loss_reads_whole_outputs_and_writes_the_full_gradient(cp, rng, N, offsets):
    B, A = 199, offsets[-1]
    D = len(offsets) - 1
    sizes = np.diff(offsets)
    z = np.linspace(-10.0, 10.0, N, dtype=np.float32)
    tgt = L.softmax(rng.normal(0, 1.5, (B, A, N))).astype(np.float32)
    logp = L.log_softmax(rng.normal(0, 1.5, (B, A, N))).astype(np.float32)
    reward = rng.uniform(-12, 12, B).astype(np.float32)
    discount = (0.99 * (rng.random(B) > 0.2)).astype(np.float32)
    a_next = (rng.integers(0, 99, (B, D)) % sizes + np.asarray(offsets[:-1])).astype(np.int64)
    a_taken = (rng.integers(0, 99, (B, D)) % sizes + np.asarray(offsets[:-1])).astype(np.int64)
    outs = dict(m=nan_like(cp, (B, D, N)), dlogits=nan_like(cp, (B, A, N)),
                loss=nan_like(cp, (B, D)), entropy=nan_like(cp, (B, D)))
    got = K.c51_target_loss(to_dev(cp, tgt), to_dev(cp, reward), to_dev(cp, discount), to_dev(cp, logp),
                            to_dev(cp, z), 0.01, next_action=cp.asarray(a_next), action=cp.asarray(a_taken),
                            offsets=offsets, dlogits_full=True, **outs)
    rm = check_c51_indexed(got, tgt, logp, reward, discount, z, a_next, a_taken, A, TOL)
    # The update's form: E[m] (the auxiliary loss's target) instead of m itself.
    m_mean = nan_like(cp, (B, D))
    again = K.c51_target_loss(to_dev(cp, tgt), to_dev(cp, reward), to_dev(cp, discount), to_dev(cp, logp),
                              to_dev(cp, z), 0.01, next_action=cp.asarray(a_next), action=cp.asarray(a_taken),
                              offsets=offsets, dlogits_full=True, write_m=False, m_mean=m_mean)
    assert again[0] is None
    assert_close("E[m]", m_mean, (rm * host64(z)).sum(-1), TOL)
    assert_close("dlogits (no m)", again[1], host64(got[1]), TOL)


@pytest.mark.parametrize("N,offsets", LAYOUTS)
def test_c51_loss_from_the_target_heads(cp, rng, N, offsets):
    """The update's form: the loss kernel forms each bootstrap action's target distribution from
    the target network's value head and advantage row (padded layout, NaN in the padding, row
    pitches of wider arrays), as the dueling forward would; against NumPy on the gathered rows.
    B is not a multiple of the rows a block takes, so the grid stride ends anywhere."""
    B, A = 2003, offsets[-1]
    D = len(offsets) - 1
    sizes = np.diff(offsets)
    Nv, W = padded(N), head_columns(offsets, N, 4)[-1]
    z = np.linspace(-10.0, 10.0, N, dtype=np.float32)
    v = rng.normal(0, 1.5, (B, N)).astype(np.float32)
    adv = rng.normal(0, 1.5, (B, A, N)).astype(np.float32)
    v_pad = np.full((B, Nv + 8), np.nan, np.float32)
    v_pad[:, 4 : 4 + N] = v
    adv_pad = R.columns_from_adv(adv, offsets)
    adv_pad[adv_pad == 0.0] = np.nan  # only the padding is exactly zero
    adv_wide = np.full((B, W + 12), np.nan, np.float32)
    adv_wide[:, 12:] = adv_pad
    tgt = R.dueling_softmax_forward(host64(v), host64(adv), host64(z), offsets)[1]
    logp = L.log_softmax(rng.normal(0, 1.5, (B, A, N))).astype(np.float32)
    reward = rng.uniform(-12, 12, B).astype(np.float32)
    discount = (0.99 * (rng.random(B) > 0.2)).astype(np.float32)
    a_next = (rng.integers(0, 99, (B, D)) % sizes + np.asarray(offsets[:-1])).astype(np.int64)
    a_taken = (rng.integers(0, 99, (B, D)) % sizes + np.asarray(offsets[:-1])).astype(np.int64)
    dv, dadv = to_dev(cp, v_pad), to_dev(cp, adv_wide)
    m_mean = nan_like(cp, (B, D))
    outs = dict(m=nan_like(cp, (B, D, N)), dlogits=nan_like(cp, (B, A, N)),
                loss=nan_like(cp, (B, D)), entropy=nan_like(cp, (B, D)))
    got = K.c51_target_loss(None, to_dev(cp, reward), to_dev(cp, discount), to_dev(cp, logp), to_dev(cp, z), 0.01,
                            next_heads=(dv[:, 4 : 4 + Nv], dadv[:, 12:]), next_action=cp.asarray(a_next),
                            action=cp.asarray(a_taken), offsets=offsets, dlogits_full=True, m_mean=m_mean, **outs)
    rm = check_c51_indexed(got, tgt, logp, reward, discount, z, a_next, a_taken, A, TOL)
    assert_close("E[m]", m_mean, (rm * host64(z)).sum(-1), TOL)
    with pytest.raises(ValueError, match="next_heads replaces p_next"):
        K.c51_target_loss(to_dev(cp, logp), to_dev(cp, reward), to_dev(cp, discount), to_dev(cp, logp),
                          to_dev(cp, z), 0.01, next_heads=(dv[:, 4 : 4 + Nv], dadv[:, 12:]),
                          next_action=cp.asarray(a_next), offsets=offsets)


@pytest.mark.parametrize("N,offsets", LAYOUTS)
def test_dueling_forward_in_segments(cp, rng, N, offsets):
    """Three forwards in one launch (the update's online s, online s', target s'), each writing
    only its outputs, in the padded layout; the direction branch's Q scaled into a column block of
    a wider array (the augmented z)."""
    S, A = 67, offsets[-1]
    B, D = 3 * S, len(offsets) - 1
    Nv = padded(N)
    v = rng.normal(size=(B, N)).astype(np.float32)
    adv = rng.normal(size=(B, A, N)).astype(np.float32)
    z = np.linspace(-10.0, 10.0, N, dtype=np.float32)
    v_pad = np.zeros((B, Nv), np.float32)
    v_pad[:, :N] = v
    ref = R.dueling_softmax_forward(host64(v), host64(adv), host64(z), offsets)
    wants = [("log_probs", "probs", "q", "var"), ("q",), ("probs",)]
    outs = dict(log_probs=nan_like(cp, (S, A, N)), probs=nan_like(cp, (B, A, N)), q=nan_like(cp, (B, A)),
                var=nan_like(cp, (S, A)))
    zwide = nan_like(cp, (B, 12))
    vwide = nan_like(cp, (B, Nv + 20))  # v as a column block of a wider array (the network's head)
    vwide[:, 8 : 8 + Nv] = to_dev(cp, v_pad)
    dv, dadv, dz = vwide[:, 8 : 8 + Nv], to_dev(cp, R.columns_from_adv(adv, offsets)), to_dev(cp, z)
    K.dueling_softmax_forward(dv, dadv, dz, offsets, branches=(0, 1), segments=wants, zq=zwide[:, 5 : 5 + offsets[1]],
                              zq_scale=0.25, **outs)
    K.dueling_softmax_forward(dv, dadv, dz, offsets, branches=(1, D), segments=wants, **outs)
    check_three_segments(outs, zwide, ref, S, offsets[1], TOL)
    with pytest.raises(ValueError, match="do not split"):
        K.dueling_softmax_forward(dv[:-1], dadv[:-1], dz, offsets, segments=wants)


def _fp32():
    from foxhunt_core.gpu import cublas

    cublas.set_tf32(False)
    return cublas


def test_matmul_into_a_strided_view_with_beta(cp, rng):
    cublas = _fp32()
    a = rng.normal(size=(130, 40)).astype(np.float32)
    b = rng.normal(size=(40, 17)).astype(np.float32)
    base = rng.normal(size=(130, 60)).astype(np.float32)
    buf = to_dev(cp, base)
    cublas.matmul(to_dev(cp, a), to_dev(cp, b), out=buf[:, 11:28])
    ref = host64(base)
    ref[:, 11:28] = host64(a) @ host64(b)
    assert_close("beta=0 into view", buf, ref, 1e-6)
    cublas.matmul(to_dev(cp, a), to_dev(cp, b), out=buf[:, 11:28], beta=1.0)
    ref[:, 11:28] += host64(a) @ host64(b)
    assert_close("beta=1 into view", buf, ref, 1e-6)
    with pytest.raises(ValueError, match="cublas matmul: out has shape"):
        cublas.matmul(to_dev(cp, a), to_dev(cp, b), out=buf[:, :16])


def _operand(cp, x: np.ndarray, transposed: bool):
    """``x`` on the device, C-contiguous or as the transpose view of a contiguous array."""
    return to_dev(cp, x.T.copy()).T if transposed else to_dev(cp, x)


@pytest.mark.parametrize("lt", [True, False], ids=["cublaslt", "gemmex"])
@pytest.mark.parametrize("ta,tb", [(False, False), (True, False), (False, True)])
@pytest.mark.parametrize("N", [64, 17])
def test_matmul_epilogues(cp, rng, lt, ta, tb, N):
    """Bias and ReLU + bias epilogues (fused by cuBLASLt, or separate passes)."""
    cublas = _fp32()
    from foxhunt_core.gpu import cublaslt

    cublaslt.set_enabled(lt)
    try:
        M, Kd = 301, 40
        a, b = rng.normal(size=(M, Kd)), rng.normal(size=(Kd, N))
        bias = rng.normal(size=N)
        da, db = _operand(cp, a, ta), _operand(cp, b, tb)
        ref = host64(a.astype(np.float32)) @ host64(b.astype(np.float32))
        rb = host64(bias.astype(np.float32))
        assert_close("plain", cublas.matmul(da, db), ref, 1e-6)
        assert_close("bias", cublas.matmul(da, db, bias=to_dev(cp, bias)), ref + rb, 1e-6)
        assert_close("relu+bias", cublas.matmul(da, db, bias=to_dev(cp, bias), relu=True),
                     np.maximum(ref + rb, 0.0), 1e-6)
        assert_close("relu", cublas.matmul(da, db, relu=True), np.maximum(ref, 0.0), 1e-6)
        # into a column block of a wider buffer, with bias
        buf = nan_like(cp, (M, N + 9))
        cublas.matmul(da, db, out=buf[:, 5 : 5 + N], bias=to_dev(cp, bias))
        assert_close("bias into view", buf[:, 5 : 5 + N], ref + rb, 1e-6)
        # a weight gradient x.T @ dy into the rows of a taller slot (a GLU weight's z rows)
        x, dy = rng.normal(size=(M, Kd)), rng.normal(size=(M, N))
        gw = nan_like(cp, (Kd + 3, N))
        cublas.matmul(to_dev(cp, x).T, _operand(cp, dy, tb), out=gw[:Kd])
        x32, dy32 = host64(x.astype(np.float32)), host64(dy.astype(np.float32))
        assert_close("dW", gw[:Kd], x32.T @ dy32, 1e-6)
    finally:
        cublaslt.set_enabled(True)


def test_matmul_epilogues_under_tf32(cp, rng):
    """The configuration the trainer runs: TF32 tensor cores (relative error ~1e-3)."""
    from foxhunt_core.gpu import cublas

    cublas.set_tf32(True)
    try:
        M, Kd, N = 4099, 256, 153
        a, b, bias = rng.normal(size=(M, Kd)), rng.normal(size=(Kd, N)), rng.normal(size=N)
        got = cublas.matmul(to_dev(cp, a), to_dev(cp, b), bias=to_dev(cp, bias), relu=True)
        assert_close("relu+bias tf32", got, np.maximum(a @ b + bias, 0.0), 5e-3)
        dy = rng.normal(size=(M, N))
        gw = nan_like(cp, (Kd, N))
        cublas.matmul(to_dev(cp, a).T, to_dev(cp, dy), out=gw)
        assert_close("dW tf32", gw, a.T @ dy, 5e-3)
    finally:
        cublas.set_tf32(False)


@pytest.mark.parametrize("lt", [True, False], ids=["cublaslt", "gemmex"])
@pytest.mark.parametrize("epilogue", ["none", "bias", "relu+bias"])
def test_stacked_matmul_over_parameter_trees(cp, rng, lt, epilogue):
    """``stack=(3, stride)``: the rows of ``a`` in three parts, part i multiplied by the weights
    (and bias) ``i * stride`` elements after tree 0's, as the update's three forwards run; the
    output a column block of a wider buffer."""
    cublas = _fp32()
    from foxhunt_core.gpu import cublaslt
    from foxhunt_core.gpu.flat import FlatTree

    cublaslt.set_enabled(lt)
    try:
        M, Kd, N = 97, 40, 36
        trees = FlatTree.stacked(3, {"core": {"w": (Kd, N), "b": (N,)}}, xp=cp)
        ws = [rng.normal(size=(Kd, N)) for _ in range(3)]
        bs = [rng.normal(size=N) for _ in range(3)]
        for t, w, b in zip(trees, ws, bs):
            t.load({"core": {"w": w, "b": b}})
        a = rng.normal(size=(3 * M, Kd))
        out = nan_like(cp, (3 * M, N + 8))
        bias = trees[0].tree["core"]["b"] if epilogue != "none" else None
        cublas.matmul(to_dev(cp, a), trees[0].tree["core"]["w"], out=out[:, 4 : 4 + N], bias=bias,
                      relu=epilogue == "relu+bias", stack=(3, trees[0].size))
        a32 = host64(a.astype(np.float32))
        for i in range(3):
            ref = a32[i * M:(i + 1) * M] @ host64(ws[i].astype(np.float32))
            if epilogue != "none":
                ref = ref + host64(bs[i].astype(np.float32))
            if epilogue == "relu+bias":
                ref = np.maximum(ref, 0.0)
            assert_close(f"part {i}", out[i * M:(i + 1) * M, 4 : 4 + N], ref, 1e-6)
        assert np.isnan(host64(out)[:, :4]).all() and np.isnan(host64(out)[:, 4 + N :]).all()
        with pytest.raises(ValueError, match="rows of a divisible by 3"):
            cublas.matmul(to_dev(cp, a[:-1]), trees[0].tree["core"]["w"], stack=(3, trees[0].size))
    finally:
        cublaslt.set_enabled(True)


@pytest.mark.parametrize("lt", [True, False], ids=["cublaslt", "gemmex"])
def test_batched_matmul_over_column_blocks(cp, rng, lt):
    """``batch=(n, stride_a, stride_b, stride_out)``: the backward's advantage-layer input
    gradients of three branches at once — each branch's gradient columns times the transpose of
    its weight columns, into its block of a [B, branches x H] buffer."""
    cublas = _fp32()
    from foxhunt_core.gpu import cublaslt

    cublaslt.set_enabled(lt)
    try:
        B, H, w, n = 150, 24, 12, 3
        dadv = rng.normal(size=(B, (n + 1) * w))
        wout = rng.normal(size=(H + 4, (n + 1) * w))  # rows: H weights, then padding and the bias
        out = nan_like(cp, (B, (n + 1) * H))
        d_dadv, d_wout = to_dev(cp, dadv), to_dev(cp, wout)
        cublas.matmul(d_dadv[:, w : 2 * w], d_wout[:H, w : 2 * w].T, out=out[:, H : 2 * H], batch=(n, w, w, H))
        a32, w32 = host64(dadv.astype(np.float32)), host64(wout.astype(np.float32))
        for i in range(1, n + 1):
            ref = a32[:, i * w : (i + 1) * w] @ w32[:H, i * w : (i + 1) * w].T
            assert_close(f"branch {i}", out[:, i * H : (i + 1) * H], ref, 1e-6)
        assert np.isnan(host64(out)[:, :H]).all()
        with pytest.raises(ValueError, match="batch needs"):
            cublas.matmul(d_dadv[:, :w], d_wout[:H, :w].T, batch=(n, w, w, H))
    finally:
        cublaslt.set_enabled(True)


@pytest.mark.parametrize("N,offsets", LAYOUTS)
def test_dueling_backward_reads_dq_from_a_scaled_view(cp, rng, N, offsets):
    """The direction pass reads the direction Q's gradient straight from its columns of a wider
    array (the network's dz), times a scale (1 / q_scale)."""
    B, A = 97, offsets[-1]
    n0 = offsets[1]
    z = np.linspace(-10.0, 10.0, N, dtype=np.float32)
    _, probs, q, _ = R.dueling_softmax_forward(rng.normal(size=(B, N)), rng.normal(size=(B, A, N)), z, offsets)
    probs, q = probs.astype(np.float32), q.astype(np.float32)
    dlogits = rng.normal(size=(B, A, N)).astype(np.float32)
    cols = rng.normal(size=(B, n0)).astype(np.float32)
    wide = nan_like(cp, (B, n0 + 9))
    wide[:, 5 : 5 + n0] = to_dev(cp, cols)
    dvwide, dadv = nan_like(cp, (B, N + 7)), nan_like(cp, (B, A, N))
    dv = dvwide[:, 3 : 3 + N]  # dv into a column block of a wider array (the network's head)
    K.dueling_backward(to_dev(cp, dlogits), to_dev(cp, z), offsets, branches=(0, 1), dq=wide[:, 5 : 5 + n0],
                       dq_scale=0.25, probs=to_dev(cp, probs), q=to_dev(cp, q), dv=dv, dadv=dadv)
    assert np.isnan(host64(dvwide)[:, :3]).all() and np.isnan(host64(dvwide)[:, 3 + N :]).all()
    full = np.zeros((B, A))
    full[:, :n0] = 0.25 * host64(cols)
    only_dir = np.zeros_like(dlogits)
    only_dir[:, :n0] = dlogits[:, :n0]
    rdv, rdadv = R.dueling_backward(host64(only_dir), offsets, full, host64(probs), host64(q), host64(z))
    assert_close("dv", dv, rdv, TOL)
    assert_close("dadv (direction)", host64(dadv)[:, :n0], rdadv[:, :n0], TOL)
    with pytest.raises(ValueError, match="dq must be"):
        K.dueling_backward(to_dev(cp, dlogits), to_dev(cp, z), offsets, branches=(0, 2), dq=wide[:, 5 : 5 + n0],
                           probs=to_dev(cp, probs), q=to_dev(cp, q))


@pytest.mark.parametrize("offsets", [(0, 3, 6, 9, 12), (0, 2, 5, 7)])
def test_branch_argmax(cp, rng, offsets):
    """The greedy action of each branch: the first of ties (values drawn from a few levels, so
    ties are common) and a NaN winning, as numpy.argmax; within the branch or absolute."""
    from foxhunt_core.qpipe import branch_argmax

    B, A = 501, offsets[-1]
    values = rng.integers(0, 3, size=(B, A)).astype(np.float32)
    values[7, 1] = np.nan
    values[8, :] = np.nan
    ref = branch_argmax(values, offsets)
    got = K.branch_argmax(to_dev(cp, values), offsets, out=cp.full((B, len(offsets) - 1), -7, dtype=cp.int64))
    assert np.array_equal(got.get(), ref)
    absolute = K.branch_argmax(to_dev(cp, values), offsets, absolute=True)
    assert np.array_equal(absolute.get(), ref + np.asarray(offsets[:-1]))


@pytest.mark.parametrize("offsets", [(0, 3, 6, 9, 12), (0, 2, 5, 7)])
def test_aux_error(cp, rng, offsets):
    """The auxiliary loss's squared error at the taken actions and its gradient over all actions."""
    B, A = 311, offsets[-1]
    D = len(offsets) - 1
    sizes = np.diff(offsets)
    values = rng.normal(size=(B, A)).astype(np.float32)
    target = rng.normal(size=(B, D)).astype(np.float32)
    act = (rng.integers(0, 99, (B, D)) % sizes + np.asarray(offsets[:-1])).astype(np.int64)
    err2, dv = K.aux_error(to_dev(cp, values), cp.asarray(act), to_dev(cp, target), 0.3, offsets,
                           err2=nan_like(cp, (B, D)), dvalues=nan_like(cp, (B, A)))
    e = np.take_along_axis(host64(values), act, axis=1) - host64(target)
    ref = np.zeros((B, A))
    np.put_along_axis(ref, act, 0.3 * e, axis=1)
    assert_close("err2", err2, e * e, TOL)
    assert_close("dvalues", dv, ref, TOL)
    assert (host64(dv)[ref == 0.0] == 0.0).all()
