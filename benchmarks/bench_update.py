"""Updates per second of foxhunt's training step on the GPU against its PyTorch peer.

    python benchmarks/bench_update.py [--batches 4096 16384 65536] [--repeats 50] [--json out.json]
        [--foxhunt VARIANT ...] [--torch KIND ...] [--max-autotune B ...] [--stack-max N] [--flags FILE ...]
        [--tanh-gate] [--q-in-line]

In one run on one GPU, for each batch size:

* ``foxhunt``: the CUDA-graph replay of foxhunt's update (foxhunt_core.graphs.GraphedUpdate) with
  the default settings (``train.gemm_autotune``: cuBLASLt's candidate algorithms timed per GEMM
  shape during the warm-up, the fastest kept);
* ``foxhunt heuristic``: the same with every GEMM on the heuristic's first algorithm;
* ``foxhunt eager``: the same update launched kernel by kernel (for the graph's share);
* ``foxhunt gemmex``: the graph replay with every GEMM through ``cublasGemmEx`` instead of
  cuBLASLt (no fused epilogues; for cuBLASLt's share);
* ``foxhunt 1 stream``: the graph replay with everything on one stream (no weight gradients
  beside the input gradients, no target forward beside the online ones; for the side stream's
  share);
* ``foxhunt Q in line``: the graph replay with the Q pipeline at s (attention, post-attention
  stages, the auxiliary loss and their backward) after the network's backward on the main stream,
  not beside it on a stream of its own (for that stream's share; ``--q-in-line`` does the same for
  each ``--flags`` file);
* ``foxhunt cublas glu``: the graph replay with the GLUs and the advantage heads through cuBLAS
  (and ``glu_forward``) where they run as ``glu_gemm`` and ``linear_gemm`` (for their share);
* ``foxhunt heads apart``, ``foxhunt relu apart``, ``foxhunt dq apart``: the graph replay with
  the dueling forward after the heads' GEMM, the trunk's ReLU backward after cuBLAS's GEMMs, or
  the direction-Q columns' gradient as a product of its own (each where the default runs it
  inside a kernel's epilogue; for that kernel's share);
* ``foxhunt glu 3 stages``: the graph replay with ``glu_gemm``'s ring of three stages and the
  whole tile's h staged at once (the arrangement before its fourth stage); ``foxhunt pv from
  registers``: with ``glu_gemm`` storing the pre-activations it keeps from the registers rather
  than through its staging buffer by TMA; ``foxhunt dz apart``: with z's gradient as one GEMM per
  GLU group rather than one for all;
* ``torch eager``, ``torch compile``, ``torch graph`` (a hand-captured ``torch.cuda.graph`` of
  the whole step: forward, backward, clipping, Adam) and ``torch compile+graph`` (the compiled
  loss inside a hand-captured graph), from benchmarks/torch_peer.py, which computes the same loss
  and gradients (benchmarks/check_peer.py checks it); and, at the sizes of ``--max-autotune``,
  ``torch max-autotune+graph``: compiled with ``mode="max-autotune-no-cudagraphs"`` (Inductor
  times Triton GEMM templates, with fused epilogues, against cuBLAS per shape: PyTorch's
  counterpart of foxhunt's GEMM autotuning) inside a hand-captured graph;
* ``foxhunt FLAGS`` for each ``--flags`` file: the captured update of that flag set (its plugin
  stages and its run settings' network, TF32 and GEMM tuning as stage 0's) at the same batch
  sizes, beside stage 0 in the same run, with its ratio to stage 0 and the stages its execution
  plan puts on the slow path;
* ``foxhunt + tanh_gate`` with ``--tanh-gate``: stage 0 with the tests' tanh gate
  (``tests/hook_plugins.py``; its CUDA fragment ``tests/tanh_gate.cuh``), a gate with a parameter
  per unit, beside stage 0 with its ratio;
* the same four (and max-autotune) ``tuned``: ``PeerNet(tuned=True)`` (the same function with
  its unaligned layers zero-padded and the attention as fused broadcast products) and Adam as
  one fused kernel.

The ratio is against the fastest PyTorch variant of the row. ``--foxhunt`` and ``--torch`` pick
the variants to time.

Network: the stage-0 shapes (trunk 256/256, adv_h 256, 51 atoms, 4 branches of 3). TF32 on for
both. Times are medians over ``repeats`` timed with CUDA events after warm-up; TFLOP/s counts
the GEMM FLOPs of an update (3 forward passes and one backward) against a TF32 GEMM ceiling
measured in the same run at the update's largest GEMM shape.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

os.environ.setdefault("CUPY_TF32", "1")
sys.path.insert(0, str(Path(__file__).parent))

import numpy as np  # noqa: E402


def gemm_flops(net, B: int) -> float:
    """GEMM FLOPs of one update: forward on s (online), s' (online and target), backward on s."""
    S, H1, H2, A, N = net.state_dim, net.shared_h1, net.shared_h2, net.adv_h, net.num_atoms
    sizes = net.branch_sizes
    fwd = S * H1 + H1 * H2 + H2 * H2 + H2 * N
    for d, n in enumerate(sizes):
        k = H2 + (sizes[0] if d == 1 else 0)
        fwd += 2 * k * A + A * n * N
    first_dx = S * H1  # the input needs no gradient
    return 2.0 * B * (3 * fwd + 2 * fwd - first_dx)


def random_batch(B: int, seed: int = 1, net: Any = None) -> dict:
    """A replay batch of ``B`` random transitions on the device, of the network settings ``net``'s
    shapes (default: stage 0's)."""
    import cupy as cp

    from foxhunt_core.config import NetSettings

    net = net or NetSettings()
    rng = np.random.default_rng(seed)
    sizes = np.asarray(net.branch_sizes)
    return {
        "obs": cp.asarray(rng.normal(size=(B, net.state_dim)), dtype=cp.float32),
        "next_obs": cp.asarray(rng.normal(size=(B, net.state_dim)), dtype=cp.float32),
        "action": cp.asarray(rng.integers(0, 1 << 30, size=(B, len(sizes))) % sizes),
        "reward": cp.asarray(rng.normal(size=B), dtype=cp.float32),
        "terminal": cp.zeros(B, dtype=cp.float32),
    }


def time_cuda(fn, repeats: int, sync) -> list[float]:
    import cupy as cp

    out = []
    for _ in range(repeats):
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        out.append(cp.cuda.get_elapsed_time(start, stop))
    sync()
    return out


# bench_foxhunt's arguments of each foxhunt variant; "plan": overrides of the execution plan
# (foxhunt_core.net.fused.plan.Knobs)
FOXHUNT_VARIANTS = {
    "foxhunt": dict(graphs=True, tune=True),
    "foxhunt heuristic": dict(graphs=True),
    "foxhunt eager": dict(graphs=False, tune=True),
    "foxhunt gemmex": dict(graphs=True, lt=False),
    "foxhunt 1 stream": dict(graphs=True, tune=True, plan=dict(side_stream=False)),
    "foxhunt Q in line": dict(graphs=True, tune=True, plan=dict(q_stream=False)),
    "foxhunt cublas glu": dict(graphs=True, tune=True, plan=dict(glu_gemm=False)),
    "foxhunt heads apart": dict(graphs=True, tune=True, plan=dict(heads_dueling=False)),
    "foxhunt relu apart": dict(graphs=True, tune=True, plan=dict(relu_gemm=False)),
    "foxhunt dq apart": dict(graphs=True, tune=True, plan=dict(glu_backward_dq=False)),
    "foxhunt glu 3 stages": dict(graphs=True, tune=True, plan=dict(glu_gemm_config=("ring", 3))),
    "foxhunt pv from registers": dict(graphs=True, tune=True, plan=dict(glu_gemm_config=("pv_tma", False))),
    "foxhunt dz apart": dict(graphs=True, tune=True, plan=dict(joint_dz=False)),
}
# PyTorch variants timed by default; "tuned": torch_peer.PeerNet(tuned=True) and a fused Adam
TORCH_KINDS = ("eager", "compile", "graph", "compile+graph",
               "eager tuned", "compile tuned", "graph tuned", "compile+graph tuned")
MAX_AUTOTUNE_KINDS = ("max-autotune+graph", "max-autotune+graph tuned")  # slow to compile: --max-autotune B


def plan_overrides(plan: dict | None) -> dict:
    """A variant's ``plan`` as the execution plan's knobs (its short forms of glu_gemm's config made
    into a :class:`foxhunt_core.gpu.kernels.GluGemmConfig`)."""
    from foxhunt_core.gpu import kernels as K

    overrides = dict(plan or {})
    if "glu_gemm_config" in overrides:
        kind, arg = overrides["glu_gemm_config"]
        overrides["glu_gemm_config"] = K.GluGemmConfig.ring(arg) if kind == "ring" else K.GluGemmConfig(pv_tma=arg)
    return overrides


def bench_foxhunt(B: int, repeats: int, graphs: bool, lt: bool = True, tune: bool = False,
                  plan: dict | None = None, flags: Any = None, tanh_gate: bool = False) -> float:
    """ms per update; ``lt=False`` sends every GEMM to ``cublasGemmEx``, ``tune=True`` lets
    cuBLASLt time its candidate algorithms per GEMM shape first (during the warm-up), ``plan``
    builds the update's execution plan with these overrides (``side_stream=False``: everything on
    one stream; ``stack_max_rows``: the rows up to which the forwards run stacked; ``glu_gemm``,
    ``heads_dueling``, ``relu_gemm``, ``glu_backward_dq``, ``joint_dz`` False: the GLUs and heads
    through cuBLAS, the dueling forward after the heads' GEMM, the trunk's ReLU backward after
    cuBLAS's GEMMs, the direction-Q columns' gradient as a product of its own, z's gradient one
    GEMM per GLU group; ``glu_gemm_config``: ``("ring", 3)`` for glu_gemm's ring of three stages
    with the whole tile's h staged for one hand-off to the TMA unit, ``("pv_tma", False)`` for the
    pre-activations it keeps stored from the registers rather than by TMA); ``flags`` a loaded flag
    file (:func:`foxhunt_core.flags.load_flags`) whose plugin stages and network the agent takes
    (default: stage 0, the default settings); ``tanh_gate`` adds the tests' tanh gate to stage 0."""
    from foxhunt_core.gpu import cublaslt

    overrides = plan_overrides(plan)
    cublaslt.set_enabled(lt)
    was = cublaslt.autotune_enabled()
    cublaslt.set_autotune(tune)
    try:
        return _bench_foxhunt(B, repeats, graphs, overrides, flags, tanh_gate)
    finally:
        cublaslt.set_enabled(True)
        cublaslt.set_autotune(was)


SLOW_PATHS: dict[str, list[str]] = {}  # flag file -> its plan's stages on the slow path (for the report)


def _bench_foxhunt(B: int, repeats: int, graphs: bool, plan: dict, flags: Any, tanh_gate: bool = False) -> float:
    import cupy as cp

    from foxhunt_core.agent import Agent
    from foxhunt_core.config import RunSettings
    from foxhunt_core.graphs import GraphedUpdate
    from foxhunt_core.plugins import PluginSet, discover

    if flags is None:
        settings, plugins, options = RunSettings(), PluginSet(), {}
        if tanh_gate:
            sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
            from foxhunt_core.plugins import LoadedPlugin
            from hook_plugins import TanhGatePlugin

            plugins = PluginSet([LoadedPlugin("tanh_gate", 5, TanhGatePlugin())])
    else:
        settings = flags.settings
        plugins, options = (flags.registry or discover()).plugin_set(flags.enabled), flags.option_models
    agent = Agent(settings, plugins, cp, np.random.default_rng(0), options=options, plan_overrides=plan)
    if tanh_gate:
        SLOW_PATHS["tanh_gate"] = [f"{st.hook} {st.name}: {st.why}" for st in agent.plan.stages if st.path == "slow"]
    if flags is not None:
        SLOW_PATHS[str(flags.path)] = [f"{st.hook} {st.name}: {st.why}" for st in agent.plan.stages
                                       if st.path == "slow"]
    batch = random_batch(B, net=settings.net)
    coeff = cp.asarray(0.001, dtype=cp.float32)
    if graphs:
        g = GraphedUpdate(agent, B)
        g.load_batch(batch)
        fn = g.replay
    else:
        def fn():
            agent.update(batch, coeff)
    for _ in range(5):
        fn()
    cp.cuda.Device().synchronize()
    return statistics.median(time_cuda(fn, repeats, cp.cuda.Device().synchronize))


def torch_step(B: int, kind: str) -> tuple[Any, Any, Any]:
    """The PyTorch peer's update for a ``kind`` of :data:`TORCH_KINDS` / :data:`MAX_AUTOTUNE_KINDS`:
    ``(step, eager, opt)``, ``step`` without zeroing the gradients (for a graph capture),
    ``eager`` with it."""
    import torch
    from torch_peer import PeerNet, loss_fn, make_batch

    torch.backends.cuda.matmul.allow_tf32 = True
    torch.manual_seed(0)
    kind, tuned = kind.removesuffix(" tuned"), kind.endswith(" tuned")
    net, tgt = PeerNet(tuned=tuned).cuda(), PeerNet(tuned=tuned).cuda()
    tgt.load_state_dict(net.state_dict())
    # tuned: also Adam as one fused kernel (multi-tensor 'foreach' kernels otherwise)
    opt = torch.optim.Adam(net.parameters(), lr=3e-4, capturable=kind.endswith("graph"), fused=tuned or None)
    batch = make_batch(B, "cuda")
    if kind.startswith("max-autotune"):
        lf = torch.compile(loss_fn, mode="max-autotune-no-cudagraphs")
    else:
        lf = torch.compile(loss_fn) if "compile" in kind else loss_fn
    params = list(net.parameters())

    def step():
        loss = lf(net, tgt, batch)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 10.0)
        opt.step()

    def eager():
        opt.zero_grad(set_to_none=True)
        step()

    return step, eager, opt


def bench_torch(B: int, repeats: int, kind: str) -> float:
    import torch

    step, eager, opt = torch_step(B, kind)
    graph = kind.removesuffix(" tuned").endswith("graph")
    if graph:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(5):
                eager()
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        opt.zero_grad(set_to_none=True)
        with torch.cuda.graph(g):
            step()
        fn = g.replay
    else:
        fn = eager
    return statistics.median(time_torch(fn, repeats, warmup=10))


def time_torch(fn, repeats: int, warmup: int = 3) -> list[float]:
    """ms of each of ``repeats`` calls of ``fn``, timed with torch CUDA events after ``warmup`` calls."""
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return times


def gemm_ceiling(B: int, k: int, n: int, repeats: int) -> float:
    """TF32 TFLOP/s of cupy.matmul at [B, k] x [k, n]."""
    import cupy as cp

    a = cp.random.standard_normal((B, k), dtype=cp.float32)
    b = cp.random.standard_normal((k, n), dtype=cp.float32)
    for _ in range(5):
        a @ b
    ms = statistics.median(time_cuda(lambda: a @ b, repeats, cp.cuda.Device().synchronize))
    return 2.0 * B * k * n / (ms * 1e-3) / 1e12


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, nargs="+", default=[4096, 16384, 65536])
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--skip-torch", action="store_true")
    ap.add_argument("--max-autotune", type=int, nargs="*", default=[16384, 65536],
                    help="batch sizes that also time torch.compile's max-autotune mode (slow to compile)")
    ap.add_argument("--foxhunt", nargs="+", default=list(FOXHUNT_VARIANTS), choices=list(FOXHUNT_VARIANTS),
                    metavar="VARIANT", help="foxhunt variants to time (default: all; 'foxhunt' is always timed)")
    ap.add_argument("--torch", nargs="*", default=list(TORCH_KINDS), choices=[*TORCH_KINDS, *MAX_AUTOTUNE_KINDS],
                    metavar="KIND", help="PyTorch variants to time at every batch size (default: %(default)s; "
                    f"also {', '.join(MAX_AUTOTUNE_KINDS)})")
    ap.add_argument("--stack-max", type=int, default=None,
                    help="also time foxhunt with its forwards stacked up to this many rows "
                         "(a 'foxhunt stack<=N' column)")
    ap.add_argument("--flags", type=Path, nargs="+", default=[], metavar="FILE",
                    help="also time the captured update of each flag set (its stages and network), beside stage 0 "
                         "(a 'foxhunt FILE' column each)")
    ap.add_argument("--tanh-gate", action="store_true",
                    help="also time stage 0 with the tests' tanh gate (its CUDA fragment), beside stage 0")
    ap.add_argument("--q-in-line", action="store_true",
                    help="also time each flag set with its Q pipeline at s after the network's backward on the "
                         "main stream (the plan's q_stream off; a 'foxhunt FILE (Q in line)' column each)")
    ap.add_argument("--q-late", action="store_true",
                    help="also time each flag set with its Q pipeline's forward at s forking after the loss "
                         "kernel, not beside the bootstrap (the plan's q_early off; a 'foxhunt FILE (Q late)' "
                         "column each)")
    args = ap.parse_args()
    from foxhunt_core.flags import FlagError, load_flags

    flag_sets = {}
    for path in args.flags:
        try:
            flag_sets[f"foxhunt {path.stem}"] = load_flags(path)
        except FlagError as exc:
            print(exc, file=sys.stderr)
            return 2
    import cupy as cp

    from foxhunt_core.config import NetSettings
    from foxhunt_core.gpu import cublas

    cublas.set_tf32(True)
    net = NetSettings()
    dev = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
    rows = []
    for B in args.batches:
        res = {"batch": B}
        res["foxhunt"] = bench_foxhunt(B, args.repeats, graphs=True, tune=True)
        for v in args.foxhunt:
            if v != "foxhunt":
                res[v] = bench_foxhunt(B, args.repeats, **FOXHUNT_VARIANTS[v])
        if args.stack_max is not None:
            res[f"foxhunt stack<={args.stack_max}"] = bench_foxhunt(B, args.repeats, graphs=True, tune=True,
                                                                   plan=dict(stack_max_rows=args.stack_max))
        if args.tanh_gate:
            col = "foxhunt + tanh_gate"
            res[col] = bench_foxhunt(B, args.repeats, graphs=True, tune=True, tanh_gate=True)
            print(f"B={B} {col}: {res[col]:.3f} ms ({res[col] / res['foxhunt']:.3f}x stage 0)", file=sys.stderr,
                  flush=True)
        for col, f in flag_sets.items():
            res[col] = bench_foxhunt(B, args.repeats, graphs=True, tune=True, flags=f)
            print(f"B={B} {col}: {res[col]:.3f} ms ({res[col] / res['foxhunt']:.3f}x stage 0)", file=sys.stderr,
                  flush=True)
            for on, tag, plan in ((args.q_in_line, "Q in line", dict(q_stream=False)),
                                  (args.q_late, "Q late", dict(q_early=False))):
                if on:
                    c = f"{col} ({tag})"
                    res[c] = bench_foxhunt(B, args.repeats, graphs=True, tune=True, flags=f, plan=plan)
                    print(f"B={B} {c}: {res[c]:.3f} ms ({res[c] / res['foxhunt']:.3f}x stage 0)", file=sys.stderr,
                          flush=True)
        if not args.skip_torch:
            kinds = list(args.torch)
            kinds += [k for k in MAX_AUTOTUNE_KINDS if k not in kinds] if B in args.max_autotune else []
            for kind in kinds:
                try:
                    res[f"torch {kind}"] = bench_torch(B, args.repeats, kind)
                    print(f"B={B} torch {kind}: {res[f'torch {kind}']:.3f} ms", file=sys.stderr, flush=True)
                except Exception as exc:  # noqa: BLE001 - report the failure in the table
                    print(f"torch {kind} at B={B} failed: {type(exc).__name__}: {exc}", file=sys.stderr)
                    res[f"torch {kind}"] = float("nan")
        res["gemm_tflops"] = gemm_flops(net, B) / (res["foxhunt"] * 1e-3) / 1e12
        res["ceiling_tflops"] = gemm_ceiling(B, net.shared_h1, 2 * net.adv_h, args.repeats)
        rows.append(res)
        print(json.dumps(res), flush=True)
    name = dev["name"].decode() if isinstance(dev["name"], bytes) else dev["name"]
    print(f"\nGPU: {name}; ms per update (median of {args.repeats}); ratio = strongest torch / foxhunt")
    stacked = [f"foxhunt stack<={args.stack_max}"] if args.stack_max is not None else []
    gated = ["foxhunt + tanh_gate"] if args.tanh_gate else []
    in_line = [f"{c} (Q in line)" for c in flag_sets] if args.q_in_line else []
    cols = [*FOXHUNT_VARIANTS, *stacked, *gated, *flag_sets, *in_line,
            *(f"torch {k}" for k in (*TORCH_KINDS, *MAX_AUTOTUNE_KINDS))]
    cols = [c for c in cols if any(c in r for r in rows)]
    print("| B | " + " | ".join(cols) + " | speed-up vs strongest torch | GEMM TFLOP/s (ceiling) |")
    print("|---" * (len(cols) + 3) + "|")
    for r in rows:
        torch_best = min((r[c] for c in cols if c.startswith("torch") and r.get(c, float("nan")) == r.get(c)),
                         default=float("nan"))
        ratio = torch_best / r["foxhunt"]
        print(f"| {r['batch']} | " + " | ".join(f"{r[c]:.3f}" if c in r else "-" for c in cols)
              + f" | {ratio:.2f}x | {r['gemm_tflops']:.0f} ({r['ceiling_tflops']:.0f}) |")
    if flag_sets or gated:
        print("\nflag sets against stage 0 in the same run (ms per update, ratio):")
        print("| flag set | " + " | ".join(f"B = {r['batch']}" for r in rows) + " |")
        print("|---" * (len(rows) + 1) + "|")
        named = [(c, "tanh_gate") for c in gated] + [(c, str(f.path)) for c, f in flag_sets.items()]
        named += [(f"{c} (Q in line)", str(f.path)) for c, f in flag_sets.items() if args.q_in_line]
        for col, key in named:
            print(f"| {col.removeprefix('foxhunt ')} | "
                  + " | ".join(f"{r[col]:.3f} ({r[col] / r['foxhunt']:.3f}x)" for r in rows) + " |")
            for line in SLOW_PATHS.get(key, []):
                print(f"  slow path: {line}")
    from foxhunt_core.gpu import cublaslt

    tuned = cublaslt.tuning_report()
    changed = [t for t in tuned if t["chosen"] and t["times_ms"]]
    print(f"\ncuBLASLt autotuning ('foxhunt'): {len(tuned)} GEMM shapes, {len(changed)} given another "
          "algorithm than the heuristic's first:")
    for t in changed:  # cuBLASLt's column-major terms: the row-major product is [n, k] @ [k, m]
        stack = f" x{t['batch']}" if t["batch"] > 1 else ""
        print(f"  [{t['n']}, {t['k']}] @ [{t['k']}, {t['m']}]{stack} ops {t['ops']} epilogue {t['epilogue']}: "
              f"{t['first_ms'] * 1e3:.1f} -> {t['best_ms'] * 1e3:.1f} us "
              f"(candidate {t['chosen']} of {t['candidates']})")
    if args.json:
        args.json.write_text(json.dumps({"gpu": name, "rows": rows, "tuning": tuned}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
