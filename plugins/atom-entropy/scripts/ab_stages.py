"""A/B of two flag files over seeds: raw Q-mean drift, atom utilization and evaluation return.

Trains each (flag file, seed) with the file's run settings and plugins, pausing at a few points
to evaluate the greedy policy on the held-out test split (evaluation uses its own seeded RNG, so
the training trajectory is the one of an uninterrupted run), and prints a Markdown table::

    python plugins/atom-entropy/scripts/ab_stages.py flags/stage-00-baseline.yaml \\
        flags/stage-02-atom-entropy.yaml --seeds 0 1 2 --points 3 --json ab.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from foxhunt_core.flags import load_flags
from foxhunt_core.trainer import Trainer


def run_one(path: Path, seed: int, points: int) -> dict[str, Any]:
    f = load_flags(path)
    settings = f.settings.model_copy(update={"seed": seed})
    tr = Trainer(settings, f.registry.plugin_set(f.enabled), None, options=f.option_models)
    steps = settings.train.steps
    marks = [round(steps * (i + 1) / points) for i in range(points)]
    rows, t0 = [], time.perf_counter()
    for m in marks:
        tr.train(until_step=m)
        rec = tr.history[-1]
        ret = tr.evaluate("test")["policy"]["total_return"]
        rows.append({"step": m, "raw_q_drift": rec["raw_q_drift"], "atom_utilization": rec["atom_utilization"],
                     "entropy_coeff": rec["entropy_coeff"], "eval_return": ret})
    return {"flags": str(path), "stage": f.stage, "seed": seed, "plugins": f.enabled, "points": rows,
            "seconds": time.perf_counter() - t0, "device": tr.device}


def table(results: list[dict[str, Any]]) -> str:
    steps = [p["step"] for p in results[0]["points"]]
    head = ["stage", "seed"] + [f"{k}@{s}" for k in ("drift", "util", "return") for s in steps]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def cells(points: list[dict[str, float]]) -> list[str]:
        return ([f"{p['raw_q_drift']:+.3f}" for p in points] + [f"{p['atom_utilization']:.3f}" for p in points]
                + [f"{p['eval_return']:+.4f}" for p in points])

    for r in results:
        out.append("| " + " | ".join([str(r["stage"]), str(r["seed"])] + cells(r["points"])) + " |")
    for stage in sorted({r["stage"] for r in results}):
        rs = [r for r in results if r["stage"] == stage]
        mean = [{k: float(np.mean([r["points"][i][k] for r in rs])) for k in rs[0]["points"][i]}
                for i in range(len(steps))]
        out.append("| " + " | ".join([f"**{stage}**", "mean"] + cells(mean)) + " |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("flags", nargs=2, type=Path, help="Flag files A and B.")
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2], help="Run seeds.")
    ap.add_argument("--points", type=int, default=3, help="Evaluation points over training.")
    ap.add_argument("--json", type=Path, default=None, help="Also write the raw results here.")
    args = ap.parse_args()
    results = []
    for path in args.flags:
        for seed in args.seeds:
            r = run_one(path, seed, args.points)
            print(f"# {path.name} seed {seed}: {r['seconds']:.0f}s on {r['device']}", flush=True)
            results.append(r)
            if args.json is not None:
                args.json.write_text(json.dumps(results, indent=1))
    print(table(results))


if __name__ == "__main__":
    main()
