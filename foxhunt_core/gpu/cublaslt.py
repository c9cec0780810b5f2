"""float32 GEMMs through cuBLASLt, with the bias and ReLU + bias epilogues.

:mod:`foxhunt_core.gpu.cublas` sends every 2-D float32 product here first. cuBLASLt picks its
kernel by a heuristic that knows the operands' alignment and has a workspace (on the H200 it
often chooses faster kernels than ``cublasGemmEx`` for the network's tall-skinny shapes), and it
can fuse into the GEMM what would otherwise be a separate pass over the output: ``bias``
(``EPILOGUE_BIAS``) and ``relu`` with it (``EPILOGUE_RELU_BIAS``), ``relu(a @ b + bias)``.
(Its bias-gradient epilogue, ``BGRADA``, was measured on the H200 and is not used: it runs as a
separate kernel, about four times slower than the gemv the backward uses instead.)

A plan (descriptors, layouts and up to :data:`CANDIDATES` algorithms, the heuristic's best
first) is made once per shape, layout, alignment and epilogue and cached; making one calls only
host functions, so it is allowed inside a stream capture. :func:`matmul` returns False when
cuBLASLt offers no algorithm (the caller then falls back to ``cublasGemmEx``), so an epilogue the
library does not support for a case costs speed, never correctness.

Autotuning (:func:`set_autotune`; off by default, on when ``FOXHUNT_LT_AUTOTUNE=1``): with it off
every call runs the heuristic's first algorithm. With it on, the first call of a plan made while
its stream is not capturing times every candidate on the stream (CUDA events, the median of
several launches after warm-up ones) into a scratch copy of the output, keeps the fastest in the
plan, then makes the real call once; the output is written by that call only. Later calls, inside
a capture too, use the kept algorithm. A plan first used during a capture runs the heuristic's
first algorithm there (timing would synchronize and allocate) and is tuned at its first call
outside one. The choice depends on timing, so two runs that tune for themselves may choose
differently and round differently; runs that share a record (:func:`tuning_record`,
:func:`load_tuning_record`: a run directory's, the machine's cache in :mod:`.tuning_cache`) run the
same algorithms. :func:`tuning_report` lists what was measured and chosen.

Column-major view of a row-major product, as in :mod:`.cublas`: ``out [M, N] = a [M, K] @ b [K, N]``
is ``D [N, M] = b' [N, K] * a' [K, M]``, so cuBLASLt's A is our ``b``, its B our ``a``, its rows
``m = N`` (the output features: the bias runs along them) and ``k = K``.
"""

from __future__ import annotations

import ctypes
import os
from typing import Any

from .cudalib import open_library

EPI_DEFAULT, EPI_RELU, EPI_BIAS, EPI_RELU_BIAS = 1, 2, 4, 6
_DESC_TRANSA, _DESC_TRANSB, _DESC_EPILOGUE, _DESC_BIAS_POINTER, _DESC_BIAS_BATCH_STRIDE = 3, 4, 7, 8, 10
_LAYOUT_BATCH_COUNT, _LAYOUT_BATCH_STRIDE = 5, 6
_PREF_MAX_WORKSPACE = 1
_PREF_MIN_ALIGN = (5, 6, 7, 8)  # A, B, C, D
R_32F = 0
WORKSPACE_BYTES = 32 << 20
CANDIDATES = 8  # heuristic results asked for per plan
# cublasLtMatmulAlgoConfigAttributes_t: (name, attribute, C type) as algo_config reports them
_CONFIG = (("id", 0, ctypes.c_int32), ("tile", 1, ctypes.c_uint32), ("split_k", 2, ctypes.c_uint32),
           ("reduction", 3, ctypes.c_uint32), ("stages", 6, ctypes.c_uint32))
# Every attribute that makes an algorithm what it is (cublasLtMatmulAlgoConfigAttributes_t): a
# recorded algorithm is found again among a new plan's candidates by these, not by its opaque bytes,
# whose tail differs from one heuristic query to the next for the same algorithm.
_IDENTITY = (*_CONFIG, ("swizzle", 4, ctypes.c_uint32), ("custom_option", 5, ctypes.c_uint32),
             ("inner_shape", 7, ctypes.c_uint16), ("cluster_shape", 8, ctypes.c_uint16))
_TUNE_WARMUP, _TUNE_REPEATS = 2, 5  # launches per candidate: untimed, then timed (median)
# Before each candidate's launches the stream gets this much memset work, so the GPU is still busy
# while the host queues them and the times are the kernels', not the host's launch overhead.
_LEAD_BYTES, _LEAD_MEMSETS = 32 << 20, 16

_lib: Any = None
_handles: dict[int, tuple[Any, Any]] = {}
_plans: dict[tuple, Any] = {}
_enabled = True
_autotune = os.environ.get("FOXHUNT_LT_AUTOTUNE", "0") == "1"
_tuned: list[_Plan] = []  # in the order they were tuned
_recorded: dict[str, str] = {}  # plan -> chosen algorithm (hex), from load_tuning_record
RECORD_FORMAT = 1


class _Algo(ctypes.Structure):
    _fields_ = [("data", ctypes.c_uint64 * 8)]


class _Heuristic(ctypes.Structure):
    _fields_ = [("algo", _Algo), ("workspaceSize", ctypes.c_size_t), ("state", ctypes.c_int),
                ("wavesCount", ctypes.c_float), ("reserved", ctypes.c_int * 4)]


class CublasLtError(RuntimeError):
    pass


def set_enabled(enabled: bool) -> None:
    """Route float32 GEMMs through cuBLASLt (default) or straight to ``cublasGemmEx``."""
    global _enabled
    _enabled = bool(enabled)


def enabled() -> bool:
    return _enabled


def set_autotune(enabled: bool) -> None:
    """Time each plan's candidate algorithms at its first call outside a capture and keep the
    fastest (on), or always run the heuristic's first (off, the default unless
    ``FOXHUNT_LT_AUTOTUNE=1``). Plans tuned already keep their measurements either way."""
    global _autotune
    _autotune = bool(enabled)


def autotune_enabled() -> bool:
    return _autotune


def device_tag() -> str:
    """The GPU model and the cuBLASLt version: a tuning record is valid for both only."""
    import cupy

    props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    return f"{name}; cublasLt {_load().cublasLtGetVersion()}"


def tuning_record() -> dict[str, Any]:
    """The algorithms chosen so far (tuned or taken from a loaded record), for
    :func:`load_tuning_record`: ``{"format", "device", "plans": {plan: algorithm}}``, a plan named
    by its shapes, layouts, alignments and epilogue, an algorithm by cuBLASLt's opaque bytes."""
    plans = dict(_recorded)
    for p in _tuned:
        if p.algos and not p.from_record:  # (a recorded choice keeps its bytes: the query's tail differs)
            plans[p.name] = bytes(p.algos[p.chosen]).hex()
    return {"format": RECORD_FORMAT, "device": device_tag(), "plans": dict(sorted(plans.items()))}


def load_tuning_record(record: Any, source: str) -> bool:
    """Take the choices of a :func:`tuning_record` (e.g. the one a run directory keeps): a plan
    made later with autotuning on runs the recorded algorithm, untimed, when it is still among the
    heuristic's candidates (known by its configuration: ``_IDENTITY``), so a resumed run repeats
    the first run's GEMMs bit for bit. Returns
    False, taking nothing, when the record is for another GPU or cuBLASLt; raises ValueError
    naming ``source`` when it is malformed."""
    check_tuning_record(record, source)
    if record["device"] != device_tag():
        return False
    _recorded.update(record["plans"])
    return True


def check_tuning_record(record: Any, source: str) -> None:
    """Raise ValueError naming ``source`` unless ``record`` has the form of a :func:`tuning_record`
    (needs no GPU)."""
    if not isinstance(record, dict) or record.get("format") != RECORD_FORMAT:
        raise ValueError(f"{source}: not a GEMM tuning record of format {RECORD_FORMAT}")
    plans = record.get("plans")
    if not isinstance(record.get("device"), str) or not isinstance(plans, dict):
        raise ValueError(f"{source}: a tuning record needs a 'device' string and a 'plans' table")
    for k, v in plans.items():
        if not (isinstance(k, str) and isinstance(v, str) and len(v) == 2 * ctypes.sizeof(_Algo)
                and all(c in "0123456789abcdef" for c in v)):
            raise ValueError(f"{source}: plans[{k!r}] is not a {ctypes.sizeof(_Algo)}-byte algorithm in hex")


def forget() -> None:
    """Drop every plan, measurement and loaded record of this process (as in a fresh process);
    for tests and benchmarks that compare fresh runs in one process."""
    _plans.clear()
    _tuned.clear()
    _recorded.clear()


def tuning_report() -> list[dict[str, Any]]:
    """One entry per tuned plan, in tuning order: ``m``, ``n``, ``k`` and ``ops`` (``"NT"`` is
    op(A) = A, op(B) = B') in cuBLASLt's column-major terms (the row-major product is
    ``[n, k] @ [k, m]``), ``compute`` and ``epilogue`` (the enums' values), ``candidates``,
    ``batch`` (the strided batch's count, 1 for a single product),
    ``chosen`` (index into them; 0 is the heuristic's first), ``config`` (the chosen one's:
    :func:`algo_config`), ``times_ms`` (median per candidate, None where it failed to launch),
    ``best_ms`` (the chosen one's) and ``first_ms`` (the heuristic first's). A plan with a single
    candidate is listed untimed (``times_ms`` empty, the two None)."""
    out = []
    for p in _tuned:
        m, n, k = p.shape
        t = p.times_ms
        out.append(dict(m=m, n=n, k=k, ops=p.ops, compute=p.compute, epilogue=p.epilogue, batch=p.batch[0],
                        candidates=len(p.algos), chosen=p.chosen, config=algo_config(p.algos[p.chosen]),
                        times_ms=list(t),
                        best_ms=t[p.chosen] if t else None, first_ms=t[0] if t else None))
    return out


def _load() -> Any:
    global _lib
    if _lib is None:
        import cupy  # noqa: F401 - CuPy's CUDA libraries are loaded first

        _lib = open_library("cublasLt", CublasLtError)
        vp, i, sz = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t
        pvp = ctypes.POINTER(vp)
        _lib.cublasLtCreate.argtypes = [pvp]
        _lib.cublasLtMatmulDescCreate.argtypes = [pvp, i, i]
        _lib.cublasLtMatmulDescSetAttribute.argtypes = [vp, i, vp, sz]
        _lib.cublasLtMatrixLayoutCreate.argtypes = [pvp, i, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_int64]
        _lib.cublasLtMatrixLayoutSetAttribute.argtypes = [vp, i, vp, sz]
        _lib.cublasLtMatmulPreferenceCreate.argtypes = [pvp]
        _lib.cublasLtMatmulPreferenceSetAttribute.argtypes = [vp, i, vp, sz]
        _lib.cublasLtMatmulAlgoGetHeuristic.argtypes = [
            vp, vp, vp, vp, vp, vp, vp, i, ctypes.POINTER(_Heuristic), ctypes.POINTER(i)]
        _lib.cublasLtGetVersion.restype = ctypes.c_size_t
        _lib.cublasLtMatmulAlgoConfigGetAttribute.argtypes = [ctypes.POINTER(_Algo), i, vp, sz, ctypes.POINTER(sz)]
        _lib.cublasLtMatmul.argtypes = [
            vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, ctypes.POINTER(_Algo), vp, sz, vp]
    return _lib


def _check(status: int, what: str) -> None:
    if status != 0:
        raise CublasLtError(f"{what} failed with cuBLAS status {status}")


def _handle(stream_ptr: int | None = None) -> tuple[Any, Any]:
    """The device's handle and the workspace of ``stream_ptr`` (one per stream: GEMMs on two
    streams may run at once, and a split-K GEMM keeps its partial sums there)."""
    import cupy

    dev = cupy.cuda.Device().id
    h = _handles.get(dev)
    if h is None:
        lib = _load()
        ptr = ctypes.c_void_p()
        _check(lib.cublasLtCreate(ctypes.byref(ptr)), "cublasLtCreate")
        h = _handles[dev] = (ptr, {})
    if stream_ptr is None:
        return h[0], None
    ws = h[1].get(stream_ptr)
    if ws is None:  # made on the stream's first GEMM (the update's warm-up runs before its capture)
        ws = h[1][stream_ptr] = cupy.cuda.memory.alloc(WORKSPACE_BYTES)
    return h[0], ws


def _alignment(ptr: int) -> int:
    """The largest power of two (up to 256) that divides ``ptr``."""
    return min(256, ptr & -ptr) if ptr else 256


def _set(fn: Any, obj: Any, attr: int, value: Any) -> None:
    _check(fn(obj, attr, ctypes.byref(value), ctypes.sizeof(value)), "cublasLt set attribute")


class _Plan:
    def __init__(self, compute: int, op_a: int, op_b: int, m: int, n: int, k: int, lda: int, ldb: int,
                 ldc: int, epilogue: int, aligns: tuple[int, ...], bias_ptr: int,
                 batch: tuple[int, int, int, int, int] = (1, 0, 0, 0, 0)) -> None:
        lib = _load()
        vp = ctypes.c_void_p
        self.desc = vp()
        _check(lib.cublasLtMatmulDescCreate(ctypes.byref(self.desc), compute, R_32F), "cublasLtMatmulDescCreate")
        sd = lib.cublasLtMatmulDescSetAttribute
        _set(sd, self.desc, _DESC_TRANSA, ctypes.c_int32(op_a))
        _set(sd, self.desc, _DESC_TRANSB, ctypes.c_int32(op_b))
        _set(sd, self.desc, _DESC_EPILOGUE, ctypes.c_uint32(epilogue))
        if bias_ptr:
            _set(sd, self.desc, _DESC_BIAS_POINTER, ctypes.c_void_p(bias_ptr))
        count, stride_a, stride_b, stride_c, stride_bias = batch
        if count > 1 and bias_ptr:
            _set(sd, self.desc, _DESC_BIAS_BATCH_STRIDE, ctypes.c_int64(stride_bias))
        # Stored shapes (column-major): op(A) is m x k, op(B) is k x n, C and D are m x n.
        a_rows, a_cols = (m, k) if op_a == 0 else (k, m)
        b_rows, b_cols = (k, n) if op_b == 0 else (n, k)
        self.layouts = []
        for rows, cols, ld, stride in ((a_rows, a_cols, lda, stride_a), (b_rows, b_cols, ldb, stride_b),
                                       (m, n, ldc, stride_c)):
            lay = vp()
            _check(lib.cublasLtMatrixLayoutCreate(ctypes.byref(lay), R_32F, rows, cols, ld),
                   "cublasLtMatrixLayoutCreate")
            if count > 1:
                sl = lib.cublasLtMatrixLayoutSetAttribute
                _set(sl, lay, _LAYOUT_BATCH_COUNT, ctypes.c_int32(count))
                _set(sl, lay, _LAYOUT_BATCH_STRIDE, ctypes.c_int64(stride))
            self.layouts.append(lay)
        pref = vp()
        _check(lib.cublasLtMatmulPreferenceCreate(ctypes.byref(pref)), "cublasLtMatmulPreferenceCreate")
        sp = lib.cublasLtMatmulPreferenceSetAttribute
        _set(sp, pref, _PREF_MAX_WORKSPACE, ctypes.c_uint64(WORKSPACE_BYTES))
        for attr, al in zip(_PREF_MIN_ALIGN, aligns):
            _set(sp, pref, attr, ctypes.c_uint32(al))
        results = (_Heuristic * CANDIDATES)()
        count = ctypes.c_int(0)
        h, _ = _handle()
        la, lb, lc = self.layouts
        status = lib.cublasLtMatmulAlgoGetHeuristic(
            h, self.desc, la, lb, lc, lc, pref, CANDIDATES, results, ctypes.byref(count))
        found = results[: count.value] if status == 0 else []
        self.algos = [_Algo.from_buffer_copy(r.algo) for r in found
                      if r.state == 0 and r.workspaceSize <= WORKSPACE_BYTES]
        self.ok = bool(self.algos)
        self.shape, self.ops, self.compute, self.epilogue = (m, n, k), "NT"[op_a] + "NT"[op_b], compute, epilogue
        self.batch = batch
        self.name = (f"c{compute} {self.ops} m{m} n{n} k{k} ld{lda},{ldb},{ldc} e{epilogue} "
                     f"a{','.join(map(str, aligns))} b{_alignment(bias_ptr) if bias_ptr else 0} "
                     f"x{','.join(map(str, batch))}")
        self.tuned, self.chosen = False, 0
        self.from_record = False  # chosen as a loaded record says (tuning_record then keeps the record's bytes)
        self.times_ms: list[float | None] = []


def algo_config(algo: _Algo) -> dict[str, int | None]:
    """What an algorithm is (cuBLASLt's enums): ``id``, ``tile``, ``split_k`` (the slices of K:
    ``0xffffffff`` where the kernel decides), ``reduction`` and ``stages``; None for an attribute
    the library does not report for it."""
    return _attributes(algo, _CONFIG)


def _attributes(algo: _Algo, attrs: tuple[tuple[str, int, Any], ...]) -> dict[str, int | None]:
    lib = _load()
    out: dict[str, int | None] = {}
    for name, attr, ctype in attrs:
        v, written = ctype(0), ctypes.c_size_t(0)
        status = lib.cublasLtMatmulAlgoConfigGetAttribute(ctypes.byref(algo), attr, ctypes.byref(v),
                                                          ctypes.sizeof(v), ctypes.byref(written))
        out[name] = int(v.value) if status == 0 and written.value == ctypes.sizeof(v) else None
    return out


def _capturing(stream_ptr: int) -> bool:
    """Whether the stream is capturing; True also when that cannot be told (e.g. the legacy stream
    while another stream captures), so that tuning waits."""
    from cupy.cuda import runtime

    try:
        return bool(runtime.streamIsCapturing(stream_ptr))
    except RuntimeError:
        return True


def _tune(plan: _Plan, launch: Any, c_ptr: int, ldc: int, beta: float, stream_ptr: int) -> None:
    """Time each of the plan's algorithms on a scratch copy of the output, keep the fastest."""
    import cupy
    from cupy.cuda import runtime

    rows, cols = plan.shape[0], plan.shape[1]
    count, stride_c = plan.batch[0], plan.batch[3]
    extent = (count - 1) * stride_c + (cols - 1) * ldc + rows  # of C, in floats
    scratch = cupy.empty(extent, dtype=cupy.float32)
    if beta != 0.0:  # C is read: give the candidates the real one
        runtime.memcpyAsync(scratch.data.ptr, c_ptr, extent * 4, runtime.memcpyDeviceToDevice, stream_ptr)
    lead = cupy.empty(_LEAD_BYTES, dtype=cupy.uint8)
    events = [cupy.cuda.Event() for _ in range(_TUNE_REPEATS + 1)]
    times: list[float | None] = []
    for algo in plan.algos:
        for _ in range(_LEAD_MEMSETS):
            runtime.memsetAsync(lead.data.ptr, 0, _LEAD_BYTES, stream_ptr)
        statuses = [launch(algo, scratch.data.ptr) for _ in range(_TUNE_WARMUP)]
        runtime.eventRecord(events[0].ptr, stream_ptr)
        for ev in events[1:]:
            statuses.append(launch(algo, scratch.data.ptr))
            runtime.eventRecord(ev.ptr, stream_ptr)
        if any(statuses):  # rejected at launch (nothing ran): not a candidate
            times.append(None)
            continue
        events[-1].synchronize()
        laps = sorted(cupy.cuda.get_elapsed_time(e0, e1) for e0, e1 in zip(events, events[1:]))
        times.append(laps[len(laps) // 2])
    runtime.streamSynchronize(stream_ptr)  # the scratch buffers are freed on return
    timed = [i for i, t in enumerate(times) if t is not None]
    plan.chosen = min(timed, key=lambda i: times[i]) if timed else 0
    plan.times_ms, plan.tuned = times, True
    _tuned.append(plan)


def matmul(compute: int, op_a: int, op_b: int, m: int, n: int, k: int, a_ptr: int, lda: int,
           b_ptr: int, ldb: int, c_ptr: int, ldc: int, beta: float, stream_ptr: int,
           epilogue: int = EPI_DEFAULT, bias_ptr: int = 0,
           batch: tuple[int, int, int, int, int] = (1, 0, 0, 0, 0)) -> bool:
    """``D = A op B (+ beta C)`` with ``epilogue`` in cuBLASLt's column-major terms (D is C, in
    place); False, and nothing launched, when cuBLASLt has no algorithm for the case. With
    autotuning on, a plan's first call outside a stream capture first tunes it (module docstring).
    ``batch = (count, stride_a, stride_b, stride_c, stride_bias)`` (elements): a strided batch of
    ``count`` products, the bias of product ``i`` at ``bias_ptr + i * stride_bias``."""
    import cupy

    aligns = (_alignment(a_ptr), _alignment(b_ptr), _alignment(c_ptr), _alignment(c_ptr))
    batch = tuple(int(x) for x in batch) if batch[0] > 1 else (1, 0, 0, 0, 0)
    key = (cupy.cuda.Device().id, compute, op_a, op_b, m, n, k, lda, ldb, ldc, epilogue, aligns,
           _alignment(bias_ptr) if bias_ptr else 0, batch)
    plan = _plans.get(key)
    if plan is None:
        plan = _plans[key] = _Plan(compute, op_a, op_b, m, n, k, lda, ldb, ldc, epilogue, aligns, bias_ptr, batch)
    if not plan.ok:
        return False
    lib = _load()
    if bias_ptr:  # the plan is shared by every call of this shape: point it at this call's vector
        _set(lib.cublasLtMatmulDescSetAttribute, plan.desc, _DESC_BIAS_POINTER, ctypes.c_void_p(bias_ptr))
    h, workspace = _handle(stream_ptr)
    alpha, cbeta = ctypes.c_float(1.0), ctypes.c_float(beta)
    la, lb, lc = plan.layouts
    vp = ctypes.c_void_p

    def launch(algo: _Algo, d_ptr: int) -> int:
        return lib.cublasLtMatmul(h, plan.desc, ctypes.byref(alpha), vp(a_ptr), la, vp(b_ptr), lb,
                                  ctypes.byref(cbeta), vp(d_ptr), lc, vp(d_ptr), lc, ctypes.byref(algo),
                                  vp(workspace.ptr), WORKSPACE_BYTES, vp(stream_ptr))

    if _autotune and not plan.tuned and plan.name in _recorded:  # (inside a capture too: no timing)
        want = _Algo.from_buffer_copy(bytes.fromhex(_recorded[plan.name]))
        same = _attributes(want, _IDENTITY)
        match = ([i for i, a in enumerate(plan.algos) if bytes(a) == bytes(want)]
                 or [i for i, a in enumerate(plan.algos) if _attributes(a, _IDENTITY) == same])
        if match:
            plan.chosen, plan.tuned, plan.from_record = match[0], True, True
            _tuned.append(plan)
    if _autotune and not plan.tuned and not _capturing(stream_ptr):
        if len(plan.algos) > 1:
            _tune(plan, launch, c_ptr, ldc, beta, stream_ptr)
        else:
            plan.tuned = True
            _tuned.append(plan)
    _check(launch(plan.algos[plan.chosen if _autotune else 0], c_ptr), "cublasLtMatmul")
    return True
