"""Parity of linear_gemm.cu's dueling variant (``heads_dueling``: the advantage heads as one TF32
tensor-core GEMM with the dueling forward of dueling_row.cuh on warps beside it) with the NumPy twins
``reference.linear_gemm`` and ``reference.dueling_softmax_forward``.

The GLU outputs and weights are TF32 values (the products are exact), so the heads carry float32
accumulation's error only and the dueling forward its fast exponentials':
``||out - ref|| / ||ref|| < 2e-5``. Every output starts NaN-poisoned, and what must not be written
(a segment's unwanted outputs, the columns around the direction Q, the rows past the segments, the
advantage row's neighbours) must stay NaN.
"""

from __future__ import annotations

import numpy as np
import pytest
from gpu_parity import assert_close, check_three_segments, host64, nan_like, skip_without_wgmma, to_dev
from gpu_parity import tf32_truncated as tf32

from foxhunt_core.gpu import kernels as K
from foxhunt_core.gpu import reference as R
from foxhunt_core.gpu.launch import HEAD_ALIGN, head_columns, padded

pytestmark = pytest.mark.gpu
TOL = 2e-5
H = 256  # the GLU width (K of the heads)
ALL = ("log_probs", "probs", "q", "var")
WANTS = [ALL, ("q",), ("probs",)]  # the update's three segments (online s, online s', target s')
# (atoms, branch offsets) with every branch's block of the advantage row of one width, at most the
# tile's 160 columns; a row's eight lanes hold 7 atoms each of the default (156 columns), 3 of 21
# atoms (44), 8 of 64 (128; no padding atom), 13 of 101 with single-action branches (104), 5 of 33
# with branches of four (132; one atom in the last slot), 2 of 11 with branches of twelve (132; 24
# values per lane, the most the dueling warps take).
LAYOUTS = [(51, (0, 3, 6, 9, 12)), (21, (0, 2, 4, 6)), (64, (0, 2, 4)), (101, (0, 1, 2, 3)), (33, (0, 4, 8)),
           (11, (0, 12, 24))]


@pytest.fixture(autouse=True)
def _hopper(cp):
    skip_without_wgmma()


class Heads:
    """A network's heads over M rows: each branch's GLU output as a column block of one wide array
    (H + 4 apart, as glu_gemm writes h), its weights and bias, the value head as a column block of
    a wider NaN-poisoned array, the support; the NumPy forward over them (float64). The weights
    come from ``weights_seed`` alone: the same for every ``rng``."""

    def __init__(self, cp, rng, M, N, offsets, spread=True, weights_seed=7):
        self.M, self.N, self.offsets = M, N, offsets
        D = len(offsets) - 1
        self.cols = cols = head_columns(offsets, N, HEAD_ALIGN)
        self.n = cols[1] - cols[0]
        h_host = [tf32(rng.normal(0, 1.0, (M, H))) for _ in range(D)]
        w_host = [np.zeros((H, self.n), np.float32) for _ in range(D)]
        b_host = [np.zeros(self.n, np.float32) for _ in range(D)]
        wrng = np.random.default_rng(weights_seed)
        for d in range(D):  # the padding columns' weights and bias zero, as the network keeps them
            used = (offsets[d + 1] - offsets[d]) * N
            w_host[d][:, :used] = tf32(wrng.normal(0, 1.0 / np.sqrt(H), (H, used)))
            b_host[d][:used] = wrng.normal(0, 0.5, used)
        v = rng.normal(0, 1.0, (M, N)).astype(np.float32)
        if spread:  # logits over hundreds of nats in some rows: probabilities underflow to zero
            v[::7] *= 40.0
            for d in range(D):
                h_host[d][::5] = tf32(h_host[d][::5] * 30.0)
        self.h_wide = cp.zeros((M, D * (H + 4)), cp.float32)
        for d, x in enumerate(h_host):
            self.h_wide[:, (H + 4) * d : (H + 4) * d + H] = to_dev(cp, x)
        self.h = [self.h_wide[:, (H + 4) * d : (H + 4) * d + H] for d in range(D)]
        self.wt = [K.transpose(to_dev(cp, w)) for w in w_host]
        self.bias = [to_dev(cp, b) for b in b_host]
        self.vwide = to_dev(cp, np.full((M, padded(N) + 20), np.nan, np.float32))
        self.vwide[:, 8 : 8 + N] = to_dev(cp, v)
        self.v = self.vwide[:, 8 : 8 + padded(N)]  # (its padding column NaN: never read)
        self.z = to_dev(cp, np.linspace(-10.0, 10.0, N, dtype=np.float32))
        self.adv_ref = R.linear_gemm([host64(x) for x in h_host], [host64(w) for w in w_host],
                                     [host64(b) for b in b_host])
        wide = np.zeros((M, cols[-1]))
        for d, x in enumerate(self.adv_ref):
            wide[:, cols[d] : cols[d + 1]] = x
        self.ref = R.dueling_softmax_forward(host64(v), R.adv_from_columns(wide, offsets, N), host64(self.z),
                                             offsets)

    def run(self, cp, branches, outs, seg_rows, segments=WANTS, adv=None, zq=None, zq_scale=0.25):
        d0, d1 = branches
        return K.heads_dueling(self.h[d0:d1], self.wt[d0:d1], self.v, self.z, self.offsets, branches=branches,
                               segments=segments, seg_rows=seg_rows, bias=self.bias[d0:d1], adv=adv, zq=zq,
                               zq_scale=zq_scale, rounded=H, **outs)


def _outputs(cp, S, A, N):
    """The three segments' outputs, NaN-poisoned: log_probs and var for the first segment's rows."""
    return dict(log_probs=nan_like(cp, (S, A, N)), probs=nan_like(cp, (3 * S, A, N)), q=nan_like(cp, (3 * S, A)),
                var=nan_like(cp, (S, A)))


@pytest.mark.parametrize("N,offsets", LAYOUTS)
@pytest.mark.parametrize("store", [False, True], ids=["heads-kept-on-chip", "heads-written"])
def test_heads_dueling_matches_numpy(cp, rng, N, offsets, store):
    """The update's form: three segments of 1001 rows (a tile's rows across segment boundaries),
    37 rows past them whose heads are computed but whose dueling is not; the direction branch
    first, its Q into a column block of a wider array, then the other branches; with ``store``
    the heads are written too, as column blocks of one NaN-poisoned advantage row."""
    S = 1001
    M, A, D = 3 * S + 37, offsets[-1], len(offsets) - 1
    heads = Heads(cp, rng, M, N, offsets)
    outs = _outputs(cp, S, A, N)
    zwide = nan_like(cp, (3 * S, offsets[1] + 9))
    adv_wide = nan_like(cp, (M, heads.cols[-1] + 8))
    adv = [adv_wide[:, 4 + heads.cols[d] : 4 + heads.cols[d + 1]] for d in range(D)] if store else None
    got = heads.run(cp, (0, 1), outs, S, adv=adv[:1] if store else None, zq=zwide[:, 5 : 5 + offsets[1]])
    if D > 1:
        heads.run(cp, (1, D), outs, S, adv=adv[1:] if store else None)
    assert all(g is outs[k] for g, k in zip(got, ALL))  # (the outputs given, written in place)
    check_three_segments(outs, zwide, tuple(r[: 3 * S] for r in heads.ref), S, offsets[1], TOL)
    got_adv = host64(adv_wide)
    if store:
        for d, ref in enumerate(heads.adv_ref):
            assert_close(f"adv[{d}]", got_adv[:, 4 + heads.cols[d] : 4 + heads.cols[d + 1]], ref, TOL)
        assert np.isnan(got_adv[:, :4]).all() and np.isnan(got_adv[:, 4 + heads.cols[-1] :]).all()
    else:
        assert np.isnan(got_adv).all()


def test_heads_dueling_fewer_rows_than_a_warp_takes(cp, rng):
    """One segment of 5 rows (a warp's 16 rows of its tile mostly past the matrix) and one of 200
    (a tile and a part), every output wanted."""
    N, offsets = 51, (0, 3, 6, 9, 12)
    for M in (5, 200):
        heads = Heads(cp, rng, M, N, offsets, spread=False)
        outs = dict(log_probs=nan_like(cp, (M, 12, N)), probs=nan_like(cp, (M, 12, N)), q=nan_like(cp, (M, 12)),
                    var=nan_like(cp, (M, 12)))
        heads.run(cp, (0, 1), outs, M, segments=[ALL])
        heads.run(cp, (1, 4), outs, M, segments=[ALL])
        for name, r in zip(ALL, heads.ref):
            assert_close(name, outs[name], r, TOL)


def test_heads_dueling_in_a_cuda_graph(cp, rng):
    """Captured once (the tensor maps and the dueling warps' pointers travel in by-value arguments),
    replayed on new GLU outputs and value heads written into the same buffers."""
    N, offsets, S = 51, (0, 3, 6, 9, 12), 700
    heads = Heads(cp, rng, 3 * S, N, offsets)
    outs = _outputs(cp, S, 12, N)
    zwide = nan_like(cp, (3 * S, 12))
    zq = zwide[:, 5:8]
    heads.run(cp, (0, 1), outs, S, zq=zq)  # compiled outside the capture
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        heads.run(cp, (0, 1), outs, S, zq=zq)
        heads.run(cp, (1, 4), outs, S)
        graph = stream.end_capture()
        for seed in range(2):
            fresh = Heads(cp, np.random.default_rng(100 + seed), 3 * S, N, offsets)
            heads.h_wide[...] = fresh.h_wide
            heads.vwide[...] = fresh.vwide
            for o in (*outs.values(), zwide):
                o[...] = np.nan
            stream.synchronize()
            graph.launch(stream)
            stream.synchronize()
            check_three_segments(outs, zwide, fresh.ref, S, 3, TOL)


def test_heads_dueling_rejects_bad_layouts(cp, rng):
    heads = Heads(cp, rng, 256, 51, (0, 3, 6, 9, 12), spread=False)
    outs = _outputs(cp, 64, 12, 51)

    def run(**kw):
        args = dict(branches=(1, 4), segments=WANTS, seg_rows=64, bias=heads.bias[1:])
        args.update(kw)
        a, wt = args.pop("a", heads.h[1:]), args.pop("wt", heads.wt[1:])
        K.heads_dueling(a, wt, heads.v, heads.z, heads.offsets, **args, **outs)

    with pytest.raises(ValueError, match=r"heads_dueling: branches \(1, 4\) .* \(2 sets\)"):
        run(a=heads.h[1:3], wt=heads.wt[1:3])
    with pytest.raises(ValueError, match="heads_dueling: the branches' advantage blocks must be of one width"):
        K.heads_dueling(heads.h[:2], heads.wt[:2], heads.v, heads.z, (0, 3, 5, 9, 12), branches=(0, 2),
                        segments=[ALL], seg_rows=64)
    with pytest.raises(ValueError, match="heads_dueling: the branches' advantage blocks .* at most 160"):
        K.heads_dueling(heads.h[:1], heads.wt[:1], heads.v, heads.z, (0, 4, 12), branches=(0, 1),
                        segments=[ALL], seg_rows=64)
    with pytest.raises(ValueError, match="heads_dueling: branches of 13 actions of 12 atoms take more than 24 values"):
        K.heads_dueling(heads.h[:1], heads.wt[:1], heads.v, heads.z[:12], (0, 13), branches=(0, 1),
                        segments=[ALL], seg_rows=64)
    with pytest.raises(ValueError, match="heads_dueling: wt has 128 rows"):
        run(wt=[w[:128] for w in heads.wt[1:]], bias=None)
    with pytest.raises(ValueError, match=r"heads_dueling: 3 segments of 100 rows .* within the 256 rows"):
        run(seg_rows=100)
    with pytest.raises(ValueError, match=r"heads_dueling: unknown outputs \['logits'\]"):
        run(segments=[("logits",)] * 3)
    with pytest.raises(ValueError, match=r"heads_dueling: 2 adv outputs for 3 sets"):
        run(adv=[cp.zeros((256, 156), cp.float32)] * 2)
    with pytest.raises(ValueError, match=r"heads_dueling: v must be a \[256, 52\] float32 matrix, got \[100, 52\]"):
        K.heads_dueling(heads.h[1:], heads.wt[1:], heads.v[:100], heads.z, heads.offsets, branches=(1, 4),
                        segments=WANTS, seg_rows=64, **outs)
