"""A/B of two flag files over paired seeds: raw Q-mean drift, atom utilization, test return, rate.

Trains each (flag file, seed) with the file's run settings and plugins, pausing at ``--points``
evenly spaced steps to evaluate the greedy policy on the held-out test split (evaluation uses its
own seeded RNG, so the training trajectory is the one of an uninterrupted run), and prints a
Markdown table: one row per stage and seed, a mean row per stage, and the paired difference
B − A of the final test return with its mean and the range over seeds::

    python benchmarks/ab_stages.py flags/stage-00-baseline.yaml flags/stage-02-atom-entropy.yaml \\
        --seeds 0 1 2 3 4 --points 3 --jobs 2 --json ab.json

``--jobs`` trains that many runs at once in separate processes (each single-threaded BLAS); the
updates/s column is each run's own training rate, so compare it only between runs made with the
same ``--jobs`` on the same machine.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

KEYS = ("raw_q_drift", "atom_utilization", "eval_return")


def run_one(path: Path, seed: int, points: int, device: str | None) -> dict[str, Any]:
    """Train one (flag file, seed) pair, evaluating on the test split at ``points`` steps."""
    from foxhunt_core.flags import load_flags
    from foxhunt_core.trainer import Trainer

    f = load_flags(path)
    update: dict[str, Any] = {"seed": seed}
    if device is not None:
        update["device"] = device
    settings = f.settings.model_copy(update=update)
    tr = Trainer(settings, f.registry.plugin_set(f.enabled), None, options=f.option_models)
    steps = settings.train.steps
    marks = [round(steps * (i + 1) / points) for i in range(points)]
    rows, t0, train_s = [], time.perf_counter(), 0.0
    for m in marks:
        t1 = time.perf_counter()
        tr.train(until_step=m)
        train_s += time.perf_counter() - t1
        rec = tr.history[-1]
        ret = tr.evaluate("test")["policy"]["total_return"]
        rows.append({"step": m, "raw_q_drift": rec["raw_q_drift"], "atom_utilization": rec["atom_utilization"],
                     "eval_return": ret})
    return {"flags": str(path), "stage": f.stage, "seed": seed, "plugins": f.enabled, "points": rows,
            "seconds": time.perf_counter() - t0, "updates_per_second": steps / train_s, "device": tr.device}


def _cells(points: list[dict[str, float]], rate: float) -> list[str]:
    return ([f"{p['raw_q_drift']:+.3f}" for p in points] + [f"{p['atom_utilization']:.3f}" for p in points]
            + [f"{p['eval_return']:+.4f}" for p in points] + [f"{rate:.1f}"])


def table(results: list[dict[str, Any]], labels: tuple[str, str]) -> str:
    """The Markdown table of an A/B (``results`` of both files, ``labels`` their names)."""
    steps = [p["step"] for p in results[0]["points"]]
    head = ["stage", "seed"] + [f"{k}@{s}" for k in ("drift", "util", "return") for s in steps] + ["updates/s"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        out.append("| " + " | ".join([str(r["stage"]), str(r["seed"])] + _cells(r["points"], r["updates_per_second"]))
                   + " |")
    for label in labels:
        rs = [r for r in results if r["flags"] == label]
        mean = [{k: float(np.mean([r["points"][i][k] for r in rs])) for k in KEYS} for i in range(len(steps))]
        rate = float(np.mean([r["updates_per_second"] for r in rs]))
        out.append("| " + " | ".join([f"**{rs[0]['stage']}**", "mean"] + _cells(mean, rate)) + " |")
    a = {r["seed"]: r for r in results if r["flags"] == labels[0]}
    b = {r["seed"]: r for r in results if r["flags"] == labels[1]}
    seeds = sorted(set(a) & set(b))
    if seeds:
        d = np.array([b[s]["points"][-1]["eval_return"] - a[s]["points"][-1]["eval_return"] for s in seeds])
        rate = np.array([b[s]["updates_per_second"] / a[s]["updates_per_second"] for s in seeds])
        out.append("")
        out.append(f"Paired by seed ({len(seeds)} seeds), B − A of the final test return: mean {d.mean():+.4f}, "
                   f"range {d.min():+.4f} .. {d.max():+.4f}, B better in {int((d > 0).sum())} of {len(seeds)}; "
                   f"updates/s B / A: median {np.median(rate):.3f}.")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("flags", nargs=2, type=Path, help="Flag files A and B.")
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4], help="Run seeds (paired across A and B).")
    ap.add_argument("--points", type=int, default=1, help="Evaluation points over training.")
    ap.add_argument("--jobs", type=int, default=1, help="Runs trained at once, each in its own process.")
    ap.add_argument("--device", choices=("auto", "cpu", "cuda"), default=None, help="Override the files' device.")
    ap.add_argument("--json", type=Path, default=None, help="Also write the raw results here.")
    args = ap.parse_args()
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    jobs = [(path, seed) for path in args.flags for seed in args.seeds]
    results: list[dict[str, Any]] = []
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = [pool.submit(run_one, p, s, args.points, args.device) for p, s in jobs]
        for (path, seed), fut in zip(jobs, futures):
            r = fut.result()
            print(f"# {path.name} seed {seed}: {r['seconds']:.0f}s on {r['device']}", flush=True)
            results.append(r)
            if args.json is not None:
                args.json.write_text(json.dumps(results, indent=1))
    print(table(results, (str(args.flags[0]), str(args.flags[1]))))


if __name__ == "__main__":
    main()
