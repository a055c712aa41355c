"""Text in TensorDicts: the spec shorthand, one accessor on every path, dense stacking."""

from __future__ import annotations

from functools import partial

import pytest
import torch
from tensordict import NonTensorData, NonTensorStack, TensorDict

from aenv import AsyncEnvPool, NonTensor
from aenv.llm import ChatEnv, Text, get_data, get_text
from aenv.testing import TextEnv

BACKENDS = ["coroutine", "thread", "process"]
PROCESS = {"num_workers": 2, "start_method": "forkserver"}


def options(backend):
    return PROCESS if backend == "process" else {}


def test_text_spec_shorthand():
    spec = Text()
    assert isinstance(spec, NonTensor) and spec.shape == torch.Size([])
    assert spec.zero().data == ""
    assert Text((3,), example="a").zero().tolist() == ["a", "a", "a"]
    # the example takes no part in equality: specs of different prompts are the same spec
    assert Text(example="p0") == Text(example="p1")
    assert torch.stack([Text(example="a"), Text(example="b")]) == Text((2,))


def test_get_text_on_every_shape():
    assert get_text(TensorDict(p=NonTensorData("hi")), "p") == "hi"
    td = TensorDict(p=NonTensorStack.from_list(["a", "b"]), batch_size=[2])
    assert get_text(td, "p") == ["a", "b"] and get_text(td[1], "p") == "b"
    one = TensorDict(p=NonTensorStack.from_list(["x"]), batch_size=[1])
    assert get_text(one, "p") == ["x"]  # a one-element batch is still a list
    nested = TensorDict(
        p=NonTensorStack(
            *(NonTensorStack.from_list([f"{i}{j}" for j in range(3)]) for i in range(2))
        ),
        batch_size=[2, 3],
    )
    assert get_text(nested, "p") == [["00", "01", "02"], ["10", "11", "12"]]
    shared = TensorDict(p=NonTensorData("s", batch_size=[2]), batch_size=[2])
    assert get_text(shared, "p") == ["s", "s"]


def test_get_text_errors_name_the_key():
    with pytest.raises(KeyError, match="'nope'"):
        get_text(TensorDict(p=NonTensorData("hi")), "nope")
    with pytest.raises(TypeError, match=r"'n'.*str"):
        get_text(TensorDict(n=NonTensorData(3)), "n")
    with pytest.raises(TypeError, match="'x'"):
        get_text(TensorDict(x=torch.zeros(2)), "x")
    assert get_data(TensorDict(n=NonTensorData({"a": 1})), "n") == {"a": 1}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("backend", BACKENDS)
async def test_same_answers_on_every_path(backend):
    """Reset, step, a streamed row, a rollout: str for one env, lists for batches."""
    env = TextEnv(prompt="p")
    td = await env.reset()
    assert get_text(td, "history") == "p"
    td["action"] = NonTensorData("hi")
    assert get_text((await env.step(td))["next"], "history") == "p hi"

    fns = [partial(TextEnv, prompt=f"p{i}") for i in range(3)]
    async with AsyncEnvPool(fns, backend=backend, **options(backend)) as pool:
        td = await pool.reset()
        assert get_text(td, "history") == ["p0", "p1", "p2"]
        assert get_text(td[2], "history") == "p2"
        td["action"] = NonTensorStack.from_list(["a", "b", "c"])
        out = await pool.step(td)
        assert get_text(out["next"], "history") == ["p0 a", "p1 b", "p2 c"]
        assert get_text(out[1]["next"], "history") == "p1 b"
        pool.async_step_send(pool.step_mdp(out).set("action", ["x", "y", "z"]), env_index=[0, 1, 2])
        got = {}
        while len(got) < 3:
            row = await pool.async_step_recv(min_get=1, max_get=1)
            (i,) = row["env_index"].tolist()
            got[i] = get_text(row["next"], "history")  # a batch of one: a list of one
        assert got == {0: ["p0 a x"], 1: ["p1 b y"], 2: ["p2 c z"]}
        ro = await pool.rollout(2, break_when_any_done=False)
        assert get_text(ro["next"], "history")[1] == ["p1 word", "p1 word word"]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("backend", ["coroutine", "process"])
async def test_64_envs_with_different_prompts_stack_densely(backend):
    fns = [partial(ChatEnv, prompt=f"prompt {i}") for i in range(64)]
    async with AsyncEnvPool(fns, backend=backend, stack="dense", **options(backend)) as pool:
        assert isinstance(pool.observation_spec["prompt"], NonTensor)
        assert pool.observation_spec["prompt"].shape == torch.Size([64])
        td = await pool.reset()
        assert get_text(td, "prompt") == [f"prompt {i}" for i in range(64)]
        td["response"] = NonTensorStack.from_list([f"reply {i}" for i in range(64)])
        out = await pool.step(td)
        hist = get_data(out["next"], "history")
        assert [h[-1].content for h in hist] == [f"reply {i}" for i in range(64)]
        assert [h[0].content for h in hist] == [f"prompt {i}" for i in range(64)]
