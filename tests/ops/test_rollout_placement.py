"""Where CUDA trials run: one GPU per trial process (CUDA_VISIBLE_DEVICES), workers_per_gpu trials per
GPU, every visible GPU used; the GPU recorded; a trial process that dies is a failed trial. The GPUs
are injected: these tests need no GPU."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from foxhunt_ops.backends import GpuSlots, LocalBackend, memory_fraction, parse_visible_devices, ray_resources
from foxhunt_ops.ledger import Ledger
from foxhunt_ops.trial import TrialSpec, outcome


class FakeProc:
    """A trial process that ends when the test says so."""

    def __init__(self) -> None:
        self.returncode: int | None = None
        self.pid = 2**22 + 7  # above any Linux pid_max: a kill finds no such process

    def poll(self) -> int | None:
        return self.returncode

    def wait(self) -> int | None:
        return self.returncode


class Launcher:
    def __init__(self) -> None:
        self.launched: list[tuple[TrialSpec, dict[str, str], FakeProc]] = []

    def __call__(self, spec: TrialSpec, env: dict[str, str]) -> FakeProc:
        proc = FakeProc()
        self.launched.append((spec, env, proc))
        return proc


def spec(tmp_path: Path, seed: int, device: str = "cuda", stage: str = "s") -> TrialSpec:
    run = tmp_path / stage / f"seed-{seed}"
    run.mkdir(parents=True, exist_ok=True)
    return TrialSpec(stage_id=stage, seed=seed, steps=1, flags_file="f", flags_sha256="h", run_dir=str(run),
                     device=device)


@pytest.mark.parametrize(
    "gpus, per_gpu, first_wave",
    [
        (["0"], 1, ["0"]),
        (["0"], 3, ["0", "0", "0"]),
        (["0", "1"], 1, ["0", "1"]),
        (["0", "1"], 3, ["0", "1", "0", "1", "0", "1"]),
        ([str(i) for i in range(8)], 1, [str(i) for i in range(8)]),
        ([str(i) for i in range(8)], 2, [str(i) for i in range(8)] * 2),
    ],
    ids=["1gpu", "1gpu-x3", "2gpu", "2gpu-x3", "8gpu", "8gpu-x2"],
)
def test_each_trial_gets_the_least_loaded_gpu(gpus, per_gpu, first_wave):
    slots = GpuSlots(gpus, per_gpu)
    assert slots.capacity == len(gpus) * per_gpu
    wave = [slots.take() for _ in range(slots.capacity)]
    assert wave == first_wave and all(n == per_gpu for n in slots.load.values())  # every GPU, evenly
    with pytest.raises(RuntimeError, match="no free GPU slot"):
        slots.take()
    slots.give(gpus[-1])
    assert slots.take() == gpus[-1]  # a freed slot goes to the next trial


def test_the_local_backend_places_trials_by_their_processes_visible_device(tmp_path: Path):
    launch = Launcher()
    be = LocalBackend(device="auto", gpus=["0", "1"], workers_per_gpu=2, launcher=launch)
    assert be.device_for("auto") == "cuda" and be.capacity == 4 and be.memory == pytest.approx(0.45)
    for seed in range(4):
        be.submit(spec(tmp_path, seed))
    envs = [env for _, env, _ in launch.launched]
    assert [e["CUDA_VISIBLE_DEVICES"] for e in envs] == ["0", "1", "0", "1"]
    assert {e["CUPY_GPU_MEMORY_LIMIT"] for e in envs} == {"45%"}
    assert [s.gpu_memory_fraction for s, _, _ in launch.launched] == [0.45] * 4
    launch.launched[1][2].returncode = -9  # the trial on GPU 1 dies
    (out,) = be.wait(1.0)
    assert (out.seed, out.status, out.gpu) == (1, "failed", "1")
    assert out.error.startswith("killed by signal 9 (SIGKILL: the kernel's out-of-memory killer, or an operator)")
    be.submit(spec(tmp_path, 4))
    assert launch.launched[-1][1]["CUDA_VISIBLE_DEVICES"] == "1"  # its slot was given back
    assert sorted(s.seed for s in be.cancel()) == [0, 2, 3, 4] and be.slots.load == {"0": 0, "1": 0}


def test_cpu_trials_ignore_the_gpus(tmp_path: Path):
    launch = Launcher()
    be = LocalBackend(3, device="cpu", gpus=["0", "1"], launcher=launch)
    assert be.capacity == 3 and be.slots is None
    be.submit(spec(tmp_path, 0, device="cpu"))
    env = launch.launched[0][1]
    assert "CUPY_GPU_MEMORY_LIMIT" not in env
    assert LocalBackend(device="auto", gpus=[]).device_for("auto") == "cpu"
    assert LocalBackend(2, device="cuda", gpus=[str(i) for i in range(8)], workers_per_gpu=4).capacity == 2


def test_visible_devices_and_ray_resources():
    assert parse_visible_devices("2,5") == ["2", "5"]
    assert parse_visible_devices("GPU-1a2b, GPU-3c4d") == ["GPU-1a2b", "GPU-3c4d"]
    assert parse_visible_devices("0,-1,3") == ["0"] and parse_visible_devices("") == []
    assert ray_resources("cuda", 4) == {"num_cpus": 1, "num_gpus": 0.25}
    assert ray_resources("cuda", 1) == {"num_cpus": 1, "num_gpus": 1.0}
    assert ray_resources("cpu", 4) == {"num_cpus": 1, "num_gpus": 0}
    assert memory_fraction(3, None) == pytest.approx(0.3) and memory_fraction(3, 0.5) == 0.5


def test_a_real_trial_process_killed_is_a_failed_trial_with_the_reason(tmp_path: Path):
    def sleeper(spec: TrialSpec, env: dict[str, str]) -> subprocess.Popen[bytes]:
        return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env,
                                start_new_session=True)

    be = LocalBackend(device="cuda", gpus=["0"], launcher=sleeper)
    be.submit(spec(tmp_path, 7))
    (_, proc, _, gpu) = be.procs[("s", 7)]
    assert gpu == "0"
    proc.send_signal(signal.SIGKILL)
    outs = []
    for _ in range(100):
        outs = be.wait(0.1)
        if outs:
            break
    (out,) = outs
    assert (out.status, out.exit_code, out.gpu) == ("failed", -9, "0") and "killed by signal 9" in out.error


def test_an_out_of_memory_death_says_so(tmp_path: Path):
    s = spec(tmp_path, 0)
    (Path(s.run_dir) / "trial.log").write_text(
        "Traceback (most recent call last):\ncupy.cuda.memory.OutOfMemoryError: Out of memory allocating "
        "1,073,741,824 bytes (allocated so far: 10,737,418,240 bytes, limit set to: 10,737,418,240 bytes).\n")
    out = outcome(s, 1, 3.0, gpu="3")
    assert out.error.startswith("exit 1 (out of GPU memory: see gpu_memory_fraction and workers_per_gpu): ")
    assert out.gpu == "3"


def test_the_ledger_records_the_gpu_and_leaves_it_out_of_snapshots(tmp_path: Path):
    from foxhunt_ops.stages import ResolvedStage
    from foxhunt_ops.trial import TrialOutcome

    st = ResolvedStage(index=0, stage_id="s", number=0, source="stage 0", source_sha256=None, flags_text="x",
                       flags_sha256="h", plugins=[], seeds=[0], steps=1)
    led = Ledger.open(tmp_path, create=True)
    led.initialise("p.yaml", "p", "sha", "text", [st])
    led.trial_started(spec(tmp_path, 0), "trials/s/seed-0")
    led.trial_finished(TrialOutcome("s", 0, "failed", -9, 1.0, error="killed", gpu="1"))
    assert led.trials()[0]["gpu"] == "1"
    assert "gpu" not in led.snapshot()["trials"][0]
    led.close()
