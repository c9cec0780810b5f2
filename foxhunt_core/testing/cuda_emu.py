"""Run a ``.cu`` kernel's source on the CPU (host threads as CUDA threads) to check it without a GPU.

The kernel file is compiled by the host C++ compiler with ``cuda_emu.h`` force-included (which maps
``threadIdx``, ``__syncthreads``, ``__shared__``, warp shuffles, ... onto cooperative fibers and
barriers on one host thread)
and the same ``#define`` preamble :func:`foxhunt_core.backend.load_module` prepends. A generated
``main`` loads the named NumPy buffers, runs the launches in order and writes the buffers back.

This complements, and does not replace, the parity tests on a GPU (marker ``gpu``): it checks a
kernel's indexing, its barriers and its arithmetic against the NumPy twin on machines without one
(the emulation is in float32/float64 like the device, but the host's ``expf`` and the order of
non-atomic operations may differ from the device's in the last bits).
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

HEADER = Path(__file__).with_name("cuda_emu.h")
_C_TYPES = {
    np.dtype(np.float32): "float",
    np.dtype(np.float64): "double",
    np.dtype(np.int32): "int",
    np.dtype(np.int64): "long long",
    np.dtype(np.uint32): "unsigned int",
    np.dtype(np.uint64): "unsigned long long",
}
_BUILDS: dict[str, Path] = {}


def compiler() -> str | None:
    """The host C++ compiler (``g++``, else ``clang++``) or None."""
    return shutil.which("g++") or shutil.which("clang++")


@dataclass(frozen=True)
class Launch:
    """One kernel launch: ``args`` are buffer names (pointers), NumPy scalars (by value) or None
    (a null pointer), in the kernel's parameter order."""

    kernel: str
    grid: int | tuple[int, ...]
    block: int | tuple[int, ...]
    args: Sequence[Any]


def _dim(v: int | tuple[int, ...]) -> str:
    t = (v,) if isinstance(v, int) else tuple(v)
    return "dim3(" + ", ".join(str(int(x)) for x in t) + ")"


def _scalar(v: Any) -> str:
    a = np.asarray(v)
    if a.shape != () or a.dtype not in _C_TYPES:
        raise TypeError(f"cuda_emu: a scalar argument must be a NumPy scalar of {list(_C_TYPES)}, got {v!r}")
    c = _C_TYPES[a.dtype]
    if a.dtype.kind == "f":
        return f"({c}){float(a).hex()}"  # exact (a hexadecimal floating literal)
    return f"({c}){int(a)}{'ULL' if a.dtype.kind == 'u' else 'LL'}"


def _main(cu: Path, defines: Mapping[str, Any], buffers: Mapping[str, np.ndarray], launches: Sequence[Launch]) -> str:
    lines = [f"#define {k} {v}" for k, v in sorted((str(k), str(v)) for k, v in defines.items())]
    lines += [f'#include "{cu}"', "#include <cstdio>", "#include <cstdlib>", "#include <string>",
              "static void io(const std::string& path, void* p, size_t n, bool read) {",
              "  FILE* f = std::fopen(path.c_str(), read ? \"rb\" : \"wb\");",
              "  if (!f || (read ? std::fread(p, 1, n, f) : std::fwrite(p, 1, n, f)) != n) {",
              "    std::perror(path.c_str());", "    std::exit(3);", "  }",
              "  std::fclose(f);", "}",
              "int main(int argc, char** argv) {", "  const std::string dir = argv[1];"]
    for i, (name, a) in enumerate(buffers.items()):
        c = _C_TYPES[a.dtype]
        lines += [f"  std::vector<{c}> b{i}({max(a.size, 1)});",
                  f'  io(dir + "/{name}.bin", b{i}.data(), {a.nbytes}, true);']
    index = {name: i for i, name in enumerate(buffers)}
    for ln in launches:
        args = []
        for a in ln.args:
            if a is None:
                args.append("nullptr")
            elif isinstance(a, str):
                if a not in index:
                    raise KeyError(f"cuda_emu: launch of {ln.kernel} names no buffer {a!r}")
                args.append(f"b{index[a]}.data()")
            else:
                args.append(_scalar(a))
        lines.append(f"  emu::launch({_dim(ln.grid)}, {_dim(ln.block)}, [&] {{ {ln.kernel}({', '.join(args)}); }});")
    for i, (name, a) in enumerate(buffers.items()):
        lines.append(f'  io(dir + "/{name}.bin", b{i}.data(), {a.nbytes}, false);')
    lines += ["  return 0;", "}"]
    return "\n".join(lines) + "\n"


def run(cu_path: str | Path, buffers: Mapping[str, np.ndarray], launches: Sequence[Launch],
        defines: Mapping[str, Any] | None = None, timeout: float = 600.0) -> dict[str, np.ndarray]:
    """Run ``launches`` of the kernels in ``cu_path`` on copies of ``buffers`` (C-contiguous NumPy
    arrays); returns the buffers after the last launch (new arrays, same dtypes and shapes)."""
    cxx = compiler()
    if cxx is None:
        raise RuntimeError("cuda_emu: no host C++ compiler (g++ or clang++) on PATH")
    cu = Path(cu_path).resolve()
    bufs = {k: np.ascontiguousarray(v) for k, v in buffers.items()}
    for k, v in bufs.items():
        if v.dtype not in _C_TYPES:
            raise TypeError(f"cuda_emu: buffer {k!r} has dtype {v.dtype}, not one of {list(_C_TYPES)}")
    src = _main(cu, defines or {}, bufs, launches)
    key = hashlib.sha256((src + cu.read_text() + HEADER.read_text()).encode()).hexdigest()[:16]
    with tempfile.TemporaryDirectory(prefix="cuda_emu_") as tmp:
        d = Path(tmp)
        exe = _BUILDS.get(key)
        if exe is None or not exe.exists():
            build = Path(tempfile.gettempdir()) / f"cuda_emu_{key}"
            (d / "main.cpp").write_text(src)
            cmd = [cxx, "-std=c++17", "-O1", "-w", "-include", str(HEADER), f"-I{cu.parent}",
                   str(d / "main.cpp"), "-o", str(build)]
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
            if res.returncode != 0:
                raise RuntimeError(f"cuda_emu: {cu.name} does not compile for the host:\n{res.stderr[-4000:]}")
            _BUILDS[key] = exe = build
        for k, v in bufs.items():
            v.tofile(d / f"{k}.bin")
        res = subprocess.run([str(exe), str(d)], capture_output=True, text=True, timeout=timeout)
        if res.returncode != 0:
            raise RuntimeError(f"cuda_emu: {cu.name} failed (exit {res.returncode}): {res.stderr[-2000:]}")
        return {k: np.fromfile(d / f"{k}.bin", dtype=v.dtype).reshape(v.shape) for k, v in bufs.items()}
