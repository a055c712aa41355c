"""Whole trajectories from collectors (trajs_per_batch, traj_format), background collection
(start / async_shutdown) and split_trajectories(as_nested=...)."""

from __future__ import annotations

import threading

import pytest
import torch

from aenv import Collector, SerialEnv, SyncDataCollector, split_trajectories
from aenv.collectors._trajs import TrajectoryBatcher
from aenv.testing import CountingEnv

pytestmark = pytest.mark.timeout(60)


def lengths_env():
    """Episodes of 3 steps (env 0) and 5 steps (env 1) in one SerialEnv."""
    return SerialEnv(2, [lambda: CountingEnv(max_steps=3), lambda: CountingEnv(max_steps=5)])


def test_padded_trajectories_are_complete_and_joined_across_batches():
    c = SyncDataCollector(lengths_env(), None, frames_per_batch=4, total_frames=40,
                          trajs_per_batch=3)  # fmt: skip
    batches = list(c)
    assert batches
    for b in batches:
        assert b.batch_size[0] == 3 and b.names[-1] == "time"
        mask = b["collector", "mask"]
        length = mask.sum(-1)
        assert set(length.tolist()) <= {3, 5}  # every trajectory whole, none cut at a batch
        obs = b["next", "observation"].squeeze(-1)
        for row, n in zip(obs, length.tolist(), strict=True):
            assert row[:n].tolist() == [float(i) for i in range(1, n + 1)]
            assert row[n:].eq(0).all()  # zero padding
        done = b["next", "done"].squeeze(-1)
        assert done[torch.arange(3), length - 1].all()
        ids = b["collector", "traj_ids"]
        assert all(ids[i, : length[i]].unique().numel() == 1 for i in range(3))
    c.shutdown()


def test_cat_format_and_argument_checks():
    c = SyncDataCollector(lengths_env(), None, frames_per_batch=4, total_frames=40,
                          trajs_per_batch=2, traj_format="cat")  # fmt: skip
    b = next(iter(c))
    done = b["next", "done"].squeeze(-1)
    assert b.ndim == 1 and int(done.sum()) == 2 and bool(done[-1])
    assert b.numel() in (6, 8, 10)
    c.shutdown()
    with pytest.raises(ValueError, match="trajs_per_batch"):
        Collector(CountingEnv(), None, frames_per_batch=4, traj_format="cat")
    with pytest.raises(ValueError, match="traj_format"):
        TrajectoryBatcher(2, "ragged")


def test_frames_running_out_end_the_iteration():
    # 12 frames of 5-step episodes: two whole ones, the third cut off and dropped
    c = SyncDataCollector(lambda: CountingEnv(max_steps=5), None, frames_per_batch=4,
                          total_frames=12, trajs_per_batch=1)  # fmt: skip
    assert [int(b["collector", "mask"].sum()) for b in c] == [5, 5]
    c.shutdown()
    # 3-step episodes, 2 per batch: 4 whole ones in 16 frames (and a lone 5th, dropped)
    c = SyncDataCollector(lambda: CountingEnv(max_steps=3), None, frames_per_batch=16,
                          total_frames=16, trajs_per_batch=2)  # fmt: skip
    assert [tuple(b.batch_size) for b in c] == [(2, 3), (2, 3)]
    c.shutdown()


async def test_async_collector_hands_out_trajectories():
    async with Collector(CountingEnv(max_steps=2), None, frames_per_batch=3, total_frames=12,
                         trajs_per_batch=2) as c:  # fmt: skip
        sizes = [tuple(b.batch_size) async for b in c]
    assert sizes and all(s == (2, 2) for s in sizes)


def test_start_and_async_shutdown_fill_a_buffer_in_the_background():
    class Buffer:
        def __init__(self):
            self.items = []
            self.first = threading.Event()

        def extend(self, data):
            self.items.append(data)
            self.first.set()

    buf = Buffer()
    c = SyncDataCollector(lambda: CountingEnv(max_steps=3), None, frames_per_batch=6,
                          total_frames=-1, replay_buffer=buf)  # fmt: skip
    c.start()
    assert buf.first.wait(30)
    c.async_shutdown(timeout=30)
    assert all(b.batch_size == (6,) for b in buf.items)
    assert c.collector._closed
    with pytest.raises(RuntimeError, match="replay_buffer"):
        SyncDataCollector(CountingEnv(), None, frames_per_batch=2).start()


def test_split_trajectories_as_nested_matches_padded():
    c = SyncDataCollector(lengths_env(), None, frames_per_batch=16, total_frames=16)
    data = next(iter(c))
    c.shutdown()
    padded = split_trajectories(data)
    nested = split_trajectories(data, as_nested=True)
    assert nested.batch_size[0] == padded.batch_size[0]
    assert nested["next", "observation"].is_nested
    back = nested["next", "observation"].to_padded_tensor(0.0)
    assert torch.equal(back, padded["next", "observation"])
    jagged = split_trajectories(data, as_nested=torch.jagged)
    assert jagged["collector", "mask"].layout == torch.jagged
