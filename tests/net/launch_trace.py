"""The launch sequence of the fused GPU network, recorded on the CPU.

``foxhunt_core.net.fused`` decides, for a device, a batch size, the network's shapes, its plugin
stages and TF32, which kernels run and with which arguments. Here that code runs with NumPy under
CuPy's name and every kernel wrapper and GEMM replaced by a recorder that checks nothing and
computes nothing (it returns zeros of the output's shape): the trace is the sequence of calls
(the kernel's name, every array argument as its shape, element strides, element offset into its
buffer and which buffer, every other argument as it is, and the kernels' compile-time
configuration) and of side-stream switches. Its digest is compared with the one recorded before
the execution plan existed (``plan_decisions.json``): the same kernels with the same arguments.

Set ``FOXHUNT_TRACE_DIR`` to a folder to have every case's whole trace written there as JSON (to
diff two versions' traces).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
import types
from pathlib import Path
from typing import Any

import numpy as np

from foxhunt_core import attention
from foxhunt_core.config import NetSettings
from foxhunt_core.gpu.flat import FlatTree
from foxhunt_core.gpu.launch import head_columns, padded
from foxhunt_core.net import BranchingC51
from hook_plugins import OfiColumnStage

# The network shapes of the grid: (label, NetSettings keywords, stages)
SHAPES: dict[str, tuple[dict[str, Any], str]] = {
    "default": ({}, ""),
    "glu128": (dict(shared_h1=64, shared_h2=64, adv_h=128), ""),
    "narrow48": (dict(shared_h1=64, shared_h2=64, adv_h=48), ""),
    "dir5": (dict(branch_sizes=(5, 3, 3, 3)), ""),
    "atoms101": (dict(num_atoms=101), ""),
    "adv512": (dict(adv_h=512), ""),
    "plugin-gate": ({}, "gate"),
    "ofi-column": ({}, "columns"),
}
# (compute capability, SMs)
DEVICES = {"h200": ("90", 132), "h100-pcie": ("90", 114), "a100": ("80", 108)}
UPDATE_ROWS = (128, 1024, 1025, 2048, 4096, 8192, 8448, 16384, 32768, 65536)
ACT_ROWS = (1, 256, 4096, 65536)


def cases() -> list[tuple[str, str, str, bool, int]]:
    """``(kind, shape, device, tf32, rows)`` of the grid (kind "update" or "act"). Off Hopper or
    without TF32 no tensor-core kernel runs: two shapes suffice there. The plugin stages' paths
    move much memory on the CPU: their grid stops at 32768 rows (every threshold is reached)."""
    out = []
    for shape in SHAPES:
        for dev in DEVICES:
            for tf32 in (True, False):
                if (dev == "a100" or not tf32) and shape not in ("default", "plugin-gate"):
                    continue
                if shape == "plugin-gate" and dev == "h100-pcie" or (dev == "a100" and not tf32 and shape != "default"):
                    continue
                small = SHAPES[shape][1] != ""
                out += [("update", shape, dev, tf32, b) for b in UPDATE_ROWS if not (small and b > 32768)]
                out += [("act", shape, dev, tf32, b) for b in ACT_ROWS if not (small and b > 32768)]
    return out


def case_id(case: tuple) -> str:
    kind, shape, dev, tf32, rows = case
    return f"{kind}-{shape}-{dev}-{'tf32' if tf32 else 'fp32'}-{rows}"


class PlainGate:
    """A plugin gate that computes next to nothing (the trace needs only that it is not the
    built-in sigmoid): the identity, with a parameter vector per branch."""

    name = "plain_gate"

    def init_params(self, widths, rng):
        return {f"b{d}.w": np.ones(w) for d, w in enumerate(widths)}

    def forward(self, xp, params, branch, pre):
        return pre, None

    def backward(self, xp, params, branch, cache, dgate):
        return dgate, {f"b{branch}.w": params[f"b{branch}.w"]}


def network(shape: str) -> BranchingC51:
    kw, stages = SHAPES[shape]
    return BranchingC51(NetSettings(**kw), gate=PlainGate() if stages == "gate" else None,
                        branch_inputs=[OfiColumnStage()] if stages == "columns" else [])


def stacked_trees(net: BranchingC51, storage: dict) -> tuple[FlatTree, FlatTree, FlatTree]:
    """The online tree, its twin and the target tree in one allocation, as the agent lays them out
    (the core's weights with the attention's, the plugins' own trees)."""
    rng = np.random.default_rng(0)
    tree = net.init_params(rng, dtype=np.float32)
    tree["core"].update(attention.init_params(net.num_actions, net.settings.attn_dim, rng))
    shapes = {o: {k: tuple(v.shape) for k, v in sub.items()} for o, sub in tree.items()}
    return FlatTree.stacked(3, shapes, xp=np, dtype=np.float32, storage={"core": storage})


class Recorder:
    """The trace of one case: calls in order, arrays described relative to their buffers."""

    def __init__(self) -> None:
        self.calls: list[Any] = []
        self._bases: dict[int, int] = {}
        self._keep: list[Any] = []  # (so that no buffer's id is reused within the case)

    def array(self, a: np.ndarray) -> list:
        base = a
        while isinstance(base.base, np.ndarray):
            base = base.base
        idx = self._bases.setdefault(id(base), len(self._bases))
        self._keep.append(base)
        off = (a.__array_interface__["data"][0] - base.__array_interface__["data"][0]) // a.itemsize
        return ["A", list(a.shape), [s // a.itemsize for s in a.strides], int(off), idx]

    def value(self, v: Any) -> Any:
        if isinstance(v, np.ndarray):
            return self.array(v)
        if isinstance(v, (list, tuple)):
            return [self.value(x) for x in v]
        if isinstance(v, dict):
            return {str(k): self.value(x) for k, x in sorted(v.items())}
        if isinstance(v, (np.integer, np.floating, np.bool_)):
            return v.item()
        if v is None or isinstance(v, (bool, int, float, str)):
            return v
        raise TypeError(f"cannot record {type(v).__name__}")

    def call(self, name: str, args: tuple, kwargs: dict, config: dict | None = None) -> None:
        entry = [name, [self.value(a) for a in args], {k: self.value(v) for k, v in sorted(kwargs.items())}]
        if config:
            entry.append(self.value(config))
        self.calls.append(entry)

    def digest(self) -> dict[str, Any]:
        text = json.dumps(self.calls, separators=(",", ":"))
        names: list[str] = []
        for c in self.calls:  # run-length: "matmul*3"
            n = c[0]
            if names and names[-1].split("*")[0] == n:
                k = int(names[-1].split("*")[1]) if "*" in names[-1] else 1
                names[-1] = f"{n}*{k + 1}"
            else:
                names.append(n)
        return {"calls": len(self.calls), "names": " ".join(names), "sha256": hashlib.sha256(text.encode()).hexdigest()}


def numpy_cupy() -> types.ModuleType:
    """NumPy under CuPy's name."""
    shim = types.ModuleType("cupy")
    shim.__getattr__ = lambda name: getattr(np, name)
    shim.cuda = types.SimpleNamespace(Device=lambda: types.SimpleNamespace(id=0))
    return shim


def zeros(shape: tuple) -> np.ndarray:
    return np.zeros(tuple(int(s) for s in shape), dtype=np.float32)


def _given(out: Any, shape: tuple) -> Any:
    return out if out is not None else zeros(shape)


def launchers(rec: Recorder, config: Any) -> dict[str, Any]:
    """Recording stand-ins of the kernel wrappers the fused network calls; ``config(name, kwargs)``
    gives the compile-time configuration a wrapper would launch its kernel with."""

    def recorded(fn: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            cfg, kwargs = config(fn.__name__, dict(kwargs))
            rec.call(fn.__name__, args, kwargs, cfg)
            return fn(*args, **kwargs)

        wrapper.__name__ = fn.__name__
        return wrapper

    def pack_rows(sources, width, *, out=None):
        return _given(out, (sum(x.shape[0] for x in sources), width))

    def vsn_forward(h2, mpre, *, width=None, keep_rows=None, m=None, z=None, tf32=False):
        B, H = h2.shape
        keep = B if keep_rows is None else keep_rows
        return (_given(m, (keep, H)) if keep else None), _given(z, (B, width or H))

    def glu_gemm(u, w, *, bias=None, width=None, blocks=1, h=None, pv=None, wt=None, rounded=0, tf32_h=False):
        H = w.shape[1] // (2 * blocks)
        return _given(h, (u.shape[0], blocks * (width or H)))

    def transpose(w, *, out=None):
        return _given(out, (w.shape[1], w.shape[0]))

    def glu_forward(pv, *, width=None, blocks=1, h=None):
        H = pv.shape[1] // (2 * blocks)
        return _given(h, (pv.shape[0], blocks * (width or H)))

    def heads_dueling(a, wt, v, z, offsets, *, branches, segments, seg_rows, bias=None, adv=None, log_probs=None,
                      probs=None, q=None, var=None, zq=None, zq_scale=1.0, rounded=0):
        return log_probs, probs, q, var

    def linear_gemm(a, wt, out=None, *, bias=None, relu=False, tf32_out=False, rounded=0):
        return list(out) if out is not None else [zeros((x.shape[0], t.shape[0])) for x, t in zip(a, wt)]

    def dueling_softmax_forward(v, adv, z, offsets, *, branches=None, v_bias=None, adv_bias=None,
                                want=("log_probs", "probs", "q", "var"), segments=None, log_probs=None,
                                probs=None, q=None, var=None, zq=None, zq_scale=1.0):
        return log_probs, probs, q, var

    def dueling_backward(dlogits, z, offsets, *, branches=None, accumulate_dv=False, dq=None, dq_scale=1.0,
                         probs=None, q=None, dv=None, dadv=None, padded=False):
        B, A, N = dlogits.shape
        dv = _given(dv, (B, padded_n(N) if padded else N))
        dadv = _given(dadv, (B, head_columns(offsets, N, 4)[-1]) if padded else (B, A, N))
        return dv, dadv

    def round_tf32(x, *, out=None):
        return _given(out, x.shape)

    def glu_backward_gemm(dadv, wo, pv, *, dq=None, wq=None, dq_set=0):
        return pv

    def glu_backward(dh, pv, *, blocks=1, dpv=None):
        return _given(dpv, pv.shape)

    def wgrad_gemm(xt, y, *, out=None, zero_rows=(0, 0), keep_cols=(0, 0)):
        return _given(out, (xt.shape[0], y.shape[1]))

    def wgrad_gemm_sets(x, y, out):
        return list(out)

    def vsn_backward(dz, h2, m, *, dh2=None, dmpre=None, tf32=False):
        return _given(dh2, h2.shape), _given(dmpre, h2.shape)

    def linear_gemm_relu_backward(a, wt, y, *, addend=None, out=None, rounded=0, tf32_out=False):
        return _given(out, (a.shape[0], wt.shape[0]))

    def relu_backward(dy, y, *, addend=None, out=None):
        return _given(out, dy.shape)

    def padded_n(n):
        return padded(n)

    fns = (pack_rows, vsn_forward, glu_gemm, transpose, glu_forward, heads_dueling, linear_gemm,
           dueling_softmax_forward, dueling_backward, round_tf32, glu_backward_gemm, glu_backward, wgrad_gemm,
           wgrad_gemm_sets, vsn_backward, linear_gemm_relu_backward, relu_backward)
    return {f.__name__: recorded(f) for f in fns}


def blas(rec: Recorder) -> types.SimpleNamespace:
    def matmul(a, b, out=None, beta=0.0, **kw):
        rec.call("matmul", (a, b), {"out": out, "beta": beta, **kw})
        return _given(out, (a.shape[0], b.shape[1]))

    def ones_row(rows, dtype):
        return np.ones((1, rows), dtype=np.float32)

    return types.SimpleNamespace(matmul=matmul, ones_row=ones_row)


def side_streams(rec: Recorder) -> types.SimpleNamespace:
    @contextlib.contextmanager
    def beside():
        rec.calls.append(["beside>"])
        yield None
        rec.calls.append(["<beside"])

    return types.SimpleNamespace(beside=beside, join=lambda: rec.calls.append(["join"]))


def write_trace(case: tuple, rec: Recorder) -> None:
    folder = os.environ.get("FOXHUNT_TRACE_DIR")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        (Path(folder) / f"{case_id(case)}.json").write_text(json.dumps(rec.calls, indent=0))


GOLDEN = Path(__file__).with_name("plan_decisions.json")


def load_golden() -> dict[str, Any]:
    return json.loads(GOLDEN.read_text())


def save_golden(digests: dict[str, Any]) -> None:
    GOLDEN.write_text(json.dumps(digests, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":  # pragma: no cover
    sys.exit("run through tests/net/test_plan_decisions.py")
