"""History: immutable, append-only, JSON round trip, rendering, no aliasing in rollouts."""

from __future__ import annotations

import dataclasses
import pickle
from functools import partial

import pytest
from tensordict import NonTensorData, NonTensorStack, TensorDict

from aenv import AsyncEnvPool
from aenv.llm import GuessNumberEnv, History, Message, ToolCall, get_data, render_plain


def sample() -> History:
    call = ToolCall.create("add", {"b": 2, "a": 1}, id="c1")
    return (
        History()
        .add("system", "be brief")
        .add("user", "1+2?")
        .add("assistant", "", tool_calls=(call,))
        .add("tool", "3", tool_call_id="c1", name="add")
        .add("tool", "boom", tool_call_id="c2", name="x", is_error=True)
        .add("assistant", "3")
    )


def test_append_only_and_immutable():
    h0 = History().add("user", "hi")
    h1 = h0.add("assistant", "hello")
    assert (len(h0), len(h1)) == (1, 2) and h1[:1] == h0
    with pytest.raises(dataclasses.FrozenInstanceError):
        h0.messages = ()  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        h1[0].content = "changed"  # type: ignore[misc]
    call = ToolCall.create("f", {"xs": [1, 2]})
    args = call.arguments
    args["xs"].append(3)  # a copy: the call itself cannot change
    assert call.arguments == {"xs": [1, 2]}


def test_bad_messages_are_refused():
    with pytest.raises(ValueError, match="role"):
        Message("robot", "x")
    with pytest.raises(TypeError, match="content"):
        Message("user", 3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="Message"):
        History().append("text")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="list"):
        History.from_json('{"role": "user"}')


def test_json_and_pickle_round_trip():
    h = sample()
    back = History.from_json(h.to_json())
    assert back == h
    assert back[2].tool_calls[0].arguments == {"a": 1, "b": 2}
    assert back[4].is_error and not back[3].is_error
    assert pickle.loads(pickle.dumps(h)) == h


def test_openai_form():
    wire = sample().to_openai()
    assert wire[2]["tool_calls"][0] == {
        "id": "c1",
        "type": "function",
        "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'},
    }
    assert wire[3] == {"role": "tool", "content": "3", "tool_call_id": "c1", "name": "add"}
    assert History.from_list(wire)[2].tool_calls == sample()[2].tool_calls


def test_plain_rendering():
    text = render_plain(sample())
    assert text.startswith("<|system|>\nbe brief\n<|user|>\n1+2?\n<|assistant|>\n")
    assert '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>' in text
    assert "<|tool|> x (error)\nboom\n" in text
    assert text.endswith("<|assistant|>\n3\n<|assistant|>\n")
    assert not sample().render(add_generation_prompt=False).endswith("<|assistant|>\n")
    with pytest.raises(TypeError, match="apply_chat_template"):
        sample().render(tokenizer=object())


def test_transformers_chat_template():
    transformers = pytest.importorskip("transformers")
    tokenizers = pytest.importorskip("tokenizers")
    vocab = {"[UNK]": 0, "hi": 1}
    raw = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    tok = transformers.PreTrainedTokenizerFast(tokenizer_object=raw)
    tok.chat_template = (
        "{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}{% endfor %}"
        "{% if add_generation_prompt %}[assistant]{% endif %}"
    )
    h = History().add("user", "hi").add("assistant", "yo")
    assert h.render(tok) == "[user]hi[assistant]yo[assistant]"


def test_histories_stack_without_aliasing():
    hs = [History().add("user", f"q{i}") for i in range(3)]
    td = TensorDict(h=NonTensorStack.from_list(hs), batch_size=[3])
    later = [h.add("assistant", "a") for h in get_data(td, "h")]
    assert [len(h) for h in get_data(td, "h")] == [1, 1, 1]
    assert [len(h) for h in later] == [2, 2, 2]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("backend", ["coroutine", "process"])
async def test_first_history_of_a_rollout_is_unchanged_by_later_steps(backend):
    """The env keeps one growing history and hands it out each step: a mutable list would
    rewrite step 0 of the rollout by the end of it."""
    opts = {"num_workers": 1, "start_method": "forkserver"} if backend == "process" else {}
    fns = [partial(GuessNumberEnv, low=1, high=100, max_turns=5)] * 2
    async with AsyncEnvPool(fns, backend=backend, **opts) as pool:
        start = TensorDict(answer=NonTensorStack.from_list([99, 98]), batch_size=[2])
        td = await pool.reset(start)
        steps = []
        for guess in ("10", "20", "30"):
            td["response"] = NonTensorStack.from_list([guess, guess])
            out = await pool.step(td)
            steps.append(out)
            td = pool.step_mdp(out)
    first = get_data(steps[0]["next"], "history")
    assert [len(h) for h in first] == [3, 3]  # user prompt, guess, "higher"
    assert [m.content for m in first[0]][1:] == ["10", "higher"]
    last = get_data(steps[-1]["next"], "history")
    assert [len(h) for h in last] == [7, 7]
    assert last[0][:3] == first[0]


async def test_env_rollout_keeps_each_steps_history():
    env = GuessNumberEnv(low=1, high=8, max_turns=8)
    guesses = iter(["1", "2", "3", "4", "5", "6", "7", "8"])

    def policy(td):
        return td.set("response", NonTensorData(next(guesses)))

    ro = await env.rollout(8, policy, tensordict=None)
    hist = get_data(ro["next"], "history")
    assert [len(h) for h in hist] == [3 + 2 * t for t in range(len(hist))]
    assert ro["next", "reward"][-1].item() == 1.0 and hist[-1][-1].content == "correct"


def word_tokenizer():
    transformers = pytest.importorskip("transformers")
    tokenizers = pytest.importorskip("tokenizers")
    words = ["[UNK]", "[", "]", "user", "assistant", "2", "+", "?", "4", "five"]
    raw = tokenizers.Tokenizer(
        tokenizers.models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]")
    )
    raw.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok = transformers.PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="[UNK]")
    tok.chat_template = (
        "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }} {% endfor %}"
        "{% if add_generation_prompt %}[assistant]{% endif %}"
    )
    return tok


async def test_chat_env_token_mode():
    from aenv.llm import ChatEnv

    tok = word_tokenizer()
    env = ChatEnv(
        mode="tokens", tokenizer=tok, scorer=lambda h, answer: float(h[-1].content == answer)
    )
    td = await env.reset(TensorDict(prompt=NonTensorData("2 + 2 ?"), answer=NonTensorData("4")))
    ids = get_data(td, "prompt_tokens")
    # "[user] 2 + 2 ? [assistant]": the chat template's text, word by word
    assert ids == (1, 3, 2, 5, 6, 5, 7, 1, 4, 2)
    td["response_tokens"] = NonTensorData((8,))  # "4"
    out = await env.step(td)
    assert out["next", "reward"].item() == 1.0
    hist = get_data(out["next"], "history")
    assert hist[-1] == Message("assistant", "4")
    assert len(get_data(out["next"], "prompt_tokens")) > len(ids)  # the reply is in it
    td = await env.reset(TensorDict(prompt=NonTensorData("2"), answer=NonTensorData("4")))
    td["response_tokens"] = NonTensorData("four")
    with pytest.raises(TypeError, match="'response_tokens' must hold token ids"):
        await env.step(td)
    with pytest.raises(TypeError, match="needs a tokenizer"):
        ChatEnv(mode="tokens")
