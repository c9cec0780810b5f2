"""The README's two learning tables, five seeds each, in one command per table.

    python benchmarks/learning_tables.py real       # S&P 500 daily bars (arch.data.sp500)
    python benchmarks/learning_tables.py synthetic  # the embedded synthetic market's default

Each seed is one ``foxhunt train`` (the stage-0 flag file, on the CPU), run in parallel up to
``--workers``; the script then writes ``<out>/<table>.md``: the test split's total return (and
annualized Sharpe ratio) of the selected policy and of every baseline, the selection verdict,
and the check the README states for the table:

* ``real`` — the selected policy's test return is not below flat's by more than 0.005 (0.5 %
  of max notional) in any seed;
* ``synthetic`` — the policy beats flat, random and linear on the test split in every seed.

``real`` needs the ``arch`` package for the data (``pip install arch``); the series is written to
``<out>/sp500.csv`` first. The exit code is 0 when the check holds in every seed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FLAGS = ROOT / "flags" / "stage-00-baseline.yaml"
POLICIES = ("policy", "flat", "random", "buy_and_hold", "linear", "momentum")


def export_sp500(path: Path) -> Path:
    import arch.data.sp500

    d = arch.data.sp500.load().reset_index()[["Date", "Open", "High", "Low", "Close", "Volume"]]
    d.columns = ["timestamp", "open", "high", "low", "close", "volume"]
    d["timestamp"] = d["timestamp"].dt.strftime("%Y-%m-%d")
    d.to_csv(path, index=False, float_format="%.6f")
    return path


def train(seed: int, out: Path, data: Path | None, steps: int | None, reuse: bool = False) -> dict:
    run = out / f"seed-{seed}"
    if reuse and (run / "eval.json").is_file():
        return json.loads((run / "eval.json").read_text())
    exe = Path(sys.executable).parent / "foxhunt"
    cmd = [str(exe), "train", "--flags", str(FLAGS), "--out", str(run), "--seed", str(seed), "--device", "cpu",
           "--quiet"]
    if data is not None:
        cmd += ["--data", str(data)]
    if steps is not None:
        cmd += ["--steps", str(steps)]
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}
    with open(out / f"seed-{seed}.log", "w") as log:
        subprocess.run(cmd, check=True, stdout=log, stderr=subprocess.STDOUT, env=env)
    return json.loads((run / "eval.json").read_text())


def check(kind: str, rows: dict[str, dict]) -> bool:
    ret = {p: rows[p]["total_return"] for p in POLICIES}
    if kind == "real":
        return ret["policy"] >= ret["flat"] - 0.005
    return all(ret["policy"] > ret[b] for b in ("flat", "random", "linear"))


def table(kind: str, reports: dict[int, dict]) -> tuple[str, bool]:
    first = next(iter(reports.values()))
    head = (f"Test split: {first['bars']} bars of {first['interval']['label']} "
            f"({first['interval']['bars_per_year']:,.0f} a year), {first['step']} updates; "
            f"total return as a fraction of max notional after costs (annualized Sharpe ratio).\n"
            f"Market: {first['market']}. Costs: {first['costs']}.\n\n")
    lines = ["| seed | " + " | ".join(POLICIES) + " | check | selection |",
             "|---|" + "---|" * (len(POLICIES) + 2)]
    ok_all = True
    for seed, rep in sorted(reports.items()):
        rows = rep["policies"]
        ok = check(kind, rows)
        ok_all &= ok
        cells = [f"{rows[p]['total_return']:+.4f} ({rows[p]['sharpe']:+.2f})" for p in POLICIES]
        lines.append(f"| {seed} | " + " | ".join(cells) + f" | {'yes' if ok else 'NO'} | "
                     f"{rep['selection']['verdict']} |")
    rule = ("policy not below flat by more than 0.005 in every seed" if kind == "real"
            else "policy above flat, random and linear in every seed")
    return head + "\n".join(lines) + f"\n\nCheck ({rule}): {'holds' if ok_all else 'FAILS'}.\n", ok_all


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("kind", choices=("real", "synthetic"))
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) // 2))
    ap.add_argument("--steps", type=int, default=None, help="updates per run (default: the flag file's)")
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "tables")
    ap.add_argument("--reuse", action="store_true", help="keep a seed's finished run (its eval.json) instead of "
                    "training it again")
    args = ap.parse_args()
    out = args.out / args.kind
    out.mkdir(parents=True, exist_ok=True)
    data = export_sp500(out / "sp500.csv") if args.kind == "real" else None
    with ThreadPoolExecutor(args.workers) as pool:
        futures = {s: pool.submit(train, s, out, data, args.steps, args.reuse) for s in args.seeds}
        reports = {s: f.result() for s, f in futures.items()}
    text, ok = table(args.kind, reports)
    (args.out / f"{args.kind}.md").write_text(text)
    print(text)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
