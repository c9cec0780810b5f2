"""Where glu_gemm's time goes: the kernel timed against diagnostic builds of itself, each with one
part of its epilogue taken out (their outputs are wrong; only their times mean something).

    python benchmarks/glu_gemm_variants.py [--rows 131072] [--repeats 20]

Over ``rows`` rows (the online forwards' 2 B), u's first 256 columns rounded by their writer (as
the network's z comes), h only, for the direction branch (K = 256, the bias in the epilogue,
N = 512) and the three joint branches (K = 260, N = 1536), median µs per call replayed from a
CUDA graph:

- ``kernel``: glu_gemm as the update runs it;
- ``no sigmoid``: the epilogue multiplies gate and value without the sigmoid (its exponential
  and reciprocal);
- ``no TMA store``: h staged in shared memory but never stored;
- ``no staging``: neither staged nor stored (the epilogue's arithmetic only);
- ``no epilogue``: the main loop alone (products, loads and the ring's barriers).

Each variant is the kernel's source with one textual substitution, compiled as the kernel is
(the substitution is checked to apply: the script fails when the source no longer matches).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from bench_stack import graph_us  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "foxhunt_core" / "kernels" / "glu_gemm.cu"

SIGMOID = ("float h0 = gate_value(g0, gate_unit(gate, branch, unit)) * v0;\n"
           "                float h1 = gate_value(g1, gate_unit(gate, branch, unit + 1)) * v1;")
STORE = ('                    asm volatile("st.shared.v2.f32 [%0], {%1, %2};\\n"\n'
         '                                 ::"r"(staged_at(slot, r0 + 8 * half, 8 * j + 2 * q - 32 * b0)), '
         '"f"(v.x), "f"(v.y)\n                                 : "memory");')
EPILOGUE_START = "        // Epilogue (the accumulators' layout"
HAND_OFF = "        auto hand_off = [&](int b0, const TensorMap* map, int c0, auto value) {"
RELEASE = "            staging_release();"

# name: [(old, new), ...] in glu_gemm.cu
VARIANTS: dict[str, list[tuple[str, str]]] = {
    "kernel": [],
    "no sigmoid": [(SIGMOID, "float h0 = g0 * v0, h1 = g1 * v1; (void)unit;")],
    "no TMA store": [("tma_store(map, slot", "if (M < 0) tma_store(map, slot")],
    "no staging": [  # the values summed into one register, stored never
        (STORE, "                    sink += v.x + v.y;"),
        (HAND_OFF, "        float sink = 0.0f;\n" + HAND_OFF),
        (RELEASE, "            if (sink == 1234.5f) h[0] = sink;\n" + RELEASE)],
    "no epilogue": [(EPILOGUE_START, "        if (M > 0) continue;\n" + EPILOGUE_START)],
}


def variant_source(name: str, src: str) -> str:
    for old, new in VARIANTS[name]:
        if src.count(old) != 1:
            raise SystemExit(f"glu_gemm_variants: '{name}': the text to replace occurs {src.count(old)} times in "
                             f"{SOURCE}")
        src = src.replace(old, new)
    return src


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=131072)
    ap.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args()
    import cupy as cp

    from foxhunt_core.gpu import kernels as K

    src = SOURCE.read_text()
    R, H, Wz, Wh = args.rows, 256, 260, 260
    rng = cp.random.default_rng(0)
    u = rng.standard_normal((R, Wz), dtype=cp.float32)
    u[:, :H] = ((u[:, :H].view(cp.uint32) + cp.uint32(0x1000)) & cp.uint32(0xFFFFE000)).view(cp.float32)
    w = rng.standard_normal((Wz, 8 * H), dtype=cp.float32) * 0.05
    h = cp.empty((R, 4 * Wh), cp.float32)
    wd, bd, wj = w[:H, : 2 * H], w[-1, : 2 * H], w[:, 2 * H :]
    wdt, wjt = K.transpose(wd), K.transpose(wj)

    def cases(cfg):
        return [lambda: K.glu_gemm(u[:, :H], wd, bias=bd, width=Wh, h=h[:, :Wh], wt=wdt, rounded=H, config=cfg),
                lambda: K.glu_gemm(u, wj, width=Wh, blocks=3, h=h[:, Wh:], wt=wjt, rounded=H, config=cfg)]

    names = ["direction (K 256, N 512)", "3 branches (K 260, N 1536)"]
    print(f"GPU: {cp.cuda.runtime.getDeviceProperties(0)['name'].decode()}; {R} rows; µs per call "
          f"(median of {args.repeats})")
    print("| variant | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    with tempfile.TemporaryDirectory() as tmp:
        for header in SOURCE.parent.glob("*.cuh"):  # (NVRTC looks for includes beside the source)
            shutil.copy(header, tmp)
        for name in VARIANTS:
            path = Path(tmp) / f"glu_gemm_{name.replace(' ', '_')}.cu"
            path.write_text(variant_source(name, src))
            times = [graph_us(fn, args.repeats) for fn in cases(K.GluGemmConfig(source=str(path)))]
            print(f"| {name} | " + " | ".join(f"{t:.1f}" for t in times) + " |", flush=True)


if __name__ == "__main__":
    main()
