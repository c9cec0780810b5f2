"""Every CUDA source of the core and of the plugins compiles for sm_90 (sm_90a where it says so).

Runs on the CPU-only CI whenever ``nvcc`` is on PATH (skipped otherwise): one test per ``.cu``
file, failing with the compiler's message. ``load_module`` prepends ``#define``s at run time; here
the network's default sizes (``foxhunt_core.gpu.defines.DEFAULT_DEFINES``) are prepended the same
way, and every other shared constant comes from ``kernels/defines.cuh``, the rendering of the table
in ``foxhunt_core/gpu/defines.py`` that the wrappers read too. The kernels are compiled by NVRTC on
the GPU machine, which has no system headers, so no source may ``#include`` one.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from foxhunt_core.backend import ARCH_SPECIFIC
from foxhunt_core.gpu import defines
from foxhunt_core.gpu.defines import DEFAULT_DEFINES
from foxhunt_core.gpu.kernels import GLU_BACKWARD_GEMM_DQ_COLS
from foxhunt_core.gpu.launch import branch_defines

ROOT = Path(__file__).resolve().parent.parent
CORE_SOURCES = sorted((ROOT / "foxhunt_core" / "kernels").glob("*.cu"))
SOURCES = CORE_SOURCES + sorted(ROOT.glob("plugins/*/**/kernels/*.cu"))
NVCC = shutil.which("nvcc")
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH")
# The kernels of one training update take every size from the preamble; compile them for sizes
# other than the defaults too: fewer atoms than a warp, three uneven branches, wider attention.
SIZE_GENERIC = ("adam", "attention", "boltzmann", "c51_loss", "dueling", "elementwise", "qstats")
# 21 atoms, branches of 2, 3 and 2 actions, advantage blocks padded to 4 floats (44, 64, 44).
OTHER_DEFINES = {**branch_defines((0, 2, 5, 7), 21, head_align=4), "ATTN_DIM": "16"}


def _rel(p: Path) -> str:
    return str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else str(p)


def _compile(cu: Path, defines: dict[str, str], tmp: Path, cubin: bool = False, include: tuple[str, ...] = ()) -> str:
    """Compile ``cu`` as load_module does: the defines as a ``#define`` preamble before the source.
    Returns the compiler's messages (with ``cubin``, through ptxas with its resource report).

    (A ``-DNAME=value`` flag cannot carry ``BRANCH_OFFSETS={0,3,...}``: nvcc splits option values
    at commas.) ``#line`` keeps the compiler's messages pointing into the original file.
    """
    preamble = "".join(f"#define {k} {v}\n" for k, v in defines.items())
    src = tmp / cu.name
    src.write_text(f'{preamble}#line 1 "{cu}"\n{cu.read_text()}')
    arch = "sm_90a" if ARCH_SPECIFIC in cu.read_text() else "sm_90"  # as load_module picks it
    out = ["-cubin", "-Xptxas", "-v"] if cubin else ["-ptx"]
    out += ["-o", str(tmp / f"{cu.stem}.{out[0][1:]}")]
    cmd = [NVCC, *out, f"-arch={arch}", "-std=c++17", f"-I{cu.parent}", *(f"-I{d}" for d in include), str(src)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if res.returncode != 0:
        pytest.fail(f"{_rel(cu)} does not compile for {arch} with {defines}:\n{res.stderr}{res.stdout}")
    return res.stderr + res.stdout


@needs_nvcc
@pytest.mark.parametrize("cu", SOURCES, ids=_rel)
def test_compiles_for_sm90(cu: Path, tmp_path: Path) -> None:
    _compile(cu, DEFAULT_DEFINES, tmp_path)


@needs_nvcc
def test_update_kernels_compile_for_other_sizes(tmp_path: Path) -> None:
    for cu in (p for p in CORE_SOURCES if p.stem in SIZE_GENERIC):
        _compile(cu, OTHER_DEFINES, tmp_path)


def _gate_fragments() -> dict[str, object]:
    sys.path.insert(0, str(ROOT / "tests"))
    try:
        from hook_plugins import TanhGateStage
    finally:
        sys.path.remove(str(ROOT / "tests"))
    from foxhunt_kan_gate.spline import Grid
    from foxhunt_kan_gate.stage import KanGateStage

    return {"tanh_gate": TanhGateStage.fragment, "kan_gate": KanGateStage().fragment,
            "kan_gate 12 bases": KanGateStage(grid=Grid(num_bases=12)).fragment}


@needs_nvcc
@pytest.mark.parametrize("gate", ["tanh_gate", "kan_gate", "kan_gate 12 bases"])
def test_gate_fragments_compile_into_the_glu_kernels(gate: str, tmp_path: Path) -> None:
    """A gate's fragment as the launch wrappers compile it in (GateLaunch.compile_options): into
    glu_gemm's and glu_backward_gemm's epilogues and gate_glu.cu's kernels. glu_backward_gemm takes
    up to GB_GATE_TERMS_MAX terms (a wider gate is refused by its static_assert, and the plan sends
    its backward to gate_glu_backward)."""
    from foxhunt_core.gpu.gate import GateLaunch

    fragment = _gate_fragments()[gate]
    defs, include = GateLaunch(fragment).compile_options()
    defs = {**DEFAULT_DEFINES, **{k: str(v) for k, v in defs.items()}}
    kernels = ROOT / "foxhunt_core" / "kernels"
    _compile(kernels / "glu_gemm.cu", {**defs, "GW_WIDE": "1"}, tmp_path, include=include)  # (as it launches)
    _compile(kernels / "gate_glu.cu", defs, tmp_path, include=include)
    if fragment.terms <= defines.value("GB_GATE_TERMS_MAX"):
        _compile(kernels / "glu_backward_gemm.cu", defs, tmp_path, include=include)


@pytest.mark.parametrize("cu", SOURCES, ids=_rel)
def test_sources_suit_nvrtc(cu: Path) -> None:
    """Only local includes (NVRTC has no system headers; load_module passes the kernel's folder as
    an include path)."""
    includes = re.findall(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]', cu.read_text(), flags=re.M)
    missing = [h for h in includes if not (cu.parent / h).is_file()]
    assert not missing, f"{_rel(cu)} includes headers that are not beside it: {missing}"


def test_the_kernels_shared_constants_are_the_tables() -> None:
    """kernels/defines.cuh is the rendering of the table that the wrappers read
    (``python -m foxhunt_core.gpu.defines`` writes it)."""
    assert defines.HEADER.read_text() == defines.render_header(), "run python -m foxhunt_core.gpu.defines"
    assert DEFAULT_DEFINES == {n: str(defines.TABLE[n].value) for n in defines.NETWORK}


# linear_gemm.cu's dueling warps (heads_dueling) for the layouts of its GPU tests: eight lanes per
# row holding 7 atoms each of the default, 3 of 21 atoms, 8 of 64, 13 of 101 (single-action
# branches), 5 of 33 (branches of 4 actions) and 2 of 11 (branches of 12: 24 values per lane).
DUELING_LAYOUTS = [{"LG_DUELING": "1", **branch_defines(offs, n, head_align=4)}
                   for n, offs in ((51, (0, 3, 6, 9, 12)), (21, (0, 2, 4, 6)), (64, (0, 2, 4)), (101, (0, 1, 2, 3)),
                                   (33, (0, 4, 8)), (11, (0, 12, 24)))]


@needs_nvcc
@pytest.mark.parametrize("defines", [{}, {"LG_RELU": "1", "LG_ROUND_OUT": "1"}, {"LG_TAIL_STEPS": "1"},
                                     {"LG_DRELU": "1", "LG_BN": "128"},
                                     {"LG_DRELU": "1", "LG_ROUND_OUT": "1", "LG_BN": "128"},
                                     {"LG_STAGES": "3"}, {"LG_CLUSTER": "2"}, {"LG_CLUSTER": "4"}, *DUELING_LAYOUTS],
                         ids=lambda d: str({k: v for k, v in d.items() if k.startswith(("LG", "NUM_A"))}))
def test_linear_gemm_compiles_unserialized_without_spills(defines: dict, tmp_path: Path) -> None:
    """linear_gemm.cu's variants through ptxas: no serialized wgmma (C7520), nothing spilled."""
    msgs = _compile(ROOT / "foxhunt_core" / "kernels" / "linear_gemm.cu", defines, tmp_path, cubin=True)
    assert "C7520" not in msgs and "serialized" not in msgs, msgs
    spills = re.findall(r"(\d+) bytes spill stores", msgs)
    assert spills and all(n == "0" for n in spills), msgs


@needs_nvcc
@pytest.mark.parametrize(("cluster", "tail", "ring"), [(1, 4, ()), (2, 1, ()), (2, 2, ()), (2, 3, ()), (2, 4, ()),
                                                       (4, 4, ()), (2, 4, (3, 4, 4)), (2, 1, (3, 4, 1)),
                                                       (2, 2, (4, 2, 2)), (2, 4, (4, 1, 1)), (2, 4, (4, 2, 1, 1)),
                                                       (2, 1, (3, 4, 4, 1)), (1, 2, (4, 2, 2, 1))])
def test_glu_gemm_compiles_for_each_cluster_size_k_tail_and_ring(cluster: int, tail: int, ring: tuple,
                                                                 tmp_path: Path) -> None:
    """glu_gemm.cu with and without TMA multicast (benchmarks/bench_kernels.py --glu-cluster), for
    each count of k steps in its last chunk (the wrapper's variants by K) and with the rings and
    staging buffers of kernels.GluGemmConfig (stages, staged boxes, boxes per hand-off; and pv
    through the staging buffer by TMA, GW_PV_TMA), through
    ptxas: its wgmma products must not be serialized (ptxas's C7520, which a wgmma under a
    run-time condition brings) and nothing may spill."""
    defines = {"GW_CLUSTER": str(cluster), "GW_TAIL_STEPS": str(tail), "GW_ROUND_H": str(tail % 2)}
    defines.update(zip(("GW_STAGES", "GW_STAGED_BOXES", "GW_STORE_BOXES", "GW_PV_TMA"), map(str, ring), strict=False))
    msgs = _compile(ROOT / "foxhunt_core" / "kernels" / "glu_gemm.cu", defines, tmp_path, cubin=True)
    assert "C7520" not in msgs and "serialized" not in msgs, msgs
    spills = re.findall(r"(\d+) bytes spill stores", msgs)
    assert spills and all(n == "0" for n in spills), msgs


@needs_nvcc
@pytest.mark.parametrize("stages", [3, 4, "4 wide"])
def test_wgrad_gemm_compiles_unserialized_without_spills(stages: int | str, tmp_path: Path) -> None:
    """wgrad_gemm.cu (wgrad_gemm, wgrad_gemm_tx, wgrad_reduce): the wgmma's A comes from registers,
    two sets of fragments live at once beside the 132 accumulators (136 in the wide variant; the
    consumers take 232 registers by setmaxnreg): ptxas must neither serialize the products for want
    of registers (C7512) or otherwise (C7520) nor spill."""
    from foxhunt_core.gpu.tc.wgrad import WIDE

    defines = {"WG_STAGES": str(stages).split()[0]}
    if str(stages).endswith("wide"):
        defines.update({k: str(v) for k, v in WIDE.defines})
    msgs = _compile(ROOT / "foxhunt_core" / "kernels" / "wgrad_gemm.cu", defines, tmp_path, cubin=True)
    assert "C75" not in msgs and "serialized" not in msgs, msgs
    spills = re.findall(r"(\d+) bytes spill stores", msgs)
    assert len(spills) == 3 and all(n == "0" for n in spills), msgs


@needs_nvcc
@pytest.mark.parametrize("tail", [1, 2, 3, 4])
@pytest.mark.parametrize("nq", [0, GLU_BACKWARD_GEMM_DQ_COLS])
def test_glu_backward_gemm_compiles_unserialized_without_spills(tail: int, nq: int, tmp_path: Path) -> None:
    """glu_backward_gemm.cu for each count of k steps in the last chunk, without dq and with its
    widest (four columns, Wq's weights held in registers): no serialized wgmma, no spill."""
    msgs = _compile(ROOT / "foxhunt_core" / "kernels" / "glu_backward_gemm.cu",
                    {"GB_TAIL_STEPS": str(tail), "GB_NQ": str(nq)}, tmp_path, cubin=True)
    assert "C75" not in msgs and "serialized" not in msgs, msgs
    spills = re.findall(r"(\d+) bytes spill stores", msgs)
    assert len(spills) == 2 and all(n == "0" for n in spills), msgs


def test_wrappers_size_their_launches_by_the_table() -> None:
    """The tensor-core wrappers' tiles, stages, sets and threads are the table's entries (the
    kernels read the same ones from defines.cuh), their argument records have the kernels' sizes
    (TensorMaps of 128 bytes, LinearArgs 64-byte aligned), and their shared memory fits a Hopper
    block's 227 KiB."""
    from foxhunt_core.gpu import kernels as K

    v = defines.value
    assert (K.GLU_GEMM_ROWS, K.GLU_GEMM_COLS, K.GLU_GEMM_BOX_K) == (v("TC_BM"), v("GW_BH"), v("TC_BK"))
    assert K.GLU_GEMM_THREADS == v("TC_THREADS") == 32 * v("TC_CONSUMER_WARPS") + 32
    assert (K.GLU_GEMM_STAGES, K.GLU_GEMM_STAGED_BOXES, K.GLU_GEMM_STORE_BOXES, K.GLU_GEMM_CLUSTER) == (
        v("GW_STAGES"), v("GW_STAGED_BOXES"), v("GW_STORE_BOXES"), v("GW_CLUSTER"))
    assert (K.LINEAR_GEMM_COLS, K.LINEAR_GEMM_STAGES, K.LINEAR_GEMM_CLUSTER, K.LINEAR_GEMM_SETS) == (
        v("LG_BN"), v("LG_STAGES"), v("LG_CLUSTER"), v("LG_BRANCHES"))
    assert K.LINEAR_GEMM_DUELING_THREADS == K.GLU_GEMM_THREADS + 32 * K.LINEAR_GEMM_DUELING_WARPS
    assert (K.HEADS_DUELING_LANES, K.HEADS_DUELING_BUDGET) == (v("DG_LANES"), v("DG_BUDGET"))
    assert (K.GLU_BACKWARD_GEMM_SETS, K.GLU_BACKWARD_GEMM_STAGES, K.GLU_BACKWARD_GEMM_PARTS) == (
        v("GB_SETS"), v("GB_STAGES"), v("GB_BH") // 32)
    assert K.GLU_BACKWARD_GEMM_THREADS == K.GLU_GEMM_THREADS - 32 + 128  # a whole producer warpgroup
    assert K.GLU_BACKWARD_GEMM_DQ_H == 2 * v("GB_BH")  # two column tiles: an exact sum
    assert K.WGRAD_GEMM_ROWS == v("WG_N") + v("WG_NT") and K.WGRAD_GEMM_THREADS == K.GLU_GEMM_THREADS - 32 + 128
    from foxhunt_core.gpu.tc.wgrad import NARROW, WIDE

    wide = dict(WIDE.defines)
    assert K.WGRAD_GEMM_MAX_ROWS == WIDE.rows == v("WG_N") + wide["WG_NT"] == wide["WG_ROWS"]
    for variant in (NARROW, WIDE):  # TMA boxes that tile the stage, each 1024-aligned, within TMA's 256 rows
        assert variant.rows % variant.box_rows == 0 and variant.box_rows % 8 == 0 and variant.box_rows <= 256
        assert K.WgradGemmConfig().smem_for(variant) <= 227 * 1024
    assert (K.WGRAD_SETS, K.WGRAD_GEMM_TX_STAGES, K.WGRAD_GEMM_STAGES) == (v("WT_SETS"), v("WT_STAGES"),
                                                                        v("WG_STAGES"))
    assert K.GLU_BACK_ARGS.itemsize == (2 * K.GLU_BACKWARD_GEMM_SETS + 1) * 128  # sizeof(GluBackArgs)
    assert K.WGRAD_SETS_ARGS.itemsize == 2 * K.WGRAD_SETS * 128 and K.OUT_SETS.itemsize == 8 * K.WGRAD_SETS
    size = 3 * K.LINEAR_GEMM_SETS * 128 + 8 * K.LINEAR_GEMM_SETS  # sizeof(LinearArgs): maps, bias pointers
    assert K.LINEAR_ARGS.itemsize == -(-size // 64) * 64  # (__align__(64))
    for smem in (K.GluBackwardGemmConfig().smem, K.WgradGemmConfig().smem, K.wgrad_gemm_tx_smem(),
                 K.linear_gemm_smem(dueling=True), K.linear_gemm_smem(), K.GluGemmConfig().smem):
        assert smem <= 227 * 1024


def test_glu_gemm_configs_fit_shared_memory_or_refuse() -> None:
    """GluGemmConfig: the default, the three-stage ring and the rings the GPU tests build fit a
    Hopper block's 227 KiB; a ring that would not, or a staging buffer that does not take whole
    hand-offs, is refused."""
    from foxhunt_core.gpu import kernels as K

    default = K.GluGemmConfig()
    assert (default.stages, default.staged_boxes, default.store_boxes, default.pv_tma) == (4, 2, 1, True)
    for ring in [(3, 4, 4), (3, 4, 1), (4, 2, 2), (4, 1, 1), (4,), (3,)]:
        assert K.GluGemmConfig.ring(*ring).smem <= 227 * 1024
    three = K.GluGemmConfig.ring(3)
    assert (three.stages, three.staged_boxes, three.store_boxes) == (3, 4, 4)  # the whole tile's h at once
    assert K.GluGemmConfig.ring(4) == default
    for bad in [(4, 4, 4), (5, 2, 1), (2, 2, 1), (4, 2, 4), (4, 3, 1)]:
        with pytest.raises(ValueError, match="glu_gemm"):
            K.GluGemmConfig.ring(*bad)
    with pytest.raises(ValueError, match="glu_gemm"):
        K.GluGemmConfig(cluster=3)
    for cfg in (K.LinearGemmConfig(), K.WgradGemmConfig(), K.GluBackwardGemmConfig()):
        assert cfg == type(cfg)()  # (frozen and comparable: a plan's knobs)
    with pytest.raises(ValueError, match="wgrad_gemm"):
        K.WgradGemmConfig(stages=5)


@needs_nvcc
@pytest.mark.parametrize(("atoms", "offsets"), [((12, (0, 12, 24))), (12, (0, 13)), (8, (0, 20, 44)), (8, (0, 25))])
def test_heads_dueling_refuses_exactly_the_layouts_its_kernel_does(atoms: int, offsets: tuple, tmp_path: Path) -> None:
    """heads_dueling_supported, the wrapper's twin of dueling_row.cuh's DG_FITS: where it says no,
    linear_gemm.cu's dueling build stops at its static_assert; where yes, it compiles."""
    from foxhunt_core.gpu import kernels as K

    defines = {**DEFAULT_DEFINES, "LG_DUELING": "1", **branch_defines(offsets, atoms, head_align=4)}
    cu = ROOT / "foxhunt_core" / "kernels" / "linear_gemm.cu"
    if K.heads_dueling_supported(offsets, atoms):
        _compile(cu, defines, tmp_path)
    else:
        with pytest.raises(pytest.fail.Exception, match="more than DG_BUDGET values per lane"):
            _compile(cu, defines, tmp_path)


@needs_nvcc
def test_glu_gemm_diagnostic_variants_still_apply(tmp_path: Path) -> None:
    """benchmarks/glu_gemm_variants.py edits glu_gemm.cu textually: each edit must still find its
    text (the script stops otherwise), and each variant must compile."""
    import importlib.util

    path = ROOT / "benchmarks" / "glu_gemm_variants.py"
    spec = importlib.util.spec_from_file_location("glu_gemm_variants", path)
    mod = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(path.parent))
    try:
        spec.loader.exec_module(mod)
    finally:
        sys.path.remove(str(path.parent))
    src = mod.SOURCE.read_text()
    for header in mod.SOURCE.parent.glob("*.cuh"):  # (as the script does)
        shutil.copy(header, tmp_path)
    for name in mod.VARIANTS:
        variant = mod.variant_source(name, src)
        assert name == "kernel" or variant != src
        cu = tmp_path / f"{name.replace(' ', '_')}.cu"
        cu.write_text(variant)
        out = tmp_path / "out"
        out.mkdir(exist_ok=True)
        _compile(cu, {}, out)
