"""Pixel transforms: ToTensorImage, Resize, GrayScale, CenterCrop, Crop (and pixel pipelines)."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

import aenv
from aenv.envs import EnvBase
from aenv.specs import Bounded, Categorical, Composite
from aenv.transforms import (
    CatFrames,
    CenterCrop,
    Compose,
    Crop,
    FlattenObservation,
    GrayScale,
    Resize,
    ToTensorImage,
    TransformedEnv,
)


class PixelEnv(EnvBase):
    """Emits uint8 (H, W, 3) images; pixel (i, j, c) of step t is (t + 10 i + j + 100 c) % 256."""

    def __init__(self, h: int = 12, w: int = 16, batch_size: tuple[int, ...] = ()) -> None:
        super().__init__(batch_size=batch_size)
        bs = self.batch_size
        self.h, self.w = h, w
        self.observation_spec = Composite(
            pixels=Bounded(0, 255, shape=(*bs, h, w, 3), dtype=torch.uint8), shape=bs
        )
        self.action_spec = Categorical(2, shape=(*bs, 1))
        self.t = torch.zeros(bs, dtype=torch.int64)

    def image(self) -> torch.Tensor:
        i = torch.arange(self.h).view(-1, 1, 1)
        j = torch.arange(self.w).view(1, -1, 1)
        c = torch.arange(3).view(1, 1, -1)
        base = 10 * i + j + 100 * c
        t = self.t.view(*self.batch_size, 1, 1, 1)
        return ((base + t) % 256).to(torch.uint8)

    def _reset(self, td):
        mask = td.get("_reset", None) if td is not None else None
        if mask is None:
            self.t = torch.zeros_like(self.t)
        else:
            self.t = torch.where(mask.reshape(self.t.shape), 0, self.t)
        return TensorDict(pixels=self.image(), batch_size=self.batch_size)

    def _step(self, td):
        self.t = self.t + 1
        return TensorDict(
            pixels=self.image(), reward=torch.ones(*self.batch_size, 1), batch_size=self.batch_size
        )

    def _set_seed(self, seed):
        pass


@pytest.mark.parametrize("batch_size", [(), (2,)])
async def test_to_tensor_image(batch_size):
    base = PixelEnv(batch_size=batch_size)
    env = TransformedEnv(PixelEnv(batch_size=batch_size), ToTensorImage())
    spec = env.observation_spec["pixels"]
    assert spec.shape == (*batch_size, 3, 12, 16) and spec.dtype == torch.float32
    assert isinstance(spec, Bounded) and float(spec.high.max()) == 1.0
    td = await env.reset()
    raw = (await base.reset())["pixels"]
    torch.testing.assert_close(td["pixels"], raw.permute(*range(len(batch_size)), -1, -3, -2) / 255)
    await aenv.acheck_env_specs(env)


async def test_to_tensor_image_float_input_not_scaled_and_unsqueeze():
    t = ToTensorImage(unsqueeze=True)
    td = TensorDict(pixels=torch.full((4, 5, 3), 0.5))
    out = t(td)["pixels"]
    assert out.shape == (1, 3, 4, 5)
    assert torch.all(out == 0.5)
    tolerant = ToTensorImage(shape_tolerant=True)
    assert tolerant(TensorDict(pixels=torch.zeros(3, 4, 5, dtype=torch.uint8)))["pixels"].shape == (
        3,
        4,
        5,
    )


@pytest.mark.parametrize("interpolation", ["bilinear", "bicubic", "nearest", "area"])
async def test_resize(interpolation):
    env = TransformedEnv(
        PixelEnv(batch_size=(2,)),
        Compose(ToTensorImage(), Resize(8, 6, interpolation=interpolation)),
    )
    assert env.observation_spec["pixels"].shape == (2, 3, 8, 6)  # (C, w, h), as TorchRL
    td = await env.reset()
    assert td["pixels"].shape == (2, 3, 8, 6)
    assert float(td["pixels"].min()) >= 0.0 and float(td["pixels"].max()) <= 1.0
    await aenv.acheck_env_specs(env)


def test_resize_values_and_uint8():
    # a constant image stays constant; uint8 keeps its dtype
    img = torch.full((2, 5, 3, 10, 10), 7, dtype=torch.uint8)
    out = Resize(4)(TensorDict(pixels=img, batch_size=[2]))["pixels"]
    assert out.dtype == torch.uint8 and out.shape == (2, 5, 3, 4, 4)
    assert torch.all(out == 7)
    # upsampling by 2 with "nearest" repeats pixels
    x = torch.arange(4.0).view(1, 2, 2)
    up = Resize(4, 4, interpolation="nearest")._apply_transform(x)
    torch.testing.assert_close(up, x.repeat_interleave(2, -1).repeat_interleave(2, -2))
    with pytest.raises(ValueError):
        Resize(4, interpolation="lanczos")


async def test_grayscale():
    env = TransformedEnv(PixelEnv(), Compose(ToTensorImage(), GrayScale()))
    assert env.observation_spec["pixels"].shape == (1, 12, 16)
    td = await env.reset()
    rgb = (await PixelEnv().reset())["pixels"].permute(2, 0, 1).float() / 255
    expected = 0.2989 * rgb[0] + 0.587 * rgb[1] + 0.114 * rgb[2]
    torch.testing.assert_close(td["pixels"][0], expected)
    await aenv.acheck_env_specs(env)
    # uint8 stays uint8 (channels-first input)
    out = GrayScale()(TensorDict(pixels=torch.full((3, 2, 2), 200, dtype=torch.uint8)))["pixels"]
    assert out.dtype == torch.uint8 and torch.all(out == 200)


async def test_crops():
    env = TransformedEnv(PixelEnv(), Compose(ToTensorImage(), Crop(5, 3, top=2, left=4)))
    full = (await TransformedEnv(PixelEnv(), ToTensorImage()).reset())["pixels"]
    td = await env.reset()
    assert td["pixels"].shape == (3, 5, 3)
    torch.testing.assert_close(td["pixels"], full[:, 2:7, 4:7])
    await aenv.acheck_env_specs(env)

    env = TransformedEnv(PixelEnv(), Compose(ToTensorImage(), CenterCrop(8, 4)))
    td = await env.reset()
    torch.testing.assert_close(td["pixels"], full[:, 2:10, 6:10])
    assert env.observation_spec["pixels"].shape == (3, 8, 4)
    await aenv.acheck_env_specs(env)
    with pytest.raises(aenv.SpecError):
        TransformedEnv(PixelEnv(), Compose(ToTensorImage(), CenterCrop(40)))


async def test_pixel_pipeline_with_frames_and_parent():
    transform = Compose(
        ToTensorImage(), GrayScale(), Resize(8, 8), CatFrames(4, -3), FlattenObservation(-3, -1)
    )
    env = TransformedEnv(PixelEnv(batch_size=(3,)), transform)
    assert env.observation_spec["pixels"].shape == (3, 4 * 8 * 8)
    await aenv.acheck_env_specs(env)
    r = await env.rollout(3)
    assert r["next", "pixels"].shape == (3, 3, 256)
    # parent: the env up to (not including) the last transform
    parent = env.transform[-1].parent
    assert parent.observation_spec["pixels"].shape == (3, 4, 8, 8)
    assert len(parent.transform) == 4


async def test_seed_example_on_gym_pixels():
    gym = pytest.importorskip("aenv.libs.gym")
    try:
        base = gym.GymEnv("CartPole-v1", from_pixels=True)
    except Exception as exc:  # rendering needs pygame
        pytest.skip(f"no pixel CartPole here: {exc}")
    env = TransformedEnv(
        base, Compose(ToTensorImage(in_keys=["pixels"]), Resize(64, 64, in_keys=["pixels"]))
    )
    td = await env.reset()
    assert td["pixels"].shape == (3, 64, 64) and td["pixels"].dtype == torch.float32
    resize_parent = env.transform[-1].parent
    assert resize_parent.observation_spec["pixels"].shape == (3, 400, 600)
    await aenv.acheck_env_specs(env)
    await env.aclose()
