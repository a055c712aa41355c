"""The episode runner: one coroutine per episode over a pool, groups as they complete."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import inspect
import math
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import anyio
import anyio.lowlevel
import torch
from anyio.abc import TaskGroup
from tensordict import TensorDictBase, is_tensor_collection

from aenv._mdp import any_true, entry, getter, put, put_text, unravel
from aenv._mdp_tree import non_tensor_value
from aenv.agents._episode import Episode, ErrorInfo, Turn
from aenv.agents._groups import EpisodeSpec, Group, PromptSource, prompt_tensordict
from aenv.agents._policy import BatchedPolicy
from aenv.pool import ERROR_KEYS, AsyncEnvPool
from aenv.specs import NonTensor
from aenv.sync import Runner, get_runner

__all__ = ["Collected", "EpisodeStream", "collect_episodes", "run_episodes"]

Policy = Callable[[TensorDictBase], Any]
Prompts = PromptSource | Iterable[Mapping[str, Any] | TensorDictBase]


_SCALARS = frozenset({str, bytes, int, float, bool, type(None)})


def _name(key: Any) -> str:
    return ".".join(unravel(key))


def _value(value: Any) -> Any:
    """A stored copy of one entry: text as ``str``, tensors cloned."""
    kind = type(value)
    if kind is not torch.Tensor:
        value = non_tensor_value(value)  # (a per-turn read)
        kind = type(value)
        if kind in _SCALARS:  # text: as it is (several per turn; isinstance costs µs)
            return value
    if kind is torch.Tensor or isinstance(value, torch.Tensor):
        return (value.detach() if value.requires_grad else value).clone()
    if isinstance(value, TensorDictBase):  # a non-tensor stack
        return value.tolist()
    return value


def _pick(get: Callable[[Any], Any], keys: list[tuple[Any, str]]) -> dict[str, Any]:
    """The entries ``keys`` (pairs of key and name) present, read with ``get`` (a
    :func:`~aenv._mdp.getter`), copied, by name."""
    out = {}
    for key, name in keys:
        value = get(key)
        if value is not None:
            out[name] = _value(value)
    return out


def _plain(prompt: Mapping[str, Any] | TensorDictBase) -> dict[str, Any]:
    if isinstance(prompt, TensorDictBase):
        return {_name(k): _value(prompt.get(k)) for k in prompt.keys(True, True)}
    return {str(k): _value(v) for k, v in prompt.items()}


class EpisodeStream:
    """Run one coroutine per episode over ``pool``; stream episodes and groups as they end.

    Use it as ``async with run_episodes(...) as stream: async for item in stream``. Each
    item is an :class:`Episode` (in finish order) or, right after the episode that
    completes it, its :class:`Group` (``emit`` picks which of the two come). Leaving the
    ``async with`` early cancels the episodes still running (their envs are freed).

    Each prompt (a dict or TensorDict handed to the env's reset) is run ``group_size``
    times per epoch. An episode takes a free env, resets it with its prompt, and then
    alternates ``await policy(td)`` (one env's tensordict in, its action out) and
    ``await pool.step_one(i, td)`` until the env says done or a budget runs out; its env
    then goes to the next prompt. At most ``max_concurrent_episodes`` (default: the pool's
    size) run at once.

    Args:
        pool: any :class:`~aenv.pool.AsyncEnvPool` (coroutine, thread or process backend).
            With ``on_error="observe"`` a failed env step ends its episode with the error
            kept (``done_reason="error"``); with ``"raise"`` it does too, and the env is
            reset by the next episode.
        policy: an async (or sync) callable on one env's tensordict that returns its
            action: the value of the env's one action entry (a string for a text action,
            a tensor), or a dict of action entries by key. The runner writes them into the
            tensordict without TensorDict's per-entry checks (the pool checks the actions
            against its specs before the step, as ``pool.step`` does), which is the cheap
            way: ``td["action"] = text`` costs tens of µs a turn. A policy may also set the
            entries itself and return the tensordict (or None, having filled it in place),
            or be a :class:`BatchedPolicy` to serve many episodes per call.
        prompts: a :class:`PromptSource`, or any sequence / iterable of prompts.
        group_size: episodes per prompt per epoch (a group).
        max_concurrent_episodes: the concurrency cap.
        episode_timeout: seconds an episode may run; then it ends with
            ``done_reason="timeout"`` (its env's work is cancelled and the env freed).
        max_turns: steps an episode may take; then it ends with ``"max_turns"``.
        epochs: passes over a sequence of prompts.
        emit: ``"both"`` (episodes and groups), ``"episodes"`` or ``"groups"``.

    Example:
        >>> async def policy(td):              # one env's tensordict in, its action out
        ...     return await llm(td["text"])   # (a str: the env's text action)
        >>> async with run_episodes(pool, policy, prompts, group_size=4) as stream:
        ...     async for item in stream:
        ...         if isinstance(item, Group):
        ...             train_on(item.episodes, item.advantages())
    """

    def __init__(
        self,
        pool: AsyncEnvPool,
        policy: Policy,
        prompts: Prompts,
        *,
        group_size: int = 1,
        max_concurrent_episodes: int | None = None,
        episode_timeout: float | None = None,
        max_turns: int | None = None,
        epochs: int = 1,
        emit: str = "both",
    ) -> None:
        if emit not in ("both", "episodes", "groups"):
            raise ValueError(f"emit must be 'both', 'episodes' or 'groups', got {emit!r}")
        if max_concurrent_episodes is not None and max_concurrent_episodes < 1:
            raise ValueError(f"max_concurrent_episodes must be >= 1, got {max_concurrent_episodes}")
        if max_turns is not None and max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        if episode_timeout is not None and episode_timeout <= 0:
            raise ValueError(f"episode_timeout must be > 0, got {episode_timeout}")
        if isinstance(prompts, PromptSource):
            if group_size != 1 or epochs != 1:
                raise ValueError("pass group_size and epochs to the PromptSource, not here")
            self.source = prompts
        else:
            self.source = PromptSource(prompts, group_size=group_size, epochs=epochs)
        self.pool = pool
        self.policy = policy
        cap = pool.num_envs
        self.concurrency = min(cap, max_concurrent_episodes or cap)
        self.episode_timeout = episode_timeout
        self.max_turns = max_turns
        self.emit = emit
        self._tg: TaskGroup | None = None
        self._receive: Any = None
        self._groups: dict[int, list[Episode]] = {}
        self._obs_keys = [(k, _name(k)) for k in pool.observation_keys]
        self._action_keys = [(k, _name(k)) for k in pool.action_keys]
        # the action keys of non-tensor data (text): a value the policy returns for one
        # is written as such (see _act)
        self._text_actions = {
            k for k in pool.action_keys if isinstance(pool.full_action_spec[k], NonTensor)
        }
        self._reward_keys = [(k, _name(k)) for k in pool.reward_keys]
        # each done key with the flag it is: 0 done, 1 terminated, 2 truncated
        names = ("done", "terminated", "truncated")
        self._done_flags = [
            (k, names.index(unravel(k)[-1])) for k in pool.done_keys if unravel(k)[-1] in names
        ]
        # the done flags alone, when every level with flags has one: a step's output is
        # completed (each level's done is its terminated or truncated), so when none is
        # set no other flag is either (most turns: two reads fewer); else empty
        levels = {unravel(k)[:-1] for k, _ in self._done_flags}
        done_only = [(k, which) for k, which in self._done_flags if which == 0]
        self._done_only = done_only if {unravel(k)[:-1] for k, _ in done_only} == levels else []

    async def __aenter__(self) -> EpisodeStream:
        send, self._receive = anyio.create_memory_object_stream[Episode | Group](math.inf)
        tg = anyio.create_task_group()
        await tg.__aenter__()
        self._tg = tg
        tg.start_soon(self._feed, send)
        return self

    async def __aexit__(self, *exc: Any) -> bool | None:
        tg, self._tg = self._tg, None
        assert tg is not None
        tg.cancel_scope.cancel()  # the consumer left: stop what still runs
        try:
            return await tg.__aexit__(*exc)
        finally:
            self._receive.close()

    def __aiter__(self) -> EpisodeStream:
        return self

    async def __anext__(self) -> Episode | Group:
        if self._tg is None:
            raise RuntimeError("use the stream inside `async with run_episodes(...) as stream`")
        try:
            # an item already waiting is taken without a trip through the event loop (a
            # cancelled caller still stops here); otherwise wait for the next one
            await anyio.lowlevel.checkpoint_if_cancelled()
            try:
                return self._receive.receive_nowait()  # type: ignore[no-any-return]
            except anyio.WouldBlock:
                return await self._receive.receive()  # type: ignore[no-any-return]
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    # ------------------------------------------------------------------ running
    async def _feed(self, send: Any) -> None:
        specs = iter(self.source)
        async with send, contextlib.AsyncExitStack() as stack:
            if isinstance(self.policy, BatchedPolicy) and not self.policy.running:
                await stack.enter_async_context(self.policy)
            # (asyncio's task group: anyio's start_soon costs ~20 us a task against ~4, and
            # with thousands of slots every one starts in the same burst; a failure still
            # cancels the other slots and comes out as an ExceptionGroup)
            async with asyncio.TaskGroup() as slots:
                for env_index in range(self.concurrency):
                    slots.create_task(self._slot(specs, env_index, send))

    async def _slot(self, specs: Iterator[EpisodeSpec], env_index: int, send: Any) -> None:
        """Env ``env_index``'s episodes, one after another: each takes the source's next
        prompt the moment the one before ends. One task per env, not one per episode (a
        task group's task costs about as much as a turn's framework work), and each episode
        played right here, not in a coroutine of its own: every resume of the episode's
        task (twice a turn) passes one coroutine frame fewer."""
        timeout = self.episode_timeout
        for spec in specs:
            ep = Episode(
                prompt=_plain(spec.prompt),
                prompt_index=spec.prompt_index,
                epoch=spec.epoch,
                group=spec.group,
                env_index=env_index,
                started_at=time.time(),
            )
            try:
                if timeout is None:
                    await self._play(ep, spec, env_index)  # (no scope of its own to enter)
                else:
                    with anyio.CancelScope() as scope:
                        scope.deadline = anyio.current_time() + timeout
                        await self._play(ep, spec, env_index)
                    if scope.cancelled_caught:
                        ep.done_reason = "timeout"  # (its env's step was cancelled and freed)
                        if ep.turns:
                            ep.turns[-1].truncated = True
            except Exception as exc:
                # the env (on_error="raise") or the policy failed: the episode keeps the error
                ep.done_reason = "error"
                ep.error = ErrorInfo.from_exception(exc)
            ep.ended_at = time.time()
            self._finish(ep, send)

    async def _play(self, ep: Episode, spec: EpisodeSpec, env_index: int) -> None:
        pool, policy, max_turns = self.pool, self.policy, self.max_turns
        obs_keys, action_keys, reward_keys = self._obs_keys, self._action_keys, self._reward_keys
        td = await pool.reset_one(env_index, prompt_tensordict(spec.prompt, pool._sub_batch))
        ep.final_observation = _pick(getter(td), obs_keys)
        turns = ep.turns
        clock = time.perf_counter
        while True:
            if max_turns is not None and len(turns) >= max_turns:
                ep.done_reason = "max_turns"
                if turns:
                    turns[-1].truncated = True
                return
            obs = ep.final_observation
            t0 = clock()
            out = policy(td)
            if inspect.isawaitable(out):
                out = await out
            if out is not None:
                # (text skips the ABC isinstance checks: a µs each, every turn)
                text = type(out) in _SCALARS
                td = out if not text and isinstance(out, TensorDictBase) else self._act(td, out)
            t1 = clock()
            stepped = await pool.step_one(env_index, td)
            t2 = clock()
            nxt = entry(stepped, "next")
            get = getter(nxt)  # (one reader for the flags, the reward, the observation)
            done, terminated, truncated = self._flags(get)
            done = done or terminated or truncated
            turns.append(
                Turn(
                    observation=obs,
                    action=_pick(getter(td), action_keys),
                    reward=_pick(get, reward_keys),
                    terminated=terminated,
                    truncated=truncated or (done and not terminated),
                    policy_s=t1 - t0,
                    env_s=t2 - t1,
                )
            )
            ep.final_observation = _pick(get, obs_keys)
            kind = get(ERROR_KEYS[0])
            if kind is not None and _value(kind):
                # a failed step observed (on_error="observe"): the env was rebuilt
                ep.error = ErrorInfo(*(str(_value(get(k))) for k in ERROR_KEYS))
                ep.done_reason = "error"
                return
            if done:
                ep.done_reason = "terminated" if terminated else "truncated"
                return
            td = pool.step_mdp(stepped)

    def _act(self, td: TensorDictBase, actions: Any) -> TensorDictBase:
        """Write what the policy returned, the value of the env's one action or a dict of
        actions by key, into ``td`` (one env's input). A text action is written straight
        into a plain TensorDict's entries, a tensor as :func:`~aenv._mdp.put` writes it;
        anything else through ``td.set``. The pool checks them before the step."""
        if type(actions) is dict or (
            type(actions) not in _SCALARS and isinstance(actions, Mapping)
        ):
            items = actions.items()
        elif len(self._action_keys) == 1:
            items = ((self._action_keys[0][0], actions),)  # type: ignore[assignment]
        else:
            raise TypeError(
                f"the policy returned a {type(actions).__name__}; an env with several action "
                f"keys ({[name for _, name in self._action_keys]}) takes a dict of actions by "
                "key (or the tensordict with them set)"
            )
        for key, value in items:
            if type(value) is torch.Tensor and type(key) is str:
                put(td, key, value)
            elif (
                type(key) is str
                and key in self._text_actions
                and (
                    type(value) in _SCALARS
                    or not (is_tensor_collection(value) or isinstance(value, torch.Tensor))
                )
            ):
                put_text(td, key, value)
            else:
                td.set(key, value)
        return td

    def _flags(self, get: Callable[[Any], Any]) -> list[bool]:
        """Whether any done, terminated and truncated flag is set, read with ``get`` (a
        :func:`~aenv._mdp.getter` of a step's ``"next"``)."""
        flags = [False, False, False]
        if self._done_only:
            for key, _ in self._done_only:
                value = get(key)
                if value is None or any_true(value):
                    break  # (a level done, or no flag: every flag is read below)
            else:
                return flags  # no level done: none terminated or truncated (see __init__)
        for key, which in self._done_flags:
            if not flags[which]:
                value = get(key)
                flags[which] = value is not None and any_true(value)
        return flags

    def _finish(self, ep: Episode, send: Any) -> None:
        if self.emit != "groups":
            send.send_nowait(ep)
        members = self._groups.setdefault(ep.group, [])
        members.append(ep)
        if len(members) == self.source.group_size:
            del self._groups[ep.group]
            if self.emit != "episodes":
                send.send_nowait(
                    Group(ep.group, ep.prompt_index, ep.epoch, dict(ep.prompt), members)
                )


#: the runner's function name: ``run_episodes(pool, policy, prompts, ...)`` builds the stream
run_episodes = EpisodeStream


@dataclasses.dataclass
class Collected:
    """What :func:`collect_episodes` ran: every episode and group, in finish order."""

    episodes: list[Episode]
    groups: list[Group]


def collect_episodes(
    pool: AsyncEnvPool,
    policy: Policy,
    prompts: Prompts,
    *,
    runner: Runner | None = None,
    **kwargs: Any,
) -> Collected:
    """:func:`run_episodes` for scripts: runs every episode through aenv's loop runner
    (``runner``, default the shared one) and returns them all; ``kwargs`` are
    :func:`run_episodes`'s. The pool lives on the runner's loop: create it in sync code.

    Example:
        >>> pool = AsyncEnvPool([GuessTextEnv] * 8)
        >>> out = collect_episodes(pool, policy, prompts, group_size=4)
        >>> len(out.groups)
    """

    async def run() -> Collected:
        out = Collected([], [])
        async with run_episodes(pool, policy, prompts, **kwargs) as stream:
            async for item in stream:
                if isinstance(item, Group):
                    out.groups.append(item)
                else:
                    out.episodes.append(item)
        return out

    return (runner or get_runner()).run(run)
