from __future__ import annotations

import string

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces
from hypothesis import given, settings
from hypothesis import strategies as st

from aenv.exceptions import SpecError
from aenv.specs import (
    Binary,
    Bounded,
    Categorical,
    Composite,
    MultiCategorical,
    MultiOneHot,
    NonTensor,
    OneHot,
    Unbounded,
    from_gym_space,
    to_gym_space,
)


def _same_space(a, b):
    assert type(a) is type(b)
    if isinstance(a, spaces.Box):
        assert a.shape == b.shape and a.dtype == b.dtype
        np.testing.assert_array_equal(a.low, b.low)
        np.testing.assert_array_equal(a.high, b.high)
    else:
        assert a == b


class TestFromGym:
    def test_box(self):
        spec = from_gym_space(spaces.Box(-1.0, 2.0, shape=(3,), dtype=np.float32))
        assert isinstance(spec, Bounded)
        assert spec.shape == torch.Size([3]) and spec.dtype == torch.float32
        assert spec.low.tolist() == [-1.0] * 3

    def test_float64_box(self):
        spec = from_gym_space(spaces.Box(0.0, 1.0, shape=(2,), dtype=np.float64))
        assert spec.dtype == torch.float64

    def test_infinite_box_is_unbounded(self):
        spec = from_gym_space(spaces.Box(-np.inf, np.inf, shape=(4,)))
        assert isinstance(spec, Unbounded)
        half = from_gym_space(
            spaces.Box(np.array([0.0, -np.inf]), np.array([np.inf, np.inf]), dtype=np.float64)
        )
        assert isinstance(half, Bounded)

    def test_uint8_image_box(self):
        spec = from_gym_space(spaces.Box(0, 255, shape=(4, 4, 3), dtype=np.uint8))
        assert spec.dtype == torch.uint8 and spec.high.max().item() == 255

    def test_discrete(self):
        spec = from_gym_space(spaces.Discrete(4))
        assert isinstance(spec, OneHot) and spec.shape == torch.Size([4])
        cat = from_gym_space(spaces.Discrete(4), categorical_action_encoding=True)
        assert isinstance(cat, Categorical) and cat.shape == torch.Size([]) and cat.n == 4

    def test_multi_discrete(self):
        spec = from_gym_space(spaces.MultiDiscrete([2, 3]))
        assert isinstance(spec, MultiOneHot) and spec.shape == torch.Size([5])
        cat = from_gym_space(spaces.MultiDiscrete([2, 3]), categorical_action_encoding=True)
        assert isinstance(cat, MultiCategorical) and cat.nvec.tolist() == [2, 3]
        # a grid of values: an integer box, bounds from start and nvec, the space kept
        grid = spaces.MultiDiscrete([[2, 3], [3, 2]], start=[[1, 0], [0, 5]], dtype=np.int8)
        spec = from_gym_space(grid)
        assert isinstance(spec, Bounded) and spec.shape == torch.Size([2, 2])
        assert spec.dtype == torch.int8
        assert spec.high.tolist() == [[2, 2], [2, 6]]
        assert to_gym_space(spec) == grid

    def test_multi_binary(self):
        spec = from_gym_space(spaces.MultiBinary(5))
        assert isinstance(spec, Binary) and spec.n == 5 and spec.dtype == torch.int8

    def test_dict_tuple_text(self):
        space = spaces.Dict(
            {
                "pos": spaces.Box(-1, 1, (2,)),
                "nested": spaces.Tuple((spaces.Discrete(3), spaces.Text(8))),
            }
        )
        spec = from_gym_space(space, categorical_action_encoding=True)
        assert isinstance(spec, Composite)
        assert isinstance(spec["nested", "0"], Categorical)
        assert isinstance(spec["nested", "1"], NonTensor)
        assert spec["nested", "1"].example_data == ""
        assert spec.is_in(spec.rand())

    def test_batch_size(self):
        space = spaces.Dict({"a": spaces.Box(-1, 1, (2,)), "b": spaces.Discrete(3)})
        spec = from_gym_space(space, batch_size=(4,))
        assert spec.shape == torch.Size([4])
        assert spec["a"].shape == torch.Size([4, 2])
        assert spec["b"].shape == torch.Size([4, 3])
        assert spec.rand().batch_size == torch.Size([4])

    def test_sample_from_gym_is_in_spec(self):
        space = spaces.Box(-2, 3, shape=(3,), dtype=np.float32)
        spec = from_gym_space(space)
        for _ in range(10):
            assert spec.is_in(spec.encode(space.sample()))

    def test_unknown_space(self):
        with pytest.raises(SpecError, match="no spec for gymnasium space"):
            from_gym_space(object())

    @pytest.mark.parametrize(
        "space",
        [
            spaces.Graph(spaces.Box(0, 1, (1,)), None),
            spaces.Sequence(spaces.Discrete(3)),
            spaces.OneOf([spaces.Discrete(2), spaces.Box(0, 1, (2,))]),
        ],
    )
    def test_variable_sized_spaces_are_non_tensor(self, space):
        spec = from_gym_space(space, batch_size=(3,))
        assert isinstance(spec, NonTensor) and spec.shape == torch.Size([3])
        assert to_gym_space(spec[0]) == space
        # batched, as gymnasium batches them: a Tuple of the space
        assert to_gym_space(spec) == gym.vector.utils.batch_space(space, 3)

    def test_bool_box(self):
        space = spaces.Box(np.array([0, 0, 1]), np.array([1, 0, 1]), dtype=np.bool_)
        spec = from_gym_space(space)
        assert isinstance(spec, Categorical) and spec.dtype == torch.bool
        assert to_gym_space(spec) == space
        value = spec.to_numpy(spec.rand())
        assert value.dtype == np.bool_

    def test_to_numpy_feeds_gym(self):
        space = spaces.Dict({"a": spaces.Box(-1, 1, (2,)), "b": spaces.MultiBinary(3)})
        spec = from_gym_space(space)
        sample = spec.to_numpy(spec.rand())
        assert space.contains(sample)


class TestToGym:
    def test_batched_discrete(self):
        space = to_gym_space(Categorical(3, shape=(2,)))
        assert space == spaces.MultiDiscrete([3, 3])
        assert to_gym_space(OneHot(3, shape=(2, 3))) == spaces.MultiDiscrete([3, 3])

    def test_unbounded_int(self):
        space = to_gym_space(Unbounded((2,), dtype=torch.int32))
        assert space.dtype == np.int32

    def test_non_text_non_tensor(self):
        with pytest.raises(SpecError):
            to_gym_space(NonTensor(example_data=3))
        assert isinstance(to_gym_space(NonTensor(example_data="")), spaces.Text)


ROUND_TRIP = [
    spaces.Box(-1.0, 1.0, (3,), dtype=np.float32),
    spaces.Box(np.array([0.0, -2.0]), np.array([1.0, 5.0]), dtype=np.float64),
    spaces.Box(-np.inf, np.inf, (2, 2), dtype=np.float32),
    spaces.Box(0, 255, (2, 3), dtype=np.uint8),
    spaces.Discrete(5),
    spaces.Discrete(5, start=2),
    spaces.MultiDiscrete([2, 3, 4]),
    spaces.MultiBinary(4),
    spaces.MultiBinary([2, 3]),
    spaces.Text(12, min_length=2, charset="abc"),
    spaces.Dict({"b": spaces.Discrete(2), "a": spaces.Box(0, 1, (1,))}),
    spaces.Tuple((spaces.Discrete(2), spaces.Box(0, 1, (1,)), spaces.Text(5))),
    spaces.Dict(
        {"t": spaces.Tuple((spaces.MultiBinary(2), spaces.Dict({"x": spaces.Discrete(3)})))}
    ),
]


@pytest.mark.parametrize("space", ROUND_TRIP, ids=lambda s: type(s).__name__)
@pytest.mark.parametrize("categorical", [False, True])
def test_round_trip(space, categorical):
    spec = from_gym_space(space, categorical_action_encoding=categorical)
    back = to_gym_space(spec)
    if not isinstance(space, (spaces.Dict, spaces.Tuple)):
        _same_space(back, space)
    assert back == space
    assert spec.is_in(spec.rand())


@st.composite
def boxes(draw):
    shape = tuple(draw(st.lists(st.integers(1, 3), min_size=0, max_size=3)))
    dtype = draw(st.sampled_from([np.float32, np.float64, np.int32, np.uint8]))
    if np.issubdtype(dtype, np.integer):
        lo = draw(st.integers(0, 50))
        hi = draw(st.integers(lo, 200))
    else:
        lo = draw(st.floats(-1e6, 1e6))
        hi = draw(st.floats(lo, 1e6 + 1))
    return spaces.Box(lo, hi, shape=shape, dtype=dtype)


@st.composite
def gym_spaces(draw, depth=0):
    kinds = ["box", "discrete", "multidiscrete", "multibinary", "text"]
    if depth < 2:
        kinds += ["dict", "tuple"]
    kind = draw(st.sampled_from(kinds))
    if kind == "box":
        return draw(boxes())
    if kind == "discrete":
        return spaces.Discrete(draw(st.integers(1, 10)), start=draw(st.integers(-3, 3)))
    if kind == "multidiscrete":
        return spaces.MultiDiscrete(draw(st.lists(st.integers(1, 5), min_size=1, max_size=4)))
    if kind == "multibinary":
        return spaces.MultiBinary(draw(st.integers(1, 6)))
    if kind == "text":
        lo = draw(st.integers(0, 4))
        chars = draw(st.text(string.ascii_letters, min_size=1, max_size=5))
        return spaces.Text(draw(st.integers(lo, 10)), min_length=lo, charset=chars)
    children = draw(st.lists(gym_spaces(depth=depth + 1), min_size=1, max_size=3))
    if kind == "tuple":
        return spaces.Tuple(children)
    return spaces.Dict({f"k{i}": c for i, c in enumerate(children)})


@settings(max_examples=60, deadline=None)
@given(space=gym_spaces(), categorical=st.booleans())
def test_round_trip_property(space, categorical):
    spec = from_gym_space(space, categorical_action_encoding=categorical)
    assert to_gym_space(spec) == space
    assert spec.is_in(spec.rand())


@settings(max_examples=40, deadline=None)
@given(space=boxes(), batch=st.lists(st.integers(1, 3), max_size=2))
def test_box_batch_preserves_bounds(space, batch):
    spec = from_gym_space(space, batch_size=batch)
    assert spec.shape == torch.Size([*batch, *space.shape])
    assert spec.dtype == torch.from_numpy(np.zeros(0, space.dtype)).dtype
    if isinstance(spec, Bounded):
        np.testing.assert_array_equal(spec.low.numpy(), np.broadcast_to(space.low, spec.shape))
        np.testing.assert_array_equal(spec.high.numpy(), np.broadcast_to(space.high, spec.shape))
    assert spec.is_in(spec.rand())


def test_gym_env_spaces():
    env = gym.make("CartPole-v1")
    try:
        obs_spec = from_gym_space(env.observation_space)
        act_spec = from_gym_space(env.action_space, categorical_action_encoding=True)
        obs, _ = env.reset(seed=0)
        assert obs_spec.is_in(obs_spec.encode(obs))
        env.step(int(act_spec.rand()))
    finally:
        env.close()
