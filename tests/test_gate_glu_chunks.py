"""gate_glu_backward's row chunks (foxhunt_core.gpu.gate.rows_per_chunk): whole batches of rows per
thread, enough blocks to keep the memory busy at small batches, few chunks to sum at large ones."""

from __future__ import annotations

import pytest

from foxhunt_core.gpu.gate import GG_ROW_BATCH, GG_ROW_THREADS, GG_UNIT_TILE, TARGET_BLOCKS, rows_per_chunk


@pytest.mark.parametrize("rows", [1, 63, 64, 777, 4096, 20_000, 65_536, 1_000_003])
@pytest.mark.parametrize("units", [48, 256, 768])
def test_chunks_are_whole_batches_and_cover_the_rows(rows, units):
    step = GG_ROW_THREADS * GG_ROW_BATCH
    per = rows_per_chunk(rows, units)
    assert per >= step and per % step == 0
    chunks = -(-rows // per)
    tiles = -(-units // GG_UNIT_TILE)
    assert chunks * per >= rows
    # never more blocks than the target where the rows allow fewer (one batch a thread at least)
    assert chunks * tiles <= max(TARGET_BLOCKS + tiles, tiles)
    if rows >= step * -(-TARGET_BLOCKS // tiles):  # enough rows: about the target's blocks
        assert chunks * tiles >= TARGET_BLOCKS // 2


def test_one_branch_at_4096_rows_runs_as_many_blocks_as_the_target():
    assert rows_per_chunk(4096, 256) == 64  # 64 chunks x 8 unit tiles = 512 blocks (was 16 x 8)
