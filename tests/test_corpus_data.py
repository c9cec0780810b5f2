"""Malformed bar files for `eval --data`: one line naming the file (and row, column), exit 2, nothing written.

A tiny run is trained once; each case writes one bad CSV or Parquet file (or a FIFO, a device,
a directory) and evaluates the run on it. A CSV saved with a UTF-8 byte-order mark, as
spreadsheets write it, is accepted.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from corpus_helpers import TINY, invoke, refused

HEADER = "timestamp,open,high,low,close,volume"


def _rows(n: int, start: int = 1_700_000_000) -> list[str]:
    rng = np.random.default_rng(0)
    close = 100 * np.exp(np.cumsum(rng.normal(0, 5e-4, n)))
    open_ = np.concatenate([[close[0]], close[:-1]])
    high = np.maximum(open_, close) * 1.0002
    low = np.minimum(open_, close) * 0.9998
    return [f"{start + 60 * i},{o:.4f},{h:.4f},{lo:.4f},{c:.4f},{100 + i}"
            for i, (o, h, lo, c) in enumerate(zip(open_, high, low, close))]


def _csv(lines: list[str]) -> str:
    return "\n".join(lines) + "\n"


GOOD = [HEADER, *_rows(400)]


def _with(row: int, text: str) -> str:
    """GOOD with data row ``row`` (1-based) replaced."""
    lines = list(GOOD)
    lines[row] = text
    return _csv(lines)


def _row(i: int) -> list[str]:
    return GOOD[i].split(",")


def _edit(row: int, column: int, value: str) -> str:
    cells = _row(row)
    cells[column] = value
    return _with(row, ",".join(cells))


# id -> (file name, text or bytes, fragment after "<path>")
CASES: dict[str, tuple[str, str | bytes, str]] = {
    "ten-rows": ("ten.csv", _csv(GOOD[:11]), "10 bars split 0.7/0.1/rest leave 2 bars for the test split; evaluating "
                                             "needs at least 64 there (at least 320 bars in all)"),
    "header-only": ("header.csv", HEADER + "\n", "no data rows"),
    "empty": ("empty.csv", "", "empty file (no header)"),
    "missing-column": ("novol.csv", _csv([HEADER.rsplit(",", 1)[0]] + [r.rsplit(",", 1)[0] for r in GOOD[1:]]),
                       "missing column 'volume'"),
    "field-count": ("fields.csv", _with(5, GOOD[5] + ",7"), "row 5 (line 6): expected 6 fields, found 7"),
    "not-a-number": ("nan-text.csv", _edit(3, 4, "n/a"), "row 3 (line 4), column 'close': not a number: 'n/a'"),
    "nan-price": ("nan.csv", _edit(3, 4, "nan"), "column 'close': missing or non-finite value"),
    "missing-value": ("blank.csv", _edit(7, 2, ""), "row 7 (line 8), column 'high': missing value"),
    "negative-price": ("neg.csv", _edit(2, 1, "-5"), "column 'open': non-positive price -5.0"),
    "high-below-low": ("hl.csv", _edit(4, 2, "1.0"), "row 4 (line 5), column 'high': high/low do not bracket"),
    "negative-volume": ("vol.csv", _edit(6, 5, "-1"), "column 'volume': negative value -1.0"),
    "time-goes-back": ("back.csv", _edit(9, 0, "1600000000"), "row 9 (line 10), column 'timestamp': non-monotonic"),
    "missing-timestamp": ("nots.csv", _edit(4, 0, ""), "row 4 (line 5), column 'timestamp': missing timestamp"),
    "unreadable-timestamp": ("badts.csv", _csv([HEADER] + [f"2024-01-01T00:{i % 60:02d}:00,1,1,1,1,1" if i != 3
                                                            else "yesterday,1,1,1,1,1" for i in range(400)]),
                             "column 'timestamp': unreadable timestamp 'yesterday'"),
    "not-utf8": ("latin.csv", HEADER.encode() + b"\n\xff\xfe\x00garbage\n", "cannot read file"),
    "parquet-garbage": ("junk.parquet", b"PAR1 this is not parquet", "cannot read file"),
}


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("data")
    flags = d / "tiny.yaml"
    flags.write_text(TINY)
    assert invoke(["train", "--flags", flags, "--out", d / "run", "--quiet"]).exit_code == 0
    return d / "run"


@pytest.fixture()
def copy(run, tmp_path) -> Path:
    out = tmp_path / "run"
    shutil.copytree(run, out)
    return out


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_malformed_bar_file_is_refused(name, copy, tmp_path):
    fname, content, fragment = CASES[name]
    path = tmp_path / fname
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    refused(["eval", copy, "--data", path], fragment, prefix=f"{path}", watch=(copy, path))


def _parquet(path: Path, **columns) -> None:
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    n = 400
    rows = [r.split(",") for r in GOOD[1:]]
    base = {"timestamp": pa.array([int(r[0]) for r in rows]),
            **{c: pa.array([float(r[i]) for r in rows]) for i, c in enumerate(HEADER.split(",")[1:], start=1)}}
    base.update(columns)
    assert all(len(v) == n for v in base.values())
    pq.write_table(pa.table(base), path)


@pytest.mark.parametrize("kind, fragment", [
    ("list-column", "column 'close': has Parquet type list<element: double>; expected one number"),
    ("struct-column", "column 'volume': has Parquet type struct<"),
    ("null-timestamp", "row 1, column 'timestamp': missing timestamp"),
    ("null-epoch-in-the-middle", "row 5, column 'timestamp': missing timestamp"),
    ("null-price", "row 2, column 'open': missing or non-finite value"),
])
def test_a_malformed_parquet_file_is_refused(copy, tmp_path, kind, fragment):
    pa = pytest.importorskip("pyarrow")
    path = tmp_path / f"{kind}.parquet"
    if kind == "list-column":
        _parquet(path, close=pa.array([[1.0, 2.0]] * 400))
    elif kind == "struct-column":
        _parquet(path, volume=pa.array([{"a": 1.0}] * 400))
    elif kind == "null-timestamp":
        _parquet(path, timestamp=pa.array([None] + [1_700_000_000_000 + 60_000 * i for i in range(1, 400)],
                                          type=pa.timestamp("ms")))
    elif kind == "null-epoch-in-the-middle":
        _parquet(path, timestamp=pa.array([1_700_000_000 + 60 * i if i != 4 else None for i in range(400)]))
    else:
        _parquet(path, open=pa.array([100.0, None] + [100.0] * 398))
    refused(["eval", copy, "--data", path], fragment, prefix=f"{path}", watch=(copy, path))


@pytest.mark.parametrize("kind, fragment", [
    ("fifo", "not a regular file (a named pipe (FIFO))"),
    ("dev-zero", "not a regular file (a character device)"),
    ("directory", "not a regular file (a directory)"),
    ("missing", "cannot read (No such file or directory)"),
])
def test_only_regular_bar_files_are_read(copy, tmp_path, kind, fragment):
    """A FIFO used to hang eval forever."""
    path = tmp_path / "bars.csv"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev-zero":
        path.symlink_to("/dev/zero")
    elif kind == "directory":
        path.mkdir()
    refused(["eval", copy, "--data", path], f"{path}: {fragment}", watch=(copy,))


def test_the_validation_split_of_a_short_file(copy, tmp_path):
    path = tmp_path / "short.csv"
    path.write_text(_csv(GOOD[:401]))
    refused(["eval", copy, "--data", path, "--split", "val"], "leave 40 bars for the val split; evaluating needs at "
            "least 64 there (at least 640 bars in all)", watch=(copy,))
    assert invoke(["eval", copy, "--data", path]).exit_code == 0  # its test split is long enough


def test_a_csv_with_a_byte_order_mark_is_read(copy, tmp_path):
    """Spreadsheets save CSV as UTF-8 with a BOM; it used to read as a missing 'timestamp' column."""
    path = tmp_path / "excel.csv"
    path.write_bytes(b"\xef\xbb\xbf" + _csv(GOOD).encode())
    res = invoke(["eval", copy, "--data", path])
    assert res.exit_code == 0, res.output
    assert "evaluation on the test split (" in res.stdout
