"""Per-kernel GPU time of one foxhunt update, from CUPTI through torch.profiler.

    python benchmarks/kernel_table.py [--batch 65536] [--steps 5] [--top 40] [--one-stream]
        [--flags FILE | --tanh-gate]
    python benchmarks/kernel_table.py --torch compile|"compile tuned" [--batch 65536]

The update runs from its CUDA graph is opaque to the profiler, so the profiled steps run eagerly
(same kernels, launch gaps aside). Prints every kernel's total device time per update, grouped
by name, largest first, and the sum. With the side stream (the default) kernels overlap, so the
sum exceeds the step's time; ``--one-stream`` gives each kernel's time alone. ``--flags`` profiles
the update with a flag file's plugin stages and network (as ``bench_update.py --flags``),
``--tanh-gate`` stage 0 with the tests' tanh gate.
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("CUPY_TF32", "1")

import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from bench_update import random_batch, torch_step  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=65536)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--one-stream", action="store_true",
                    help="queue everything on one stream: the side stream's kernels overlap the main stream's, "
                         "which inflates their own device times and makes the sum exceed the step's time")
    ap.add_argument("--torch", choices=["compile", "compile tuned"], default=None,
                    help="profile the PyTorch peer's compiled step instead (benchmarks/torch_peer.py; eager "
                         "launches of the compiled kernels; 'tuned' is PeerNet(tuned=True) with a fused Adam)")
    ap.add_argument("--flags", type=Path, default=None, help="profile the update of this flag set's stages")
    ap.add_argument("--tanh-gate", action="store_true", help="profile stage 0 with the tests' tanh gate")
    args = ap.parse_args()
    if args.torch:
        return torch_table(args)
    import cupy as cp
    import torch
    from torch.profiler import ProfilerActivity, profile

    from foxhunt_core.agent import Agent
    from foxhunt_core.config import RunSettings
    from foxhunt_core.gpu import cublas, cublaslt
    from foxhunt_core.plugins import PluginSet

    cublas.set_tf32(True)
    cublaslt.set_autotune(True)  # the default settings' GEMM algorithms (train.gemm_autotune), tuned in the warm-up
    B = args.batch
    settings, plugins, options = RunSettings(), PluginSet(), {}
    if args.flags is not None:
        from foxhunt_core.flags import load_flags
        from foxhunt_core.plugins import discover

        flags = load_flags(args.flags)
        settings, options = flags.settings, flags.option_models
        plugins = (flags.registry or discover()).plugin_set(flags.enabled)
    elif args.tanh_gate:
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
        from foxhunt_core.plugins import LoadedPlugin
        from hook_plugins import TanhGatePlugin

        plugins = PluginSet([LoadedPlugin("tanh_gate", 5, TanhGatePlugin())])
    agent = Agent(settings, plugins, cp, np.random.default_rng(0), options=options,
                  plan_overrides={"side_stream": not args.one_stream})
    batch = random_batch(B, net=settings.net)
    coeff = cp.asarray(0.001, dtype=cp.float32)
    for _ in range(3):
        agent.update(batch, coeff)
    cp.cuda.Device().synchronize()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(args.steps):
            agent.update(batch, coeff)
        cp.cuda.Device().synchronize()
    print_table(prof, B, args.steps, args.top)
    return 0


def torch_table(args) -> int:
    import torch
    from torch.profiler import ProfilerActivity, profile

    _, step, _ = torch_step(args.batch, args.torch)
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(args.steps):
            step()
        torch.cuda.synchronize()
    print(f"PyTorch peer, torch.{args.torch}:")
    print_table(prof, args.batch, args.steps, args.top)
    return 0


def print_table(prof, B: int, steps: int, top: int) -> None:
    """Each kernel's device time per update, grouped by name, largest first."""
    rows: dict[str, list[float]] = {}
    for ev in prof.events():
        if ev.device_type.name != "CUDA":
            continue
        r = rows.setdefault(ev.name[:90], [0.0, 0])
        r[0] += ev.device_time_total if hasattr(ev, "device_time_total") else ev.cuda_time_total
        r[1] += 1
    total = sum(v[0] for v in rows.values()) / steps
    print(f"B = {B}: device time per update {total / 1e3:.3f} ms in "
          f"{sum(v[1] for v in rows.values()) / steps:.0f} kernels/copies")
    print(f"{'us/update':>10} {'calls':>6}  name")
    for name, (us, n) in sorted(rows.items(), key=lambda kv: -kv[1][0])[:top]:
        print(f"{us / steps:10.1f} {n / steps:6.1f}  {name}")


if __name__ == "__main__":
    raise SystemExit(main())
