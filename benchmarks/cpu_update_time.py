"""CPU time of one training update under two flag files, interleaved (NumPy backend).

    python benchmarks/cpu_update_time.py A.yaml B.yaml [--rounds 25] [--updates 20]

Builds both agents from the files' run settings and plugins, then alternates: ``--updates``
updates of A on one fixed random batch of the files' batch size, the same for B, ``--rounds``
times. Reports the median and the fastest round per update, in process CPU time (less sensitive
than wall time to other work on a shared machine), and B / A of both.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("flags", nargs=2, type=Path, help="Flag files A and B.")
    ap.add_argument("--rounds", type=int, default=25)
    ap.add_argument("--updates", type=int, default=20)
    args = ap.parse_args()
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

    from foxhunt_core.agent import Agent
    from foxhunt_core.flags import load_flags

    agents = []
    for path in args.flags:
        f = load_flags(path)
        agents.append(Agent(f.settings, f.registry.plugin_set(f.enabled), np, np.random.default_rng(0),
                            options=f.option_models))
        rows = f.settings.train.batch_size
    rng = np.random.default_rng(1)
    S = agents[0].settings.net.state_dim
    batch = {"obs": rng.normal(size=(rows, S)).astype(np.float32),
             "next_obs": rng.normal(size=(rows, S)).astype(np.float32),
             "action": rng.integers(0, 3, size=(rows, agents[0].num_branches)),
             "reward": rng.normal(size=rows).astype(np.float32), "terminal": np.zeros(rows, np.float32)}
    times: list[list[float]] = [[], []]
    for _ in range(args.rounds):
        for i, agent in enumerate(agents):
            t = time.process_time()
            for _ in range(args.updates):
                agent.update(batch, 0.001)
            times[i].append((time.process_time() - t) / args.updates * 1e3)
    med = [statistics.median(t) for t in times]
    low = [min(t) for t in times]
    for path, m, lo in zip(args.flags, med, low):
        print(f"{path}: {m:.2f} ms per update (median of {args.rounds} rounds), fastest round {lo:.2f} ms")
    print(f"batch {rows}; B / A: median {med[1] / med[0]:.3f}, fastest rounds {low[1] / low[0]:.3f}")


if __name__ == "__main__":
    main()
