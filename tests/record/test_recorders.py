"""Recorders: TensorDictRecorder (round trip through disk), VideoRecorder (real video files,
opened back with the video library), PixelRenderTransform; sync facades and async twins."""

from __future__ import annotations

import sys

import cloudpickle
import pytest
import torch
from tensordict import TensorDict

from aenv import (
    AsyncEnvPool,
    CSVLogger,
    GymEnv,
    ParallelEnv,
    PixelRenderTransform,
    SerialEnv,
    SyncEnv,
    TensorDictRecorder,
    TransformedEnv,
    VideoRecorder,
    acheck_env_specs,
    check_env_specs,
)
from aenv.record import to_video_frame
from aenv.testing import CountingEnv

iio = pytest.importorskip("imageio.v3")
pytestmark = pytest.mark.timeout(120)
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def make_env() -> GymEnv:
    return GymEnv("CartPole-v1", render_mode="rgb_array")


def make_rendering_env() -> GymEnv:
    # the seeds' per-env variant: each sub-env renders its own frames
    return make_env().append_transform(PixelRenderTransform())


def _frames(path) -> list:
    return list(iio.imiter(path))


# ---------------------------------------------------------------- TensorDictRecorder
def test_tensordict_recorder_round_trip_sync(tmp_path):
    recorder = TensorDictRecorder(tmp_path / "steps", skip=2, in_keys=["observation", "reward"])
    env = SyncEnv(TransformedEnv(CountingEnv(max_steps=10), recorder))
    r = env.rollout(6)
    path = recorder.dump()
    assert path.name == "steps_0" and recorder.cache == []
    back = TensorDict.load_memmap(path)
    assert back.batch_size == (3,) and set(back.keys()) == {"observation", "reward"}
    # every second step's output, as the rollout saw it
    assert torch.equal(back["observation"], r["next", "observation"][1::2])
    assert torch.equal(back["reward"], r["next", "reward"][1::2])
    with pytest.raises(RuntimeError, match="nothing"):
        recorder.dump()


async def test_tensordict_recorder_on_a_pool_async(tmp_path):
    recorder = TensorDictRecorder(tmp_path / "pool", skip=1, skip_reset=False)
    async with TransformedEnv(AsyncEnvPool([CountingEnv] * 3), recorder) as env:
        r = await env.rollout(4, break_when_any_done=False)
    path = recorder.dump(suffix="last")
    assert path.name == "pool_last"
    back = TensorDict.load_memmap(path)
    assert back.batch_size == (5, 3)  # the reset and 4 steps, 3 envs each
    assert "reward" not in back[0].keys() and "reward" in back[1].keys()  # a lazy stack
    obs = torch.stack([back[i]["observation"] for i in range(5)])
    assert torch.equal(obs[1:], r["next", "observation"].transpose(0, 1))
    assert obs[0].eq(0).all()


# ---------------------------------------------------------------- VideoRecorder
@pytest.mark.parametrize("per_env", [False, True])
def test_video_recorder_seeds_example_on_a_parallel_env(tmp_path, per_env):
    logger = CSVLogger("dummy", log_dir=tmp_path, video_format="mp4")
    env = ParallelEnv(2, make_rendering_env if per_env else make_env, num_processes=1)
    env.start()
    if not per_env:
        env = env.append_transform(PixelRenderTransform())
    env = env.append_transform(VideoRecorder(logger=logger, tag="pixels_record"))
    try:
        env.rollout(3)
        check_env_specs(env)
        r = env.rollout(5)
        assert r["pixels"].shape == (2, 5, 400, 600, 3)
        path = env.transform[-1].dump()
    finally:
        env.close()
    assert path == tmp_path / "dummy" / "videos" / "pixels_record_0.mp4"
    frames = _frames(path)
    # resets and steps of the three rollouts: (1 + 3) + (1 + 3) + (1 + 5)
    assert len(frames) == 14
    assert frames[0].shape == (400, 1200, 3)  # the 2 envs side by side


async def test_video_recorder_chw_floats_on_a_thread_pool_async(tmp_path):
    logger = CSVLogger("exp", log_dir=tmp_path, video_format="mp4", video_fps=10)
    pool = AsyncEnvPool(
        [lambda: GymEnv("CartPole-v1", render_mode="rgb_array")] * 3, backend="thread"
    )
    # frames as CHW floats in [0, 1], small, from the pool's own renders
    shrink = lambda im: im[::8, ::8].permute(2, 0, 1).float() / 255  # noqa: E731
    # inside a running loop a pool's frame shape is given (no probe frame there)
    env = TransformedEnv(
        pool, PixelRenderTransform(preproc=shrink, shape=(3, 50, 75), dtype=torch.float32)
    )
    env.append_transform(VideoRecorder(logger, "chw"))
    async with env:
        await acheck_env_specs(env)
        r = await env.rollout(4, break_when_any_done=False)
        assert r["pixels"].shape == (3, 4, 3, 50, 75) and r["pixels"].dtype == torch.float32
        path = env.transform[-1].dump()
    frames = _frames(path)
    assert len(frames) == 4 + 5  # check_env_specs' reset and 3 steps, then 1 + 4
    # 3 images tiled 2 x 2 (100 x 150), one black tile
    assert frames[-1].shape == (100, 150, 3)
    # (lossy codec: compare means) CartPole renders on white
    assert frames[-1][55:, 80:].mean() < 10 and frames[-1][:50, :75].mean() > 150


def test_video_frames_layouts_and_odd_sizes(tmp_path):
    hwc = torch.randint(0, 255, (2, 17, 21, 3), dtype=torch.uint8)
    chw = hwc.permute(0, 3, 1, 2)
    assert torch.equal(to_video_frame(hwc), to_video_frame(chw))
    assert to_video_frame(hwc).shape == (3, 17, 42)
    with pytest.raises(ValueError, match="make_grid"):
        to_video_frame(hwc, make_grid=False)
    with pytest.raises(ValueError, match="channel"):
        to_video_frame(torch.zeros(5, 7, 9))
    logger = CSVLogger("odd", log_dir=tmp_path, video_format="mp4")
    video = torch.stack([to_video_frame(hwc)] * 6)
    path = logger.log_video("odd", video, step=3)
    frames = _frames(path)
    assert path.name == "odd_3.mp4" and len(frames) == 6
    assert frames[0].shape == (18, 42, 3)  # padded to even sizes for H.264
    pt = CSVLogger("pt", log_dir=tmp_path).log_video("raw", video)
    assert torch.equal(torch.load(pt), video)


def test_video_recorder_skip_and_errors(tmp_path):
    with SerialEnv(2, make_rendering_env) as base:
        recorder = VideoRecorder(CSVLogger("s", log_dir=tmp_path, video_format="mp4"), "s", skip=2)
        env = base.append_transform(recorder)
        env.rollout(6)
        assert len(recorder.frames) == 1 + 3  # the reset, then steps 2, 4 and 6
        assert len(_frames(recorder.dump())) == 4
    with pytest.raises(RuntimeError, match="no frame"):
        recorder.dump()
    with pytest.raises(TypeError, match="log_video"):
        VideoRecorder(object(), "x")


# ---------------------------------------------------------------- PixelRenderTransform
async def test_pixel_render_transform_errors_async():
    with pytest.raises(RuntimeError, match="rgb_array"):
        TransformedEnv(GymEnv("CartPole-v1"), PixelRenderTransform())
    pool = AsyncEnvPool([CountingEnv] * 2, backend="thread")
    async with pool:
        with pytest.raises(RuntimeError, match="shape="):
            TransformedEnv(pool, PixelRenderTransform())  # no probe inside a running loop
