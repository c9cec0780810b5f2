"""The uniform ring-buffer replay."""

from __future__ import annotations

import numpy as np
import pytest

from foxhunt_core.replay import FIELDS, ReplayBuffer


def _batch(start, n, obs_dim=2, branches=4):
    """Transitions tagged by their number ``k``: obs = k, reward = k, action = k % 3, ..."""
    k = np.arange(start, start + n)
    return dict(
        obs=np.repeat(k[:, None], obs_dim, axis=1).astype(np.float32),
        action=np.repeat((k % 3)[:, None], branches, axis=1),
        reward=k.astype(np.float32),
        next_obs=np.repeat(k[:, None] + 0.5, obs_dim, axis=1).astype(np.float32),
        terminal=(k % 2).astype(np.float32),
    )


def test_add_and_len():
    buf = ReplayBuffer(10, 2, 4)
    assert len(buf) == 0
    buf.add(**_batch(1, 3))
    assert len(buf) == 3 and buf.pos == 3
    np.testing.assert_array_equal(buf.reward[:4], [1, 2, 3, 0])
    np.testing.assert_array_equal(buf.next_obs[2], [3.5, 3.5])
    np.testing.assert_array_equal(buf.action[1], [2, 2, 2, 2])


def test_wrap_around_overwrites_the_oldest():
    buf = ReplayBuffer(5, 2, 4)
    buf.add(**_batch(1, 3))  # rows 0..2 hold 1, 2, 3
    buf.add(**_batch(4, 4))  # 4, 5 -> rows 3, 4; 6, 7 wrap to rows 0, 1
    assert len(buf) == 5 and buf.pos == 2
    np.testing.assert_array_equal(buf.reward, [6, 7, 3, 4, 5])
    np.testing.assert_array_equal(buf.obs[:, 0], [6, 7, 3, 4, 5])
    np.testing.assert_array_equal(buf.terminal, [0, 1, 1, 0, 1])
    buf.add(**_batch(8, 1))  # the oldest (3, at row 2) goes next
    np.testing.assert_array_equal(buf.reward, [6, 7, 8, 4, 5])
    assert buf.pos == 3 and len(buf) == 5


def test_sample_draws_only_filled_rows():
    buf = ReplayBuffer(100, 2, 4)
    buf.add(**_batch(1, 7))
    s = buf.sample(2000, np.random.default_rng(0))
    assert set(s) == set(FIELDS)
    assert s["obs"].shape == (2000, 2) and s["action"].shape == (2000, 4)
    assert set(np.unique(s["reward"]).tolist()) == set(range(1, 8))  # all 7, never an empty 0
    # fields of one draw belong to the same transition
    np.testing.assert_array_equal(s["obs"][:, 0], s["reward"])
    np.testing.assert_array_equal(s["next_obs"][:, 0], s["reward"] + 0.5)
    np.testing.assert_array_equal(s["action"][:, 0], s["reward"].astype(np.int64) % 3)


def test_empty_sample_raises():
    with pytest.raises(ValueError, match="empty"):
        ReplayBuffer(4, 2, 4).sample(1, np.random.default_rng(0))


@pytest.mark.parametrize("n_added", [3, 12])  # partly filled, and wrapped
def test_state_dict_round_trip(n_added):
    a = ReplayBuffer(8, 2, 4)
    a.add(**_batch(1, n_added))
    sd = a.state_dict()
    assert sd["meta"] == {"pos": a.pos, "size": a.size, "capacity": 8}
    assert sd["arrays"]["replay.reward"].shape == (min(n_added, 8),)

    b = ReplayBuffer(8, 2, 4)
    b.load_state_dict({k: v.copy() for k, v in sd["arrays"].items()}, dict(sd["meta"]))
    assert (b.pos, len(b)) == (a.pos, len(a))
    for f in FIELDS:
        np.testing.assert_array_equal(getattr(b, f)[: len(a)], getattr(a, f)[: len(a)])
    sa, sb = a.sample(64, np.random.default_rng(3)), b.sample(64, np.random.default_rng(3))
    for f in FIELDS:
        np.testing.assert_array_equal(sa[f], sb[f])
    # Both continue identically (the write cursor was restored).
    a.add(**_batch(100, 5))
    b.add(**_batch(100, 5))
    for f in FIELDS:
        np.testing.assert_array_equal(getattr(a, f), getattr(b, f))


def test_load_rejects_other_capacity():
    a = ReplayBuffer(8, 2, 4)
    a.add(**_batch(1, 3))
    sd = a.state_dict()
    with pytest.raises(ValueError, match="capacity"):
        ReplayBuffer(16, 2, 4).load_state_dict(sd["arrays"], sd["meta"])
