"""Does a trained post-attention stage learn? Its auxiliary loss trained against frozen, paired.

For each seed: the same start and the same batches (a random-policy replay) with the plugin's
parameters trained and kept at the init (``foxhunt_core.testing.learning``); prints the
differences trained - frozen of the auxiliary loss (negative: the trained arm is lower) over the
whole run, its second half, its last quarter and on held-out batches after it, as Markdown::

    python benchmarks/stage_learns.py graph_message --seeds 0 1 2 3 --steps 600 --warmup 3000
    python benchmarks/stage_learns.py diffusion_refine --with graph_message --seeds 0 1 2 3
"""

from __future__ import annotations

import argparse
import os

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("plugin", help="The plugin whose parameters are trained or frozen.")
    ap.add_argument("--with", dest="others", nargs="*", default=[], help="Other plugins enabled in both arms.")
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3])
    ap.add_argument("--steps", type=int, default=600, help="Updates per arm.")
    ap.add_argument("--warmup", type=int, default=3000, help="Random-policy transitions in the replay.")
    args = ap.parse_args()
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    from foxhunt_core.config import RunSettings
    from foxhunt_core.plugins import discover
    from foxhunt_core.testing.learning import trained_and_frozen

    reg = discover()
    names = [n for n in reg.rollout_order() if n in set(args.others) | {args.plugin}]
    print(f"{args.plugin} (enabled: {', '.join(names)}), {args.steps} updates of 64 from {args.warmup} "
          "random-policy transitions; auxiliary loss trained - frozen\n")
    print("| seed | whole run | second half | last quarter | held-out after | frozen: whole run | "
          "largest parameter change |\n|---|---|---|---|---|---|---|")
    for seed in args.seeds:
        s = RunSettings.model_validate({
            "seed": seed, "device": "cpu", "market": {"bars": 4000}, "env": {"num_envs": 8, "episode_len": 64},
            "net": {"shared_h1": 32, "shared_h2": 32, "adv_h": 16, "num_atoms": 11, "attn_dim": 4,
                    "v_min": -2.0, "v_max": 8.0},
            "train": {"steps": args.steps, "batch_size": 64, "warmup_steps": args.warmup, "lr": 1e-3,
                      "target_sync_every": 50, "replay_capacity": max(10000, args.warmup),
                      "checkpoint_every": 10**6}})
        r = trained_and_frozen(s, reg, names, args.plugin, steps=args.steps, batch_size=64)
        a, b = r["trained"], r["frozen"]
        n = len(a.aux)
        d = [np.mean(a.aux[i:]) - np.mean(b.aux[i:]) for i in (0, n // 2, 3 * n // 4)]
        print(f"| {seed} | {d[0]:+.4f} | {d[1]:+.4f} | {d[2]:+.4f} | {a.held_out - b.held_out:+.4f} | "
              f"{np.mean(b.aux):.4f} | {a.moved:.3f} |", flush=True)


if __name__ == "__main__":
    main()
