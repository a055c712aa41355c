"""The async Collector: batches of frames from an env (lockstep) or a pool (streaming)."""

from __future__ import annotations

import copy
import inspect
import warnings
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase

from aenv._mdp import unravel
from aenv.collectors._lockstep import LockstepEngine
from aenv.collectors._progress import Progress, make_progress
from aenv.collectors._state import CollectorState
from aenv.collectors._streaming import StreamingEngine
from aenv.collectors._trajs import OutOfFrames, TrajectoryBatcher
from aenv.collectors._utils import (
    Interruptor,
    TrajCounter,
    compile_policy_fn,
    cudagraph_policy_fn,
    make_policy,
    split_trajectories,
)
from aenv.envs._common import EnvBase
from aenv.envs._policy import is_async_policy
from aenv.envs._rollout import call_policy
from aenv.envs._utils import ExplorationType, set_exploration_type
from aenv.pool import AsyncEnvPool
from aenv.specs._shape import to_device

__all__ = ["Collector"]

DeviceLike = torch.device | str | int | None


def _has_dynamic_specs(env: EnvBase) -> bool:
    for spec in (env.output_spec, env.input_spec):
        for key in spec.keys(True, True):
            if -1 in tuple(spec[key].shape):
                return True
    return False


def _grad_mode(no_grad: bool) -> torch.set_grad_enabled:
    """The autograd mode a policy runs under: off with ``no_grad`` (the batches keep no
    graph, as TorchRL collects), else as the caller has it."""
    return torch.set_grad_enabled(torch.is_grad_enabled() and not no_grad)


class Collector(CollectorState):
    """Collects batches of frames with a policy: ``async for batch in Collector(...)``.

    On a single (possibly batched) env the collector steps every env in lockstep, as the
    seeds' ``SyncDataCollector``: batches are ``[*env.batch_size, T]``. On a pool of envs it
    streams by default: the policy runs on whatever envs are ready (batched), each env gets
    its action at once, and a batch is the first ``frames_per_batch`` frames to arrive
    (``[frames_per_batch]``, each frame with its ``"env_index"``), so slow envs never stall
    fast ones. Either way batches carry ``("collector", "traj_ids")``, the ``"next"``
    nesting and the policy's outputs, their last dim is named ``"time"``, and trajectories
    continue across batches unless ``reset_at_each_iter``.

    Args:
        create_env_fn: an env, a pool, a sync facade (``SerialEnv``...), an env factory
            (called with ``create_env_kwargs``), or a list of factories (run as a coroutine
            :class:`~aenv.pool.AsyncEnvPool`).
        policy: a ``TensorDictModule``, a callable on a tensordict (sync or ``async``), a
            plain module/callable on observations (wrapped in a ``TensorDictModule``
            reading the observations its parameters name and writing the action keys), or
            None for random actions from the action spec.
        frames_per_batch: frames per batch (lockstep: rounded up to a multiple of the
            number of envs).
        total_frames: frames over the collector's life; ``-1`` is endless. Must be a
            multiple of ``frames_per_batch``.
        device: default for the three devices below.
        storing_device: device of the returned batches.
        env_device: device the env's inputs are cast to.
        policy_device: device the policy runs on (a module elsewhere is copied there;
            :meth:`update_policy_weights_` refreshes the copy).
        create_env_kwargs: keyword arguments of ``create_env_fn`` (per factory for a list).
        max_frames_per_traj: truncate trajectories at this many steps (``<= 0``: off).
        init_random_frames: take random actions until this many frames were collected.
        reset_at_each_iter: reset every env at the start of each batch.
        postproc: a callable applied to each batch (after ``split_trajs``).
        split_trajs: return batches split by trajectory (:func:`split_trajectories`).
        exploration_type: the exploration type the policy runs under.
        return_same_td: return one tensordict, updated in place, at every iteration.
        reset_when_done: reset envs when they are done (else they keep stepping).
        interruptor: an :class:`~aenv.collectors.Interruptor` that can end batches early.
        set_truncated: mark the last frame of each env in a batch truncated (and done).
        use_buffers: streaming batches fill one preallocated buffer (default: unless the
            specs are dynamic); lockstep batches are each a new rollout's time rows.
        replay_buffer: an object with ``extend`` (sync or async); batches go there and the
            iterator yields None.
        trust_policy: use ``policy`` as it is, without inspecting or wrapping it.
        compile_policy: ``torch.compile`` the policy (True, or a dict of its kwargs).
        cudagraph_policy: wrap the policy in ``CudaGraphModule`` (CUDA only; elsewhere a
            warning says it is skipped).
        streaming: stream on a pool (default: True for a pool of unbatched envs).
        min_batch: streaming: the fewest ready envs the policy waits for...
        max_wait: ...for at most this many seconds (None: no limit).
        per_env_policy: streaming: call the policy once per env (each env's frame alone,
            batch ``[1]``) rather than once per group of ready envs; for policies that
            serve one request at a time (LLM calls). Either way the policy calls run
            concurrently: a slow call delays only the envs it acts for.
        progress: show a progress bar of frames and frames/s (True, "tqdm" or "rich").
        trajs_per_batch: hand out batches of this many complete trajectories (ended by
            ``("next", "done")``) instead of fixed-frame batches; trajectories spanning
            collected batches are joined. ``frames_per_batch`` is then how much is
            collected at a time.
        traj_format: with ``trajs_per_batch``: ``"padded"`` (default, ``[N, longest]``
            with a ``("collector", "mask")``) or ``"cat"`` (``[sum of lengths]``).
        no_grad: run the policy with autograd off (default, as TorchRL does), so batches
            hold no graph; False keeps the caller's grad mode.

    Example:
        >>> from aenv.testing import CountingEnv
        >>> collector = Collector(CountingEnv(max_steps=3), None, frames_per_batch=4,
        ...                       total_frames=8)
        >>> async for batch in collector:
        ...     print(batch["collector", "traj_ids"])
        tensor([0, 0, 0, 1])
        tensor([1, 1, 2, 2])
        >>> await collector.ashutdown()
    """

    def __init__(
        self,
        create_env_fn: Any,
        policy: Callable[..., Any] | None = None,
        *,
        frames_per_batch: int,
        total_frames: int = -1,
        device: DeviceLike = None,
        storing_device: DeviceLike = None,
        policy_device: DeviceLike = None,
        env_device: DeviceLike = None,
        create_env_kwargs: dict[str, Any] | Sequence[dict[str, Any]] | None = None,
        max_frames_per_traj: int | None = None,
        init_random_frames: int | None = None,
        reset_at_each_iter: bool = False,
        postproc: Callable[[TensorDictBase], TensorDictBase] | None = None,
        split_trajs: bool | None = None,
        exploration_type: ExplorationType = ExplorationType.RANDOM,
        return_same_td: bool = False,
        reset_when_done: bool = True,
        interruptor: Interruptor | None = None,
        set_truncated: bool = False,
        use_buffers: bool | None = None,
        replay_buffer: Any = None,
        trust_policy: bool | None = None,
        compile_policy: bool | dict[str, Any] | None = None,
        cudagraph_policy: bool | dict[str, Any] | None = None,
        streaming: bool | None = None,
        min_batch: int = 1,
        max_wait: float | None = None,
        per_env_policy: bool = False,
        progress: bool | str = False,
        trajs_per_batch: int | None = None,
        traj_format: str | None = None,
        no_grad: bool = True,
    ) -> None:
        if frames_per_batch < 1:
            raise ValueError(f"frames_per_batch must be >= 1, got {frames_per_batch}")
        if total_frames is None or total_frames < 0:
            total_frames = -1
        elif total_frames == 0 or total_frames % frames_per_batch:
            raise ValueError(
                f"total_frames ({total_frames}) must be a positive multiple of frames_per_batch "
                f"({frames_per_batch}), or -1 for an endless collector"
            )
        self.requested_frames_per_batch = frames_per_batch
        self.total_frames = total_frames
        self.storing_device = to_device(storing_device if storing_device is not None else device)
        self.policy_device = to_device(policy_device if policy_device is not None else device)
        self.env_device = to_device(env_device if env_device is not None else device)
        self.max_frames_per_traj = (
            max_frames_per_traj if max_frames_per_traj and max_frames_per_traj > 0 else None
        )
        self.init_random_frames = (
            init_random_frames if init_random_frames and init_random_frames > 0 else 0
        )
        self.reset_at_each_iter = reset_at_each_iter
        self.postproc = postproc
        self.split_trajs = bool(split_trajs)
        self.exploration_type = exploration_type
        self.return_same_td = return_same_td
        self.reset_when_done = reset_when_done
        self.interruptor = interruptor
        self.set_truncated = set_truncated
        self.replay_buffer = replay_buffer
        self._progress_kind = progress
        self._progress: Progress | None = None
        self._same_td: TensorDictBase | None = None
        self._closed = False
        self.no_grad = no_grad
        if traj_format is not None and trajs_per_batch is None:
            raise ValueError("traj_format needs trajs_per_batch")
        self.trajs_per_batch = trajs_per_batch
        self.traj_format = traj_format or "padded"
        self._trajs = (
            None if trajs_per_batch is None else TrajectoryBatcher(trajs_per_batch, traj_format)
        )

        env = self._make_env(create_env_fn, create_env_kwargs)
        if streaming is None:
            streaming = isinstance(env, AsyncEnvPool) and not env.batch_size[1:]
        elif streaming and not isinstance(env, AsyncEnvPool):
            raise TypeError(
                f"streaming collection needs an AsyncEnvPool (or a list of env factories), "
                f"got {type(env).__name__}"
            )
        self.streaming = bool(streaming)
        if self.max_frames_per_traj is not None and not self.streaming:
            env = self._add_step_counter(env)
        self.env = env
        if set_truncated and not any(unravel(k)[-1] == "truncated" for k in env.done_keys):
            if not self.streaming:
                raise RuntimeError(
                    "set_truncated=True needs 'truncated' entries in the env's done spec; call "
                    "env.add_truncated_keys() first"
                )
        if self.env_device is None and env.device is not None:
            self.env_device = env.device
        if use_buffers is None:
            use_buffers = not _has_dynamic_specs(env)
        self.use_buffers = use_buffers

        self._setup_policy(policy, trust_policy, compile_policy, cudagraph_policy)
        self.traj_counter = TrajCounter()
        self._frames = 0
        self._iter = 0
        common: dict[str, Any] = dict(
            frames_per_batch=frames_per_batch,
            reset_when_done=reset_when_done,
            set_truncated=set_truncated,
            traj_counter=self.traj_counter,
            storing_device=self.storing_device,
        )
        if self.streaming:
            assert isinstance(env, AsyncEnvPool)
            self._engine: LockstepEngine | StreamingEngine = StreamingEngine(
                env,
                **common,
                use_buffers=use_buffers,
                max_frames_per_traj=self.max_frames_per_traj,
                min_batch=min_batch,
                max_wait=max_wait,
                per_env_policy=per_env_policy,
            )
        else:
            self._engine = LockstepEngine(env, **common)
        self.frames_per_batch = self._engine.frames_per_batch
        if self.frames_per_batch != frames_per_batch:
            warnings.warn(
                f"frames_per_batch ({frames_per_batch}) is not a multiple of the number of envs "
                f"({self._engine.n_envs}); each batch holds {self.frames_per_batch} frames",
                UserWarning,
                stacklevel=2,
            )

    # ------------------------------------------------------------------ setup
    @staticmethod
    def _make_env(create_env_fn: Any, kwargs: Any) -> EnvBase:
        from aenv.sync import SyncEnv

        if isinstance(create_env_fn, SyncEnv):
            create_env_fn = create_env_fn.env
        if isinstance(create_env_fn, EnvBase):
            if kwargs:
                raise ValueError("create_env_kwargs cannot be used with an env instance")
            return create_env_fn
        if isinstance(create_env_fn, (list, tuple)):
            return AsyncEnvPool(list(create_env_fn), create_env_kwargs=kwargs)
        if not callable(create_env_fn):
            raise TypeError(
                "create_env_fn must be an env, a pool, an env factory or a list of factories, "
                f"got {type(create_env_fn).__name__}"
            )
        env = create_env_fn(**(kwargs or {}))
        if isinstance(env, SyncEnv):
            env = env.env
        if not isinstance(env, EnvBase):
            raise TypeError(f"create_env_fn returned {type(env).__name__}, not an aenv env")
        return env

    def _add_step_counter(self, env: EnvBase) -> EnvBase:
        from aenv.transforms import StepCounter, TransformedEnv

        if isinstance(env, TransformedEnv):
            for t in env.transform:  # type: ignore[attr-defined]
                if isinstance(t, StepCounter) and t.max_steps == self.max_frames_per_traj:
                    return env
        return TransformedEnv(env, StepCounter(max_steps=self.max_frames_per_traj))

    def _setup_policy(
        self,
        policy: Callable[..., Any] | None,
        trust_policy: bool | None,
        compile_policy: bool | dict[str, Any] | None,
        cudagraph_policy: bool | dict[str, Any] | None,
    ) -> None:
        trust = bool(cudagraph_policy) if trust_policy is None else trust_policy
        self._orig_policy = policy
        wrapped = make_policy(policy, self.env, trust_policy=trust)
        dev = self.policy_device
        if isinstance(wrapped, torch.nn.Module) and dev is not None:
            params = list(wrapped.parameters())
            if params and any(p.device != dev for p in params):
                # run a copy on the policy device; update_policy_weights_ syncs it
                wrapped = copy.deepcopy(wrapped).to(dev)
        self.policy = wrapped
        self._policy_weights = (
            TensorDict.from_module(wrapped) if isinstance(wrapped, torch.nn.Module) else None
        )
        run = wrapped
        if run is not None:
            run = compile_policy_fn(run, compile_policy)
            run = cudagraph_policy_fn(run, cudagraph_policy, dev)
        self._run_policy = run

    # ------------------------------------------------------------------ acting
    async def _act(self, td: TensorDictBase, random: bool) -> TensorDictBase:
        if random or self._run_policy is None:
            return self.env.rand_action(td)
        dev = self.policy_device
        if dev is not None and td.device != dev:
            td = td.to(dev)
        with set_exploration_type(self.exploration_type), _grad_mode(self.no_grad):
            td = await call_policy(self._run_policy, td)
        env_dev = self.env_device
        if env_dev is not None and td.device != env_dev:
            td = td.to(env_dev)
        return td

    def _lockstep_policy(self) -> Callable[[TensorDictBase], Any] | None:
        """What the rollout loop calls for the policy: :meth:`_act`'s work, without a
        coroutine per step where nothing is awaited or moved between devices."""
        run = self._run_policy
        if run is None:
            return None
        if self.policy_device is not None or self.env_device is not None or is_async_policy(run):

            async def acting(td: TensorDictBase) -> TensorDictBase:
                return await self._act(td, False)

            return acting
        exploration, no_grad = self.exploration_type, self.no_grad

        def act(td: TensorDictBase) -> Any:
            with set_exploration_type(exploration), _grad_mode(no_grad):
                out = run(td)
            if inspect.isawaitable(out):  # (from a plain call: awaited under the same modes)
                return finish(out)
            return out

        async def finish(pending: Any) -> Any:
            with set_exploration_type(exploration), _grad_mode(no_grad):
                return await pending

        return act

    # ------------------------------------------------------------------ collecting
    async def rollout(self) -> TensorDictBase:
        """Collect one batch (before ``split_trajs`` and ``postproc``) and count its frames."""
        self._check_open()
        random = self._frames < self.init_random_frames
        fresh = self.reset_at_each_iter and self._iter > 0
        engine = self._engine
        if isinstance(engine, LockstepEngine):
            policy = None if random else self._lockstep_policy()
            out = await engine.collect(policy, self.interruptor, fresh)
        else:
            out = await engine.collect(self._act, random, self.interruptor, fresh)
        self._frames += out.numel()
        self._iter += 1
        return out

    async def iterator(self) -> AsyncIterator[TensorDictBase | None]:
        """Yield batches until ``total_frames`` were collected (forever if -1).

        With a ``replay_buffer`` the batches go into it and None is yielded. When the last
        batch is out, steps still in flight on a pool are received (their frames kept for a
        later call), so the envs are left idle.
        """
        self._progress = make_progress(self._progress_kind, self.total_frames)
        try:
            while self._more():
                try:
                    out = await self._next_batch()
                except OutOfFrames:
                    break
                if self._progress is not None:
                    self._progress.update(self._last_numel)
                yield out
            await self._engine.drain()
        finally:
            if self._progress is not None:
                self._progress.close()
                self._progress = None

    def _frames_left(self) -> bool:
        return self.total_frames < 0 or self._frames < self.total_frames

    def _more(self) -> bool:
        """Whether another batch can come: frames remain to collect (always, for an endless
        collector), or enough whole trajectories are waiting."""
        return self._frames_left() or (self._trajs is not None and self._trajs.ready())

    async def _collect(self) -> tuple[TensorDictBase, bool]:
        """The next batch of frames, or of whole trajectories (with ``trajs_per_batch``:
        collected until enough are complete), and whether the engine owns it."""
        trajs = self._trajs
        if trajs is None:
            out = await self.rollout()
            self._last_numel = out.numel()
            return out, self._engine.owns(out)
        self._last_numel = 0
        while not trajs.ready() and self._frames_left():
            more = await self.rollout()
            self._last_numel += more.numel()
            trajs.add(more)
        if not trajs.ready():  # as TorchRL: fewer than trajs_per_batch are never handed out
            raise OutOfFrames
        return trajs.pop(), False

    async def _next_batch(self) -> TensorDictBase | None:
        out, owned = await self._collect()
        if self.split_trajs:
            out = split_trajectories(out, prefix="collector")
            owned = False
        if self.postproc is not None:
            out = self.postproc(out)
            owned = self._engine.owns(out)
        if self.replay_buffer is not None:
            res = self.replay_buffer.extend(out)
            if inspect.isawaitable(res):
                await res
            return None
        if self.return_same_td:
            same = self._same_td
            if same is None or same.batch_size != out.batch_size or same is out:
                self._same_td = out
            else:
                same.update_(out)
            return self._same_td
        return out.clone() if owned else out

    def __aiter__(self) -> AsyncIterator[TensorDictBase | None]:
        return self.iterator()

    def __len__(self) -> int:
        if self.total_frames < 0:
            raise TypeError("an endless collector (total_frames=-1) has no length")
        return -(-self.total_frames // self.frames_per_batch)

    # ------------------------------------------------------------------ control
    async def reset(self, index: Any = None) -> None:
        """Reset the envs (all, or those at ``index`` of the env batch / pool); each reset
        env starts a new trajectory."""
        self._check_open()
        await self._engine.reset(index)
        if self._trajs is not None:  # reset envs start new trajectories
            self._trajs.clear()

    async def set_seed(self, seed: int, static_seed: bool = False) -> int:
        """Seed the envs (env ``i`` of a pool gets ``seed + i``); returns the last env's seed."""
        self._check_open()
        nxt = await self.env.set_seed(seed, static_seed)
        if static_seed or nxt is None:
            return seed
        return int(nxt) - 1

    def shutdown(self) -> None:
        """Close the env (or pool) and stop collecting, from sync code (TorchRL's name);
        idempotent. Inside a running event loop use ``await collector.ashutdown()`` (this
        raises :class:`~aenv.exceptions.AsyncContextError` there)."""
        if self._closed:
            return
        from aenv.sync._runner import run_blocking

        run_blocking(self.ashutdown, api="Collector.shutdown()", twin="await collector.ashutdown()")

    async def ashutdown(self) -> None:
        """Close the env (or pool) and stop collecting; idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._progress is not None:
            self._progress.close()
            self._progress = None
        await self.env.aclose()

    def _check_open(self) -> None:
        if self._closed:
            from aenv.exceptions import EnvClosedError

            raise EnvClosedError("the collector was shut down")

    async def __aenter__(self) -> Collector:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.ashutdown()

    def __repr__(self) -> str:
        mode = "streaming" if self.streaming else "lockstep"
        return (
            f"{type(self).__name__}({mode}, env={self.env!r}, frames_per_batch="
            f"{self.frames_per_batch}, total_frames={self.total_frames}, frames={self._frames})"
        )
