"""GymWrapper's whole-rollout path: a plain gymnasium loop writing into numpy buffers.

:meth:`EnvBase.rollout` first offers a plain rollout (no callback, no device cast, no
``break_when_all_done``, no ``set_truncated``, contiguous) to ``env._rollout_whole``. For a
single CPU gymnasium env on :class:`GymWrapper`'s per-step fast path, :func:`rollout_whole`
runs it here: the first step goes through the generic machinery (``reset``, the policy or
``rand_action``, ``step`` / ``step_and_maybe_reset``), the following ones call the backend
directly and record its outputs in numpy buffers, and the rollout's tensordict is built from
them at the end. The result equals the generic loop's: same keys (in the same order),
dtypes, shapes and values, the same backend calls (resets included, with the same seeds) and
the same torch random stream for random actions.

Random actions are drawn as ``rand_action`` draws them, one per step: a scalar one-hot or
categorical action as one ``randint`` per step, drawn here in batches (the same stream), any
other action spec by its own ``rand()`` each step. A policy gets, each step, a tensordict
with the observation and the done flags (as the generic loop's); when its output holds more
than that and the action (extra keys, replaced entries, another batch size or device, an
action of the wrong shape or dtype), the rollout goes on in the generic loop from that step.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from aenv.envs._rollout import _any_done, _StepStore, call_policy
from aenv.envs._threads import run_blocking
from aenv.specs import Categorical, Composite, NonTensor, OneHot, TensorSpec
from aenv.specs._discrete import one_hot_rows
from aenv.specs._numpy import np_dtype

if TYPE_CHECKING:
    from aenv.libs._gym_env import GymWrapper

__all__ = ["rollout_whole"]

_ROOT_KEYS = frozenset(("observation", "done", "terminated", "truncated"))
_FLAGS = ("done", "terminated", "truncated")
_STEPPED_KEYS = frozenset((*_ROOT_KEYS, "action", "next"))
_NEXT_KEYS = frozenset(("observation", "reward", "done", "terminated", "truncated"))
_DONE_KEYS = sorted(_FLAGS)
_CHUNK = 4096  # rows per buffer chunk (and per batch of random actions)
_FIRST_CHUNK = 64  # the first chunk when the rollout may stop at a done
_LUT_MAX = 1024  # batch-drawn discrete actions: at most this many values
_FLAG_SHAPE = torch.Size((1,))
_VIEWS = 256  # policy inputs: tensor views made at a time


class _Layout:
    """What one rollout needs to know about the env, checked once per rollout."""

    __slots__ = (
        "act_dtype",
        "act_shape",
        "act_spec",
        "bs",
        "device",
        "direct",
        "obs_dtype",
        "obs_np",
        "obs_shape",
        "obs_t_shape",
        "read",
        "reward_dtype",
        "reward_np",
        "writer",
    )

    def __init__(self, env: GymWrapper, obs_spec: TensorSpec, obs_np: np.dtype) -> None:
        self.bs = env.batch_size
        self.device = env._device
        self.obs_t_shape = obs_spec.shape
        self.obs_shape = tuple(obs_spec.shape)
        self.obs_dtype = obs_spec.dtype
        self.obs_np = obs_np
        self.read = env._fast_read_obs
        # the shape of backend arrays used as they are (cast to the spec's dtype), as the
        # reader uses them: only for plain array specs (no index shift, no one-hot encoding)
        self.direct = self.obs_shape if env._fast_obs[1] is not None else None
        _, spec, _ = env._action_checks[0]
        self.act_spec = spec
        self.act_shape = spec.shape
        self.act_dtype = spec.dtype
        self.writer = env._action_writer
        self.reward_np = env._reward_np
        self.reward_dtype = torch.from_numpy(np.zeros(0, env._reward_np)).dtype


def layout(env: GymWrapper) -> _Layout | None:
    """The rollout layout when the env's specs are the plain ones the per-step path gives
    (one observation, one action, one reward, the three root done flags, no state); else None."""
    if (
        env.observation_keys != ["observation"]
        or env.action_keys != ["action"]
        or env.reward_keys != ["reward"]
        or sorted(env.done_keys) != _DONE_KEYS  # type: ignore[type-var]
        or env.state_keys
        or len(env.batch_size)
    ):
        return None
    obs_spec = env.full_observation_spec["observation"]
    act_spec = env.full_action_spec["action"]
    for spec in (obs_spec, act_spec):
        if isinstance(spec, (Composite, NonTensor)) or -1 in spec.shape:
            return None
    try:
        obs_np = np_dtype(obs_spec.dtype)
    except TypeError:  # a dtype numpy lacks: no buffer for it
        return None
    return _Layout(env, obs_spec, obs_np)


def plain_input(env: GymWrapper, td: TensorDictBase, lay: _Layout) -> bool:
    """Whether a given first tensordict holds just what a reset gives (and maybe an action)."""
    if not _plain_td(td, lay):
        return False
    entries = td._tensordict
    keys = set(entries)
    if not _ROOT_KEYS <= keys or not keys <= _ROOT_KEYS | {"action"}:
        return False
    return _root_ok(entries, lay)


def _tensor_ok(value: Any, shape: torch.Size, dtype: torch.dtype) -> bool:
    return (
        type(value) is torch.Tensor
        and value.shape == shape
        and value.dtype == dtype
        and not value.requires_grad
    )


def _plain_td(td: Any, lay: _Layout) -> bool:
    """Whether ``td`` is a plain TensorDict of the layout's batch size and device."""
    return type(td) is TensorDict and td.batch_size == lay.bs and td.device == lay.device


def _root_ok(entries: dict[str, Any], lay: _Layout) -> bool:
    return _tensor_ok(entries["observation"], lay.obs_t_shape, lay.obs_dtype) and all(
        _tensor_ok(entries[k], _FLAG_SHAPE, torch.bool) for k in _FLAGS
    )


def _stepped_ok(td: TensorDictBase, lay: _Layout) -> bool:
    """Whether a stepped tensordict (root and ``"next"``) is the plain one the buffers hold."""
    if not _plain_td(td, lay):
        return False
    entries = td._tensordict
    if set(entries) != _STEPPED_KEYS or not _root_ok(entries, lay):
        return False
    action = entries["action"]
    if type(action) is not torch.Tensor or action.shape != lay.act_shape:
        return False
    if action.dtype != lay.act_dtype:
        return False
    nxt = entries["next"]
    if not _plain_td(nxt, lay):
        return False
    sub = nxt._tensordict
    return (
        set(sub) == _NEXT_KEYS
        and _root_ok(sub, lay)
        and _tensor_ok(sub["reward"], _FLAG_SHAPE, lay.reward_dtype)
    )


def _next_ok(td: TensorDictBase, lay: _Layout) -> bool:
    """Whether the input of the second step is a plain one with no done flag set."""
    if not _plain_td(td, lay):
        return False
    entries = td._tensordict
    if set(entries) != _ROOT_KEYS or not _root_ok(entries, lay):
        return False
    return not any(bool(entries[k].any()) for k in _FLAGS)


class _Stacker:
    """Per-step tensors stacked along a new first dim, a few hundred at a time (a long
    rollout then keeps few live tensors: the garbage collector's cost grows with them)."""

    CHUNK = 256

    def __init__(self) -> None:
        self.pending: list[torch.Tensor] = []
        self.chunks: list[torch.Tensor] = []
        self.count = 0

    def append(self, tensor: torch.Tensor) -> None:
        pending = self.pending
        pending.append(tensor)
        if len(pending) == self.CHUNK:
            self.chunks.append(torch.stack(pending))
            self.pending = []
        self.count += 1

    def finish(self, first: torch.Tensor) -> torch.Tensor:
        """All of them, after ``first``."""
        parts = [first.unsqueeze(0), *self.chunks]
        if self.pending:
            parts.append(torch.stack(self.pending))
        return torch.cat(parts)


# ---------------------------------------------------------------------- random actions
class _Draws:
    """The random actions of a rollout, drawn as ``rand_action`` would draw them one by one.

    ``values(size)`` gives the backend values of the next ``size`` actions. When fewer were
    taken than drawn (the rollout stopped at a done, or a step raised), ``rewind(used)``
    gives the others back: the torch generator is left as ``used`` draws leave it.
    ``actions(first)`` stacks the first step's action and those taken after it.
    """

    def values(self, size: int) -> Iterator[Any]:
        raise NotImplementedError

    def rewind(self, used: int) -> None:
        """Leave the torch generator as ``used`` draws (in all) leave it."""

    def actions(self, first: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


class _BatchDraws(_Draws):
    """Scalar discrete actions (one ``randint`` per step): drawn ``size`` at a time."""

    def __init__(self, draw: Callable[[int], torch.Tensor], to_action: Callable[..., Any]) -> None:
        self.draw = draw
        self.to_action = to_action
        self.lut: list[Any] = []
        self.chunks: list[torch.Tensor] = []
        self.drawn = 0
        self.state: torch.Tensor | None = None

    def values(self, size: int) -> Iterator[Any]:
        self.state = torch.get_rng_state()
        idx = self.draw(size)
        self.chunks.append(idx)
        self.drawn += size
        lut = self.lut
        return iter([lut[i] for i in idx.tolist()])

    def rewind(self, used: int) -> None:
        if used < self.drawn:
            # only the last batch can be cut short: draw its used part again
            last = self.chunks.pop()
            keep = used - (self.drawn - last.shape[0])
            assert self.state is not None and keep >= 0
            torch.set_rng_state(self.state)
            if keep:
                self.chunks.append(self.draw(keep))
            self.drawn = used

    def actions(self, first: torch.Tensor) -> torch.Tensor:
        if not self.chunks:
            return first.unsqueeze(0)
        idx = self.chunks[0] if len(self.chunks) == 1 else torch.cat(self.chunks)
        return torch.cat([first.unsqueeze(0), self.to_action(idx)])


class _StepDraws(_Draws):
    """Any other action spec: its own ``rand()`` each step (the draw ``rand_action`` makes)."""

    def __init__(self, spec: TensorSpec, writer: Callable[[Any], Any]) -> None:
        self.spec = spec
        self.writer = writer
        self.tensors = _Stacker()

    def values(self, size: int) -> Iterator[Any]:
        rand, writer, append = self.spec.rand, self.writer, self.tensors.append
        for _ in range(size):
            action = rand()
            append(action)
            yield writer(action)

    # a generator draws only when its value is taken: nothing to rewind

    def actions(self, first: torch.Tensor) -> torch.Tensor:
        return self.tensors.finish(first)


def _draws(lay: _Layout) -> _Draws:
    spec, writer = lay.act_spec, lay.writer
    device = spec.device
    if type(spec) is OneHot and spec.ndim == 1 and spec.mask is None and spec.n <= _LUT_MAX:
        n, dtype = spec.n, spec.dtype
        draws = _BatchDraws(
            lambda size: torch.randint(0, n, (size,), device=device),
            lambda idx: one_hot_rows(idx, n, dtype, device),
        )
        draws.lut = [writer(row) for row in one_hot_rows(torch.arange(n), n, dtype, device)]
        return draws
    if (
        type(spec) is Categorical
        and spec.ndim == 0
        and spec.mask is None
        and spec.n <= _LUT_MAX
        and spec.dtype != torch.bool
    ):
        n, dtype = spec.n, spec.dtype
        draws = _BatchDraws(
            lambda size: torch.randint(0, n, (size,), dtype=dtype, device=device),
            lambda idx: idx,
        )
        draws.lut = [writer(torch.tensor(i, dtype=dtype, device=device)) for i in range(n)]
        return draws
    return _StepDraws(spec, writer)


# ---------------------------------------------------------------------- recording
class _Record:
    """The steps after the first: next observations (numpy chunks), rewards and flags as
    the backend gave them, and the observations the env reset to (by root row)."""

    __slots__ = ("actions", "n", "obs_chunks", "resets", "rewards", "terminated", "truncated")

    def __init__(self) -> None:
        self.obs_chunks: list[np.ndarray] = []
        self.rewards: list[Any] = []
        self.terminated: list[Any] = []
        self.truncated: list[Any] = []
        self.resets: dict[int, torch.Tensor] = {}
        self.actions = _Stacker()  # the policy's (random ones: from the draws)
        self.n = 0


def _reset_obs(env: GymWrapper) -> torch.Tensor:
    """The observation of a reset the generic loop makes after a done (same backend call)."""
    return env._reset(None)._tensordict["observation"]  # type: ignore[no-any-return]


def _obs_row(buf: np.ndarray, j: int, obs: Any, lay: _Layout) -> None:
    """Row ``j`` of ``buf``: the backend's observation through the reader (the loops write
    arrays of a plain spec's shape themselves)."""
    value = lay.read(obs)
    if type(value) is not torch.Tensor or value.shape != lay.obs_t_shape:
        raise RuntimeError(
            f"the backend's observation {obs!r} read as {value!r}, not a tensor of the "
            f"'observation' spec's shape {lay.obs_shape}"
        )
    buf[j] = value.numpy()


def _random_steps(
    env: GymWrapper, lay: _Layout, draws: _Draws, rec: _Record, steps: int, stop: bool
) -> None:
    """``steps`` random steps (fewer when ``stop`` and one ends an episode)."""
    step = env._env.step
    shape, direct, obs_np, ndarray = lay.obs_shape, lay.direct, lay.obs_np, np.ndarray
    rewards, terms, truncs, resets = rec.rewards, rec.terminated, rec.truncated, rec.resets
    size = min(steps, _FIRST_CHUNK if stop else _CHUNK)
    done_steps = j = 0
    try:
        while done_steps < steps:
            size = min(size, steps - done_steps)
            buf = np.empty((size, *shape), obs_np)
            j = 0  # actions taken in this chunk (their step done, or under way)
            ended = False
            for j, action in enumerate(draws.values(size), 1):
                obs, reward, terminated, truncated, _ = step(action)
                if type(obs) is ndarray and obs.shape == direct:
                    buf[j - 1] = obs
                else:
                    _obs_row(buf, j - 1, obs, lay)
                rewards.append(reward)
                terms.append(terminated)
                truncs.append(truncated)
                if terminated or truncated:
                    if stop:
                        ended = True
                        break
                    if done_steps + j == steps:
                        continue  # the rollout's last step: the env stays where it left it
                    # the next step's root observation (row 1 is the first step's, hence + 1)
                    resets[done_steps + j + 1] = _reset_obs(env)
            rec.obs_chunks.append(buf[:j] if j < size else buf)
            done_steps += j
            j = 0
            if ended:
                break
            size = min(size * 2, _CHUNK)
    except BaseException:
        draws.rewind(done_steps + j)  # as many draws as the generic loop would have made
        raise
    rec.n = done_steps
    draws.rewind(done_steps)


async def _policy_steps(
    env: GymWrapper,
    lay: _Layout,
    policy: Callable[..., Any],
    rec: _Record,
    first_input: TensorDictBase,
    steps: int,
    stop: bool,
) -> tuple[TensorDictBase, TensorDictBase] | None:
    """``steps`` policy steps from ``first_input``. Returns None when all ran here, else
    ``(input, policy output)`` of the step whose output is not a plain one (not taken)."""
    step, writer = env._env.step, lay.writer
    shape, direct, obs_np, ndarray = lay.obs_shape, lay.direct, lay.obs_np, np.ndarray
    bs, device = lay.bs, lay.device
    act_shape, act_dtype = lay.act_shape, lay.act_dtype
    rewards, terms, truncs, resets = rec.rewards, rec.terminated, rec.truncated, rec.resets
    add_action = rec.actions.append
    # the policy's inputs are views: observations of the rows of ``buf`` the backend's were
    # written to, fresh False flags of a zero array, made a block at a time (one torch call
    # a block instead of a few a step)
    flags: tuple[torch.Tensor, ...] = ()
    flag_i = 0
    td_in = first_input
    entries = td_in._tensordict
    obs_t = entries["observation"]
    done_t, term_t, trunc_t = entries["done"], entries["terminated"], entries["truncated"]
    size = min(steps, _FIRST_CHUNK if stop else _CHUNK)
    done_steps = 0
    while done_steps < steps:
        size = min(size, steps - done_steps)
        buf = np.empty((size, *shape), obs_np)
        j = 0
        view_start = view_end = 0
        views: tuple[torch.Tensor, ...] = ()
        ended = False
        while j < size:
            out = policy(td_in)
            if out is not td_in:
                # (awaited, or merged into its input when out of place, as call_policy does)
                out = await call_policy(lambda _td, _out=out: _out, td_in)
            ent = out._tensordict if type(out) is TensorDict else {}
            action = ent.get("action")
            if (
                len(ent) != 5
                or ent.get("observation") is not obs_t
                or ent.get("done") is not done_t
                or ent.get("terminated") is not term_t
                or ent.get("truncated") is not trunc_t
                or type(action) is not torch.Tensor
                or action.shape != act_shape
                or action.dtype != act_dtype
                or out.batch_size != bs
                or out.device != device
            ):
                rec.obs_chunks.append(buf[:j])
                rec.n = done_steps + j
                return td_in, out
            if env._closed:
                env._check_open()
            add_action(action)
            obs, reward, terminated, truncated, _ = step(writer(action))
            if type(obs) is ndarray and obs.shape == direct:
                buf[j] = obs
            else:
                _obs_row(buf, j, obs, lay)
            rewards.append(reward)
            terms.append(terminated)
            truncs.append(truncated)
            if terminated or truncated:
                if stop:
                    j += 1
                    ended = True
                    break
                if done_steps + j == steps - 1:
                    # the rollout's last step: the env stays where it left it
                    j += 1
                    ended = True
                    break
                obs_t = resets[done_steps + j + 2] = _reset_obs(env)
            else:
                if j >= view_end:
                    view_start, view_end = j, min(j + _VIEWS, size)
                    views = torch.from_numpy(buf[view_start:view_end]).unbind(0)
                obs_t = views[j - view_start]
            j += 1
            if flag_i == len(flags):
                flags = torch.from_numpy(np.zeros((3 * _VIEWS, 1), np.bool_)).unbind(0)
                flag_i = 0
            term_t, trunc_t, done_t = flags[flag_i : flag_i + 3]
            flag_i += 3
            # the key order step_mdp gives (the next entries, less the reward)
            fields = {
                "observation": obs_t,
                "terminated": term_t,
                "truncated": trunc_t,
                "done": done_t,
            }
            td_in = TensorDict._new_unsafe(fields, bs, device, nested=False)  # type: ignore[arg-type]
        rec.obs_chunks.append(buf[:j] if j < size else buf)
        done_steps += j
        if ended:
            break
        size = min(size * 2, _CHUNK)
    rec.n = done_steps
    return None


# ---------------------------------------------------------------------- assembly
def _column(values: list[Any], dtype: np.dtype, first: torch.Tensor) -> np.ndarray:
    """Per-step backend values (and the first step's tensor) as one ``(steps, 1)`` column,
    each value converted as the per-step path converts it (``np.array((value,), dtype)``)."""
    n = len(values)
    out = np.empty((n + 1, 1), dtype)
    out[0] = first.numpy()
    try:
        col = np.array(values, dtype=dtype)
    except (TypeError, ValueError):
        col = None
    if col is not None and col.shape == (n,):
        out[1:, 0] = col
    else:
        rows = [np.array((v,), dtype=dtype) for v in values]
        if any(r.shape != (1,) for r in rows):
            raise RuntimeError(
                f"the backend gave a non-scalar reward or done flag ({values[0]!r}); "
                "the whole-rollout path needs scalars"
            )
        out[1:] = np.stack(rows) if rows else out[1:]
    return out


def _assemble(
    first: TensorDictBase, nxt: TensorDictBase, rec: _Record, actions: torch.Tensor, lay: _Layout
) -> TensorDict:
    """The rollout's tensordict: the first stepped tensordict as row 0, the record after it."""
    root0 = first._tensordict
    next0 = root0["next"]._tensordict
    k = rec.n + 1
    shape = lay.obs_shape
    next_obs = np.empty((k, *shape), lay.obs_np)
    next_obs[0] = next0["observation"].numpy()
    row = 1
    for chunk in rec.obs_chunks:
        next_obs[row : row + chunk.shape[0]] = chunk
        row += chunk.shape[0]
    root_obs = np.empty_like(next_obs)
    root_obs[0] = root0["observation"].numpy()
    root_obs[1:] = next_obs[:-1]
    if k > 1:
        root_obs[1] = nxt._tensordict["observation"].numpy()
    for r, obs in rec.resets.items():
        if r < k:
            root_obs[r] = obs.numpy()
    term = _column(rec.terminated, np.dtype(np.bool_), next0["terminated"])
    trunc = _column(rec.truncated, np.dtype(np.bool_), next0["truncated"])
    done = term | trunc
    done[0] = next0["done"].numpy()
    reward = _column(rec.rewards, lay.reward_np, next0["reward"])
    next_values = {
        "observation": torch.from_numpy(next_obs),
        "reward": torch.from_numpy(reward),
        "terminated": torch.from_numpy(term),
        "truncated": torch.from_numpy(trunc),
        "done": torch.from_numpy(done),
    }
    batch = torch.Size((k,))
    device = first.device
    next_td = TensorDict._new_unsafe(
        {key: next_values[key] for key in next0},  # type: ignore[misc]
        batch_size=batch,
        device=device,
        nested=False,
    )
    root_values: dict[str, Any] = {
        "observation": torch.from_numpy(root_obs),
        "action": actions,
        "next": next_td,
    }
    for key in _FLAGS:
        flag = np.zeros((k, 1), np.bool_)
        flag[0] = root0[key].numpy()
        root_values[key] = torch.from_numpy(flag)
    return TensorDict._new_unsafe(
        {key: root_values[key] for key in root0},  # type: ignore[misc]
        batch_size=batch,
        device=device,
        nested=False,
    )


# ---------------------------------------------------------------------- the rollout
async def _generic_tail(
    env: GymWrapper,
    store: _StepStore,
    td: TensorDictBase,
    start: int,
    max_steps: int,
    policy: Callable[..., Any],
    stop: bool,
    policy_done: bool,
) -> TensorDictBase:
    """The generic loop from step ``start`` on (``td`` already through the policy when
    ``policy_done``), appending to ``store``; returns the stacked rollout."""
    for i in range(start, max_steps):
        if not policy_done:
            td = await call_policy(policy, td)
        policy_done = False
        if stop:
            td = await env.step(td)
            store.append(td)
            if i == max_steps - 1:
                break
            td = env._step_mdp(td)
            if _any_done(env, td):
                break
        elif i == max_steps - 1:
            # the last step resets nothing: the env stays where the step left it
            store.append(await env.step(td))
        else:
            td, nxt = await env.step_and_maybe_reset(td)
            store.append(td)
            td = nxt
    return store.finish()


async def rollout_whole(
    env: GymWrapper,
    lay: _Layout,
    max_steps: int,
    policy: Callable[..., Any] | None,
    stop: bool,
    tensordict: TensorDictBase | None,
) -> TensorDictBase:
    """The rollout :meth:`EnvBase.rollout` would make, with steps after the first run here."""
    act = env.rand_action if policy is None else policy
    # the first step: the generic loop's own calls
    td = tensordict if tensordict is not None else await env.reset()
    td = await call_policy(act, td)
    nxt: TensorDictBase | None
    if stop or max_steps == 1:
        td = await env.step(td)
        nxt = env._step_mdp(td) if max_steps > 1 else None
    else:
        td, nxt = await env.step_and_maybe_reset(td)
    first = td
    over = max_steps == 1 or (stop and nxt is not None and _any_done(env, nxt))
    if over or nxt is None or not _stepped_ok(first, lay) or not _next_ok(nxt, lay):
        store = _StepStore(True)
        store.append(first)
        if over or nxt is None:
            return store.finish()
        return await _generic_tail(env, store, nxt, 1, max_steps, act, stop, False)
    rec = _Record()
    steps = max_steps - 1
    if policy is None:
        draws = _draws(lay)
        if env.blocking:
            await run_blocking(_random_steps, env, lay, draws, rec, steps, stop)
        else:
            _random_steps(env, lay, draws, rec, steps, stop)
        actions = draws.actions(first._tensordict["action"])
        return _assemble(first, nxt, rec, actions, lay)
    pending = await _policy_steps(env, lay, policy, rec, nxt, steps, stop)
    actions = rec.actions.finish(first._tensordict["action"])
    out = _assemble(first, nxt, rec, actions, lay)
    if pending is None:
        return out
    # a policy output the buffers cannot hold: the generic loop takes over from that step
    store = _StepStore(True)
    for step_td in out.unbind(0):
        store.append(step_td)
    _, policy_out = pending
    return await _generic_tail(
        env, store, policy_out, rec.n + 1, max_steps, policy, stop, policy_done=True
    )
