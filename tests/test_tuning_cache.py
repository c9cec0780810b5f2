"""The machine's GEMM tuning cache (foxhunt_core.gpu.tuning_cache): where it lives, what a write
merges, and that a damaged file is named and replaced. No GPU needed: records are built by hand."""

import json
import re
from pathlib import Path

import pytest

from foxhunt_core.gpu import tuning_cache

ALGO_A, ALGO_B = "ab" * 64, "cd" * 64  # 64-byte cuBLASLt algorithms in hex


def record(device="NVIDIA H200; cublasLt 130000", **plans):
    return {"format": 1, "device": device, "plans": plans}


def test_cache_dir_follows_the_environment(tmp_path):
    home = Path.home()
    assert tuning_cache.cache_dir({}) == home / ".cache" / "foxhunt"
    assert tuning_cache.cache_dir({"XDG_CACHE_HOME": str(tmp_path)}) == tmp_path / "foxhunt"
    assert tuning_cache.cache_dir({"XDG_CACHE_HOME": "/x", "FOXHUNT_CACHE_DIR": str(tmp_path)}) == tmp_path
    for off in ("0", "off", "False", "no"):
        assert tuning_cache.cache_dir({"FOXHUNT_GEMM_CACHE": off, "FOXHUNT_CACHE_DIR": str(tmp_path)}) is None
    assert tuning_cache.cache_dir({"FOXHUNT_GEMM_CACHE": "1", "FOXHUNT_CACHE_DIR": str(tmp_path)}) == tmp_path


def test_one_file_per_device(tmp_path):
    a = tuning_cache.cache_file(tmp_path, "NVIDIA H200; cublasLt 130000")
    assert a.parent == tmp_path / "gemm_tuning" and a.suffix == ".json"
    assert a == tuning_cache.cache_file(tmp_path, "NVIDIA H200; cublasLt 130000")
    assert a != tuning_cache.cache_file(tmp_path, "NVIDIA H200; cublasLt 130100")
    assert a != tuning_cache.cache_file(tmp_path, "NVIDIA A100; cublasLt 130000")


def test_add_creates_then_merges(tmp_path):
    path = tuning_cache.cache_file(tmp_path, "NVIDIA H200; cublasLt 130000")
    assert tuning_cache.add(path, record(p1=ALGO_A, p2=ALGO_A)) == 2
    assert tuning_cache.add(path, record(p2=ALGO_B, p3=ALGO_B)) == 3  # the newer run's choice wins
    assert tuning_cache.read(path) == record(p1=ALGO_A, p2=ALGO_B, p3=ALGO_B)
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary file left


def test_a_record_of_another_device_is_not_merged():
    old = record(device="NVIDIA A100; cublasLt 130000", p1=ALGO_A)
    assert tuning_cache.merged(old, record(p2=ALGO_B)) == record(p2=ALGO_B)
    assert tuning_cache.merged(None, record(p2=ALGO_B)) == record(p2=ALGO_B)


@pytest.mark.parametrize("text,problem", [
    ("{not json", "unreadable GEMM tuning cache"),
    ("[]", "not a GEMM tuning record"),
    (json.dumps(record(p1="xyz")), r"plans\['p1'\] is not a 64-byte algorithm"),
])
def test_a_damaged_cache_is_named_and_replaced(tmp_path, text, problem):
    path = tmp_path / "gemm_tuning" / "h200.json"
    path.parent.mkdir()
    path.write_text(text)
    with pytest.raises(ValueError, match=f"{re.escape(str(path))}: .*{problem}"):
        tuning_cache.read(path)
    assert tuning_cache.add(path, record(p1=ALGO_A)) == 1
    assert tuning_cache.read(path) == record(p1=ALGO_A)
