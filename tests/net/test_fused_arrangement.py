"""The fused GPU arrangement of the network (``foxhunt_core.net.fused``), checked on the CPU.

``fused.py`` runs on CuPy with the core's kernels and cuBLAS. Here the same code runs with NumPy
standing in for CuPy and the kernels' NumPy twins (``foxhunt_core.gpu.reference``) standing in
for the kernel wrappers, in float64. That checks the arrangement itself on every CI run — the
GLU's gate/value GEMM pair, a branch's extra input columns folded into the GLU instead of
concatenated, the advantage GEMMs writing into one buffer, the biases added by the dueling
kernel, the dueling backward in two passes, gradients written into flat slots — against the
reference network. The kernels themselves are checked against the same twins on the GPU
(``tests/gpu``).
"""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest

from foxhunt_core.config import NetSettings
from foxhunt_core.gpu import reference as R
from foxhunt_core.gpu.flat import FlatTree
from foxhunt_core.gpu.launch import head_columns
from foxhunt_core.net import BranchingC51, fused
from foxhunt_core.net import layers as L
from hook_plugins import TanhGateStage


class WideColumns:
    """Two extra columns for the magnitude and urgency branches (the magnitude branch then has
    its direction-Q columns and these)."""

    name = "wide_columns"
    branches = (1, 3)
    width = 2

    def init_params(self, rng):
        return {"w": rng.normal(size=(2,))}

    def forward(self, xp, params, obs):
        x = obs[:, :2]
        return x * params["w"], x

    def backward(self, xp, params, cache, dcols):
        return {"w": (dcols * cache).sum(axis=0)}


def _numpy_cupy() -> types.ModuleType:
    """NumPy under CuPy's name, with float32 meaning float64 (the check runs in float64)."""
    shim = types.ModuleType("cupy")
    shim.__getattr__ = lambda name: getattr(np, name)
    shim.float32 = np.float64
    shim.cuda = types.SimpleNamespace(Device=lambda: types.SimpleNamespace(id=0))
    return shim


def _put(out, value):
    if out is None:
        return value
    out[...] = value
    return out


def _kernels() -> types.SimpleNamespace:
    """The kernel wrappers' signatures over their NumPy twins, honouring ``out`` arguments,
    branch subsets and skipped outputs as the kernels do."""

    def vsn_forward(h2, mpre, *, bias=None, m=None, z=None, keep=True):
        rm, rz = R.vsn_forward(h2, mpre, bias)
        return (_put(m, rm) if keep else None), _put(z, rz)

    def glu_forward(pre_gate, val, *, gate_bias=None, val_bias=None, x_extra=None, w_extra_gate=None,
                    w_extra_val=None, keep=True, gate=None, h=None):
        g, rh, rv = R.glu_forward(pre_gate, val, gate_bias, val_bias, x_extra, w_extra_gate, w_extra_val)
        if keep:
            val[...] = rv
            return _put(gate, g), _put(h, rh)
        return None, _put(h, rh)

    def glu_backward(dh, gate, val, *, dpre_gate=None, dval=None):
        a, b = R.glu_backward(dh, gate, val)
        return _put(dpre_gate, a), _put(dval, b)

    def glu_backward_recompute(dh, pre_gate, val, *, gate_bias=None, val_bias=None, x_extra=None,
                               w_extra_gate=None, w_extra_val=None, dpre_gate=None, dval=None):
        a, b = R.glu_backward_recompute(dh, pre_gate, val, gate_bias, val_bias, x_extra, w_extra_gate, w_extra_val)
        return _put(dpre_gate, a), _put(dval, b)

    def relu_backward(dy, y, *, addend=None, out=None):
        return _put(out, R.relu_backward(dy, y, addend))

    def vsn_backward(dz, h2, m, *, dh2=None, dmpre=None):
        a, b = R.vsn_backward(dz, h2, m)
        return _put(dh2, a), _put(dmpre, b)

    def dueling_softmax_forward(v, adv, z, offsets, *, branches=None, v_bias=None, adv_bias=None,
                                want=("log_probs", "probs", "q", "var"), log_probs=None, probs=None,
                                q=None, var=None):
        N = z.shape[0]
        if adv.ndim == 2:  # the padded layout: the padding is not read
            adv, v = R.adv_from_columns(adv, offsets, N), v[:, :N]
        ref = R.dueling_softmax_forward(v, adv, z, offsets, v_bias, adv_bias)
        d0, d1 = branches or (0, len(offsets) - 1)
        a0, a1 = offsets[d0], offsets[d1]
        for name, out, r in zip(("log_probs", "probs", "q", "var"), (log_probs, probs, q, var), ref):
            if name in want or name == "q":
                out[:, a0:a1] = r[:, a0:a1]
        return log_probs, probs, q, var

    def dueling_backward(dlogits, z, offsets, *, branches=None, accumulate_dv=False, dq=None, probs=None,
                         q=None, dv=None, dadv=None, padded=False):
        rdv, rdadv = R.dueling_backward(dlogits, offsets, dq, probs, q, z, branches)
        d0, d1 = branches or (0, len(offsets) - 1)
        full = np.full(dlogits.shape, np.nan)
        full[:, offsets[d0] : offsets[d1]] = rdadv
        if padded:  # the padding written as zeros, the branches not computed left as they were
            wide = R.columns_from_adv(full, offsets)
            cols = head_columns(offsets, dlogits.shape[2], 4)
            dadv = np.full(wide.shape, np.nan) if dadv is None else dadv
            dadv[:, cols[d0] : cols[d1]] = wide[:, cols[d0] : cols[d1]]
            rdv = np.concatenate([rdv, np.zeros((rdv.shape[0], -(-rdv.shape[1] // 4) * 4 - rdv.shape[1]))], axis=1)
        else:
            dadv = full if dadv is None else dadv
            dadv[:, offsets[d0] : offsets[d1]] = rdadv
        dv = _put(dv, dv + rdv if accumulate_dv else rdv)
        return dv, dadv

    return types.SimpleNamespace(**{f.__name__: f for f in (
        vsn_forward, glu_forward, glu_backward, glu_backward_recompute, relu_backward, vsn_backward,
        dueling_softmax_forward, dueling_backward)})


def _blas() -> types.SimpleNamespace:
    def matmul(a, b, out=None, beta=0.0, bias=None, relu=False):
        r = a @ b if out is None or beta == 0.0 else a @ b + beta * out  # cuBLAS ignores C when beta = 0
        if bias is not None:
            r = r + bias
        if relu:
            r = L.relu(r)
        return _put(out, r)

    def matmul_group(a_list, b_list, outs, beta=0.0):
        for a, b, o in zip(a_list, b_list, outs):
            matmul(a, b, out=o, beta=beta)

    def ones_row(rows, dtype):
        return np.ones((1, rows))

    return types.SimpleNamespace(matmul=matmul, matmul_group=matmul_group, ones_row=ones_row)


@pytest.fixture
def numpy_fused(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", _numpy_cupy())
    monkeypatch.setattr(fused, "K", _kernels())
    monkeypatch.setattr(fused, "cublas", _blas())
    return fused


def _net(stages: bool) -> BranchingC51:
    s = NetSettings(shared_h1=24, shared_h2=16, adv_h=12, num_atoms=11)
    if stages:
        return BranchingC51(s, gate=TanhGateStage(), branch_inputs=[WideColumns()])
    return BranchingC51(s)


def _flat_params(net: BranchingC51, rng, padded: bool = True) -> dict:
    tree = net.init_params(rng, dtype=np.float64)
    for sub in tree.values():  # non-zero biases, so that their paths are exercised
        for k, v in sub.items():
            if ".b" in k or k.endswith("slope"):
                v[...] = rng.normal(0.0, 0.3, v.shape)
    storage = {"core": fused.storage_shapes(net)} if padded else None
    return FlatTree.from_tree(tree, dtype=np.float64, storage=storage)


def test_padded_storage_covers_the_unaligned_weights():
    net = _net(True)  # 11 atoms, branches of 3: 11 -> 12 and 33 -> 36 columns; inputs 16 + 3 + 2 = 21 -> 24 rows
    shapes = fused.storage_shapes(net)
    assert shapes["value.w"] == (16, 12)
    assert shapes["trunk.w1"] == (52, 24)  # the 50 observation features
    assert all(shapes[f"branch{d}.w_out"] == (12, 36) for d in range(4))
    assert shapes["branch1.w_gate"] == shapes["branch1.w_val"] == (24, 12)  # 16 + 3 + 2
    assert shapes["branch3.w_gate"] == (20, 12)  # 16 + 2 (the wide columns) -> 20
    assert "branch0.w_gate" not in shapes and "branch2.w_val" not in shapes  # 16 rows already


@pytest.mark.parametrize("padded", [True, False], ids=["padded-storage", "plain-storage"])
@pytest.mark.parametrize("stages", [False, True], ids=["core", "gate+columns"])
def test_fused_forward_and_backward_match_the_reference(numpy_fused, stages, padded):
    rng = np.random.default_rng(7)
    net = _net(stages)
    flat = _flat_params(net, rng, padded)
    params = flat.tree
    obs = rng.normal(size=(9, net.settings.state_dim))
    ref = net.forward(params, obs, keep_cache=True)
    got = numpy_fused.forward(net, params, obs, keep_cache=True)
    for name in ("log_probs", "probs"):
        np.testing.assert_allclose(getattr(got, name), getattr(ref, name), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(got.q, (ref.probs * net.support64).sum(-1), rtol=1e-10, atol=1e-12)

    dlogits = rng.normal(size=ref.log_probs.shape)
    g_ref = net.backward(params, ref, dlogits)
    slots = flat.zeros_like()
    slots.buffer[...] = np.nan  # a gradient the backward does not write would stay NaN
    g_got = numpy_fused.backward(net, params, got, dlogits, grads_into=slots.tree)
    assert set(g_got) == set(g_ref)
    for owner, sub in g_ref.items():
        assert set(g_got[owner]) == set(sub)
        for k, v in sub.items():
            np.testing.assert_allclose(g_got[owner][k], v, rtol=1e-9, atol=1e-12, err_msg=f"{owner}/{k}")
    for k, v in g_got["core"].items():  # the core's gradients live in the given slots
        assert np.shares_memory(v, slots.buffer), k
    for k, blk in slots.storage["core"].items():  # the padding of every padded gradient is zero
        r, c = g_got["core"][k].shape
        assert not blk[r:].any() and not blk[:, c:].any(), k
    assert set(slots.storage["core"]) == (set(fused.storage_shapes(net)) if padded else set())


def test_forward_without_cache_writes_only_what_is_asked(numpy_fused):
    rng = np.random.default_rng(3)
    net = _net(True)
    params = _flat_params(net, rng).tree
    obs = rng.normal(size=(5, net.settings.state_dim))
    ref = net.forward(params, obs)
    got = numpy_fused.forward(net, params, obs, keep_cache=False, outputs=("q",))
    assert got.probs is None and got.log_probs is None and got.var is None and got.cache is None
    np.testing.assert_allclose(got.q, (ref.probs * net.support64).sum(-1), rtol=1e-10)
    got = numpy_fused.forward(net, params, obs, keep_cache=False, outputs=("probs",))
    np.testing.assert_allclose(got.probs, ref.probs, rtol=1e-10, atol=1e-14)
    assert np.allclose(L.softmax(ref.logits), ref.probs)
