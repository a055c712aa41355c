"""AsyncEnvPool: many envs as one async env whose first batch dim indexes sub-envs."""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

import torch
from tensordict import (
    LazyStackedTensorDict,
    NonTensorStack,
    TensorDict,
    TensorDictBase,
    is_leaf_nontensor,
    is_non_tensor,
)

from aenv._mdp import entry, mask_merge, put, set_next, unravel
from aenv._mdp_tree import fast_clone
from aenv.envs._common import EnvBase
from aenv.envs._utils import EnvMetaData
from aenv.exceptions import BatchSizeError, PoolError, SpecError
from aenv.pool._backend import Failure, Stacked, backend_class, normalize_backend_name
from aenv.pool._dispatch import ERROR_KEYS, _Ticket, write_error
from aenv.pool._gc import GcFreeze
from aenv.pool._per_env import PerEnvMixin
from aenv.pool._pool_rollout import PoolStepper
from aenv.pool._stacking import split_inputs, stack_results
from aenv.pool._stream import StreamMixin
from aenv.specs import StackedComposite

__all__ = ["AsyncEnvPool", "CoroutineAsyncEnvPool", "ThreadingAsyncEnvPool"]

EnvFns = Sequence[Callable[..., EnvBase]] | tuple[int, Callable[..., EnvBase]]

#: backends whose sub-envs live in this process: attribute reads cost no I/O
_IN_PROCESS = frozenset(("coroutine", "thread"))


def _normalize_fns(
    env_fns: EnvFns, create_env_kwargs: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None
) -> list[Callable[[], EnvBase]]:
    if isinstance(env_fns, tuple) and len(env_fns) == 2 and isinstance(env_fns[0], int):
        fns: list[Callable[..., EnvBase]] = [env_fns[1]] * env_fns[0]
    elif callable(env_fns):
        raise TypeError("env_fns must be a list of env factories or a (num_envs, factory) pair")
    else:
        fns = list(env_fns)  # type: ignore[arg-type]
    if not fns:
        raise ValueError("a pool needs at least one env")
    if create_env_kwargs is None:
        return fns
    if isinstance(create_env_kwargs, Mapping):
        kws: Sequence[Mapping[str, Any]] = [create_env_kwargs] * len(fns)
    else:
        kws = list(create_env_kwargs)
        if len(kws) != len(fns):
            raise ValueError(f"{len(kws)} create_env_kwargs for {len(fns)} envs")
    return [functools.partial(fn, **kw) if kw else fn for fn, kw in zip(fns, kws)]


class AsyncEnvPool(PerEnvMixin, StreamMixin, EnvBase):
    """Runs many envs as one async env, whole-batch or streaming as each env finishes.

    The pool's batch size is ``(num_envs, *sub_batch)`` and its specs are the sub-envs'
    specs stacked along dim 0. Whole-batch calls (``reset``, ``step``,
    ``step_and_maybe_reset``, ``rollout``) touch only the envs selected by ``"_reset"`` /
    ``"_step"`` masks. Streaming calls (``async_step_send`` / ``async_step_recv`` and the
    same for reset and step_and_maybe_reset, :meth:`stream`) send work to some envs and
    return results as envs finish, with an ``"env_index"`` entry. Per-env calls
    (:meth:`step_one`, :meth:`reset_one`, :meth:`step_and_maybe_reset_one`) await one env's
    result, from any number of tasks at once (one coroutine per episode); :meth:`cancel`
    stops one env's work and frees it.

    Args:
        env_fns: a list of env factories, or a ``(num_envs, factory)`` pair. Factories are
            called where the env will live (in its thread for the thread backend).
        backend: ``"coroutine"`` (default; async envs as tasks of the pool's loop, sync ones
            inline or, when declared ``blocking``, in worker threads), ``"thread"`` /
            ``"threading"`` (one dedicated thread per env), ``"process"`` (worker processes,
            several envs each) or ``"ray"`` (Ray actors, on one machine or a cluster).
        stack: ``"dense"`` (sub-envs share specs; results are contiguous) or ``"lazy"``
            (heterogeneous sub-envs; results are lazy stacks).
        create_env_kwargs: keyword arguments for the factories (one dict, or one per env).
        on_error: ``"raise"`` (default): a whole-batch call with failed envs raises
            :class:`~aenv.exceptions.PoolError` once every env answered (``.errors`` maps env
            index to its :class:`~aenv.exceptions.EnvStepError` or
            :class:`~aenv.exceptions.StepTimeoutError`, ``.results`` holds the others'
            results) and a streamed failure is raised by the ``recv`` that would return it.
            ``"restart"``: a step that fails rebuilds the env from its factory, resets it and
            is reported as truncated (``"done"`` and ``"truncated"`` set in its ``"next"``,
            which holds the fresh reset's observation); the error is kept in
            :attr:`last_errors`.
            ``"observe"``: as ``"restart"``, and the error travels with the data: every
            step's ``"next"`` holds ``"error_type"``, ``"error_message"`` and
            ``"error_traceback"`` (non-tensor strings, empty when the step went well;
            :data:`~aenv.pool.ERROR_KEYS`), so trajectories keep their errors. The pool
            declares ``"truncated"`` done keys where the envs have none.
        step_timeout: seconds a step or reset may take; a late one is abandoned
            (coroutine backend: cancelled; thread backend: its thread is given up), the env
            is rebuilt from its factory, and the step is reported as a
            :class:`~aenv.exceptions.StepTimeoutError` (or restarted, with
            ``on_error="restart"``). Sync envs run inline on the coroutine backend cannot be
            interrupted: use the thread backend for those.
        max_concurrency: at most this many envs work at once; the others wait their turn
            in the pool (an env never sees work before it has a slot).
        backend_options: options for the backend.
        device: the pool's device (default: the first sub-env's). It must be where the
            sub-envs' outputs are (a sub-env without a device counts as the CPU): a pool
            does not cast; a ``ValueError`` says so at the build.
        close_timeout: seconds ``aclose`` waits for work that ignores cancellation.
        gc_freeze: move what the build, the first whole reset and the first steps made
            to the garbage collector's permanent generation while the pool is open, so
            full collections skip thousands of envs, and collect the young generation less
            often, so steps in flight are not walked and promoted (:mod:`aenv.pool._gc`). Default
            (None): on for pools of at least 64 envs on the coroutine or thread backend.

    Example:
        >>> from aenv.testing import LatencyEnv
        >>> pool = AsyncEnvPool([lambda: LatencyEnv(0.01), lambda: LatencyEnv(0.5)])
        >>> td = await pool.reset()
        >>> pool.async_step_send(pool.rand_action(td))
        >>> first = await pool.async_step_recv()   # the fast env's result
        >>> first["env_index"]
        tensor([0])
        >>> await pool.aclose()
    """

    _handles_partial_steps: ClassVar[bool] = True
    _backend_name: ClassVar[str | None] = None

    def __new__(cls, *args: Any, **kwargs: Any) -> AsyncEnvPool:
        if cls is AsyncEnvPool:
            name = normalize_backend_name(kwargs.get("backend") or "coroutine")
            cls = _pool_class(name, cls)
        return super().__new__(cls)

    def __init__(
        self,
        env_fns: EnvFns,
        *,
        backend: str | None = None,
        stack: str = "dense",
        create_env_kwargs: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None,
        on_error: str = "raise",
        step_timeout: float | None = None,
        max_concurrency: int | None = None,
        backend_options: Mapping[str, Any] | None = None,
        device: torch.device | str | None = None,
        close_timeout: float = 5.0,
        gc_freeze: bool | None = None,
    ) -> None:
        fns = _normalize_fns(env_fns, create_env_kwargs)
        if stack in ("lazy_stack", "maybe_dense"):
            stack = "lazy"
        if stack not in ("dense", "lazy"):
            raise ValueError(f"stack must be 'dense' or 'lazy', got {stack!r}")
        if on_error not in ("raise", "restart", "observe"):
            raise ValueError(f"on_error must be 'raise', 'restart' or 'observe', got {on_error!r}")
        if step_timeout is not None and step_timeout <= 0:
            raise ValueError(f"step_timeout must be > 0, got {step_timeout}")
        if max_concurrency is not None and max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
        name = normalize_backend_name(backend or self._backend_name or "coroutine")
        if self._backend_name is not None and name != self._backend_name:
            raise ValueError(
                f"{type(self).__name__} runs the {self._backend_name!r} backend, not {backend!r}"
            )
        self.backend = name
        self.num_envs = len(fns)
        self.on_error = on_error
        self.step_timeout = step_timeout
        self.max_concurrency = max_concurrency
        self.close_timeout = close_timeout
        self._lazy = stack == "lazy"
        self.stack = stack
        self._init_dispatch(self.num_envs)
        self._gc = GcFreeze(gc_freeze, self.num_envs, name in ("coroutine", "thread"))
        self._backend = backend_class(name)(self._deliver, **dict(backend_options or {}))
        metas = self._backend.start(fns)
        try:
            self._setup_specs(metas, device)
        except BaseException:
            self._backend.abort()
            raise
        self._gc.built()
        if on_error == "observe" and not any(
            unravel(key)[-1] == "truncated" for key in self.done_keys
        ):
            self.add_truncated_keys()

    def _setup_specs(self, metas: list[EnvMetaData], device: Any) -> None:
        sub_bs = metas[0].batch_size
        for i, m in enumerate(metas):
            if m.batch_size != sub_bs:
                raise BatchSizeError(
                    f"sub-envs must share one batch size: env 0 has {tuple(sub_bs)}, env {i} "
                    f"has {tuple(m.batch_size)}"
                )
        if device is not None:
            device, sub = torch.device(device), metas[0].device
            made = sub if sub is not None else torch.device("cpu")
            other_index = None not in (made.index, device.index) and made.index != device.index
            if made.type != device.type or other_index:
                raise ValueError(
                    f"AsyncEnvPool(device={str(device)!r}): the sub-envs' outputs are on "
                    f"{str(sub) if sub is not None else 'the CPU (their device is None)'}, and "
                    "a pool does not move data between devices; build the envs on that device, "
                    "or wrap the pool: TransformedEnv(pool, DeviceCastTransform(device))"
                )
        self._metas = metas
        self._sub_batch = sub_bs
        self._all = list(range(self.num_envs))
        self._zero_cache: dict[tuple[int, str], TensorDictBase] = {}
        super().__init__(
            device=device if device is not None else metas[0].device,
            batch_size=(self.num_envs, *sub_bs),
        )
        specs = {}
        for name in ("output_spec", "input_spec"):
            specs[name] = torch.stack([m.specs[name] for m in metas], 0)  # type: ignore[misc]
            if not self._lazy and isinstance(specs[name], StackedComposite):
                raise SpecError(
                    f"the sub-envs' {name}s differ (keys, shapes or types), so they cannot be "
                    "stacked densely; pass stack='lazy' to pool heterogeneous envs"
                )
        self.output_spec = specs["output_spec"]  # type: ignore[assignment]
        self.input_spec = specs["input_spec"]  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(num_envs={self.num_envs}, backend={self.backend!r}, "
            f"batch_size={tuple(self.batch_size)}, stack={self.stack!r})"
        )

    # ------------------------------------------------------------------ helpers
    def _raise_failures(self, op: str, indices: Sequence[int], outcomes: list[Any]) -> None:
        errors = {indices[p]: o.exc for p, o in enumerate(outcomes) if isinstance(o, Failure)}
        if not errors:
            return
        results = {indices[p]: o for p, o in enumerate(outcomes) if not isinstance(o, Failure)}
        lines = "; ".join(
            f"env {i}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            for i, e in errors.items()
        )
        first = next(iter(errors.values()))
        raise PoolError(
            f"{len(errors)} of {len(indices)} env(s) failed in {op}: {lines}",
            errors=errors,
            results=results,
        ) from first

    def _zero(self, i: int, kind: str) -> TensorDictBase:
        key = (i, kind)
        out = self._zero_cache.get(key)
        if out is None:
            spec = self._metas[i].specs["output_spec"]
            names = ["full_observation_spec", "full_done_spec"]
            if kind == "next":
                names.append("full_reward_spec")
            out = TensorDict(batch_size=self._sub_batch, device=self.device)
            for name in names:
                out.update(spec[name].zero())
            self._zero_cache[key] = out
        return out

    def _assemble(self, outcomes: list[Any], indices: list[int], kind: str) -> TensorDictBase:
        n = self.num_envs
        if len(indices) == n:
            return stack_results(outcomes, self._lazy)
        tds: list[Any] = [None] * n
        for pos, i in enumerate(indices):
            tds[i] = outcomes[pos]
        ref = outcomes[0]
        for i in range(n):
            if tds[i] is None:
                tds[i] = self._zero(i, kind).clone() if self._lazy else torch.zeros_like(ref)
                if kind == "next" and self.on_error == "observe":
                    write_error(tds[i], None)  # not the copied strings of env ``ref``'s error
        return stack_results(tds, self._lazy)

    def _env_selection(self, mask: torch.Tensor) -> torch.Tensor:
        return mask.reshape(self.num_envs, -1).any(-1)

    def _restart_result(self, i: int, t: _Ticket, reset: Any) -> Any:
        """The outcome reported for a step whose env was restarted: truncated, fresh obs."""
        nxt = reset.exclude(*(k for k in reset.keys() if k in ("_reset", "env_index", "next")))
        nxt.update(self._metas[i].specs["output_spec"]["full_reward_spec"].zero())
        done_spec = self.full_done_spec  # the pool's: add_truncated_keys() may have added some
        for key in self.done_keys:
            value = done_spec[key].zero()[i]
            last = unravel(key)[-1]
            nxt.set(key, value if last == "terminated" else torch.ones_like(value))
        if self.on_error == "observe":
            write_error(nxt, t.error)
        if t.op == "step_and_maybe_reset":
            return nxt, reset
        return nxt

    # ------------------------------------------------------------------ EnvBase hooks
    async def _reset(self, tensordict: TensorDictBase | None, **kwargs: Any) -> TensorDictBase:
        indices = self._all
        if tensordict is None:
            payloads: list[Any] = [(None, kwargs)] * self.num_envs
        else:
            sel = None
            for key in self.reset_keys:
                mask = tensordict.get(key, None)
                if mask is not None:
                    flags = self._env_selection(mask)
                    sel = flags if sel is None else sel | flags
            if sel is not None and not bool(sel.all()):
                indices = sel.nonzero().squeeze(-1).tolist()
            keys = [*self.state_keys, *self.reset_keys]
            subs = split_inputs(tensordict, indices, keys, self._sub_batch)
            payloads = [(s, kwargs) for s in subs]
        outcomes = await self._run_ops("reset", indices, payloads)
        self._raise_failures("reset", indices, outcomes)
        out = self._assemble(outcomes, indices, "reset")
        self._gc.reset_done()
        return out

    def _step_keys(self, tensordict: TensorDictBase) -> list[Any]:
        """The entries of a whole-batch step input each sub-env gets: what a bare env
        would get (every root entry but ``"next"``), on every backend (a process worker's
        input slot holds the action, state, observation and done entries)."""
        skip = ("next",) if self._sub_batch else ("next", "_step")
        return [
            k
            # is_leaf_nontensor: non-tensor entries (a NonTensorStack of prompts) are leaves
            for k in tensordict.keys(True, True, is_leaf=is_leaf_nontensor)
            if k not in skip and not (type(k) is tuple and k[0] == "next")
        ]

    async def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        mask = entry(tensordict, "_step")  # (the entry dict: read on every step)
        indices = self._all
        sel = None
        if mask is not None:
            sel, indices = self._selected(mask)
            if not indices:
                return self._previous_as_next(tensordict.exclude("_step", "next"))
        partial = len(indices) < self.num_envs
        out: Any = None
        if not self._lazy and (mask is None or not self._sub_batch):
            out = await self._run_batch("step", tensordict, indices if partial else None)
            if isinstance(out, Stacked):
                return self._sat_out(out.owned_next(), tensordict, sel, partial)
        if out is None:
            inputs = split_inputs(tensordict, indices, self._step_keys(tensordict), self._sub_batch)
            out = await self._run_ops("step", indices, inputs)
        self._raise_failures("step", indices, out)
        return self._sat_out(self._assemble(out, indices, "next"), tensordict, sel, partial)

    def _selected(self, mask: torch.Tensor) -> tuple[torch.Tensor, list[int]]:
        """The envs a ``"_step"`` mask selects: a flag per env, and their indices."""
        sel = self._env_selection(mask)
        return sel, [i for i, flag in enumerate(sel.tolist()) if flag]

    def _sat_out(
        self,
        nxt: TensorDictBase,
        tensordict: TensorDictBase,
        sel: torch.Tensor | None,
        partial: bool,
    ) -> TensorDictBase:
        """``nxt`` with the rows of the envs a masked step left out (``sel`` False) taken
        from their input: their current values, zero reward."""
        if partial:
            mask_merge(nxt, tensordict.exclude("_step", "next"), sel)  # type: ignore[arg-type]
        return nxt

    async def step_and_maybe_reset(
        self, tensordict: TensorDictBase
    ) -> tuple[TensorDictBase, TensorDictBase]:
        """Step every env (those a ``"_step"`` mask selects) and reset those that are done,
        in one operation per env, as one whole-batch call where the backend takes it. With
        a mask, the envs left out sit the step out with their current values; the result
        is EnvBase's :meth:`step` then "reset what is done", which a masked call falls back
        to (also when an env sitting the step out is done already: that one is reset too).
        """
        mask = entry(tensordict, "_step")  # (the entry dict: read on every step)
        sel, indices = None, self._all
        if mask is None:
            self._check_open()
        elif self._lazy or self._sub_batch or self._closed:
            return await super().step_and_maybe_reset(tensordict)
        self._check_batch(tensordict)
        if mask is not None:
            sel, indices = self._selected(mask)
            if not indices or (
                len(indices) < self.num_envs and self._sitting_done(tensordict, sel)
            ):
                return await super().step_and_maybe_reset(tensordict)
            sel = sel if len(indices) < self.num_envs else None
        self._check_actions(tensordict)
        op = "step_and_maybe_reset"
        out = (
            None
            if self._lazy
            else await self._run_batch(op, tensordict, indices if sel is not None else None)
        )
        if out is None:
            if sel is not None:  # (nothing started)
                return await super().step_and_maybe_reset(tensordict)
            inputs = split_inputs(tensordict, indices, self._step_keys(tensordict), self._sub_batch)
            out = await self._run_ops(op, indices, inputs)
        if isinstance(out, Stacked):
            return tensordict, self._stacked_next_input(tensordict, out, sel)
        self._raise_failures(op, indices, out)
        return tensordict, self._outcomes_next_input(tensordict, out, indices, sel)

    def _sitting_done(self, tensordict: TensorDictBase, sel: torch.Tensor) -> bool:
        """Whether an env a ``"_step"`` mask leaves out is done (what "reset what is done"
        reads)."""
        n, sitting = self.num_envs, ~sel
        for prefix in self._done_groups:
            sub = tensordict.get(prefix, None) if prefix else tensordict
            done = None if sub is None else entry(sub, "done")
            if isinstance(done, torch.Tensor) and bool(
                (done.reshape(n, -1).any(-1) & sitting).any()
            ):
                return True
        return False

    def _outcomes_next_input(
        self,
        tensordict: TensorDictBase,
        outcomes: list[Any],
        indices: list[int] | None = None,
        sel: torch.Tensor | None = None,
    ) -> TensorDictBase:
        """Record per-env ``(next, reset | None)`` outcomes of a whole-batch
        ``step_and_maybe_reset`` (or ``next`` outcomes of a ``step``) of the envs
        ``indices`` (default all; ``sel`` flags them when not all) in ``tensordict`` and
        return the next step's input."""
        indices = self._all if indices is None else indices
        pairs = [o if type(o) is tuple else (o, None) for o in outcomes]
        nxt = self._assemble([p[0] for p in pairs], indices, "next")
        if sel is not None:
            nxt = self._sat_out(nxt, tensordict, sel, True)
        set_next(tensordict, self._step_proc_data(nxt, tensordict))
        next_input = self._step_mdp(tensordict)
        resets = [(i, p[1]) for i, p in zip(indices, pairs) if p[1] is not None]
        if resets:
            next_input = self._write_resets(next_input, resets)
        return next_input

    def _stacked_next_input(
        self, tensordict: TensorDictBase, out: Stacked, sel: torch.Tensor | None = None
    ) -> TensorDictBase:
        """Record a stacked step's results in ``tensordict`` (under ``"next"``; ``sel``
        flags the envs stepped when not all) and return the next step's input, done envs'
        rows taken from their resets."""
        nxt = out.owned_next()  # (the reset rows are only read: merging copies them)
        if sel is not None:
            nxt = self._sat_out(nxt, tensordict, sel, True)
        put(tensordict, "next", self._stacked_proc_data(nxt, tensordict))
        next_input = self._step_mdp(tensordict)
        if out.reset_mask is not None:
            self._merge_resets(next_input, out.reset, out.reset_mask)  # type: ignore[arg-type]
        return next_input

    # ------------------------------------------------------------------ rollouts
    def _rollout_stepper(self, plain: bool) -> PoolStepper | None:
        """A rollout takes the pool's whole-batch steps through its backend's stacked rows,
        overlapping consecutive steps where the backend can (:mod:`aenv.pool._pool_rollout`);
        a lazy pool's steps (heterogeneous envs) are kept as TensorDicts."""
        return None if self._lazy else PoolStepper(self)

    @property
    def _rand_from_specs(self) -> bool:  # type: ignore[override]
        # a whole batch's random actions are the stacked specs' draws (rand_action below
        # differs for streamed subsets and lazy pools only)
        return not self._lazy

    def _stacked_proc_data(
        self, nxt: TensorDictBase, td: TensorDictBase, owned: bool = True
    ) -> TensorDictBase:
        """The pool's ``_step_proc_data`` of stacked sub-env results, skipped where it is
        the identity: every sub-env already completed its own results (missing rewards,
        done flags made consistent level by level), so when the pool's reward and done
        keys are all there and it runs no type checks, completing the stack again would
        rebuild the same flags. ``owned`` False: ``nxt`` is a backend's rows (see
        :class:`~aenv.pool._backend.Stacked`), copied before anything is completed in it."""
        if self._stack_complete(nxt):
            return nxt
        return self._step_proc_data(nxt if owned else fast_clone(nxt), td)

    def _stack_complete(self, nxt: TensorDictBase) -> bool:
        """Whether :meth:`_stacked_proc_data` leaves ``nxt`` as it is (see there)."""
        if not self.run_type_checks and type(nxt) is TensorDict:
            has = nxt._tensordict.__contains__
            return all(map(has, self.done_keys)) and all(map(has, self.reward_keys))
        return False

    def _merge_resets(self, td: TensorDictBase, reset: TensorDictBase, mask: torch.Tensor) -> None:
        """:meth:`_write_resets` for stacked reset results: the rows ``mask`` flags (new
        tensors: the stepped tensordict shares the ones replaced)."""
        entries = td._tensordict if type(td) is TensorDict else None
        views: dict[int, torch.Tensor] = {}
        rows: torch.Tensor | None = None
        n = mask.shape[0]
        for key, value in reset.items():
            current = entries.get(key) if entries is not None else td.get(key, None)
            if not isinstance(current, torch.Tensor) or not isinstance(value, torch.Tensor):
                continue
            if (
                current.shape == value.shape
                and current.dtype == value.dtype
                and current.device == value.device
            ):
                flags = views.get(value.ndim)
                if flags is None:
                    flags = views[value.ndim] = mask.view(n, *(1,) * (value.ndim - 1))
                merged = torch.where(flags, value, current)
                if entries is not None:
                    entries[key] = merged  # the same shape, dtype and device: no checks
                else:
                    td.set(key, merged)
            else:
                if rows is None:
                    rows = mask.nonzero().squeeze(-1)
                target = current.clone()
                target[rows] = value[rows].to(target.device)
                td.set(key, target)

    def _write_resets(
        self, td: TensorDictBase, resets: list[tuple[int, TensorDictBase]]
    ) -> TensorDictBase:
        """Write the resets' rows into ``td``; returns it (a lazy stack of its rows when a
        reset's shapes differ from the row it replaces: dynamic specs)."""
        if not self._lazy and not isinstance(td, LazyStackedTensorDict):
            rows = td.batch_size[1:]
            if any(
                isinstance(current := td.get(key, None), torch.Tensor)
                and current.shape[1:] != value.shape
                for _, reset in resets
                for key, value in reset.items(True, True)
                if isinstance(value, torch.Tensor) and value.shape[: len(rows)] == rows
            ):
                td = LazyStackedTensorDict(*td.unbind(0), stack_dim=0)
        if self._lazy or isinstance(td, LazyStackedTensorDict):  # (dynamic shapes stack lazily)
            for i, reset in resets:
                td.tensordicts[i].update(reset.exclude("next", "env_index"))  # type: ignore[attr-defined]
            return td
        written: dict[Any, torch.Tensor] = {}
        texts: dict[Any, list[Any]] = {}  # non-tensor entries, as lists of the envs' values
        for i, reset in resets:
            # is_leaf_nontensor: non-tensor entries (a prompt) are leaves to write too
            for key in reset.keys(True, True, is_leaf=is_leaf_nontensor):
                if unravel(key)[0] == "next":
                    continue
                value = reset.get(key)
                if not isinstance(value, torch.Tensor):
                    values = texts.get(key)
                    if values is None:
                        current = td.get(key, None)
                        if current is None or not is_non_tensor(current):
                            continue
                        values = texts[key] = current.tolist()
                    values[i] = value.tolist() if is_non_tensor(value) else value
                    continue
                target = written.get(key)
                if target is None:
                    current = td.get(key, None)
                    if current is None:
                        continue
                    target = written[key] = current.clone()
                    td.set(key, target)
                target[i] = value
        for key, values in texts.items():
            td.set(key, NonTensorStack.from_list(values))
        return td

    # ------------------------------------------------------------------ seeding, calls
    async def set_seed(self, seed: int | None = None, static_seed: bool = False) -> int | None:
        """Seed env ``i`` with ``seed + i`` (every env with ``seed`` if ``static_seed``).

        Returns the next seed to use: ``seed + num_envs`` (``seed`` if static).
        """
        fixed = seed is None or static_seed
        payloads = [(seed if fixed else seed + i, True) for i in self._all]  # type: ignore[operator]
        outcomes = await self._run_ops("seed", self._all, payloads)
        self._raise_failures("seed", self._all, outcomes)
        return seed if fixed else seed + self.num_envs  # type: ignore[operator]

    async def _set_seed(self, seed: int | None) -> None:
        await self.set_seed(seed)

    async def call(
        self, method: str, *args: Any, env_indices: Sequence[int] | None = None, **kwargs: Any
    ) -> list[Any]:
        """Call ``method(*args, **kwargs)`` on the sub-envs (all, or ``env_indices``); one
        result per env, awaited where the method is async."""
        indices = list(self._all if env_indices is None else env_indices)
        outcomes = await self._run_ops("call", indices, [(method, args, kwargs)] * len(indices))
        self._raise_failures(f"call {method!r}", indices, outcomes)
        return outcomes

    async def get_attr(self, name: str, env_indices: Sequence[int] | None = None) -> list[Any]:
        """Read attribute ``name`` of the sub-envs, each where the env lives."""
        indices = list(self._all if env_indices is None else env_indices)
        outcomes = await self._run_ops("getattr", indices, [name] * len(indices))
        self._raise_failures(f"getattr {name!r}", indices, outcomes)
        return outcomes

    def sub_env_has_method(self, name: str) -> bool:
        """Whether the sub-envs' classes define a public method ``name`` (known from
        their metadata, without asking the envs)."""
        metas = self.__dict__.get("_metas") or ()
        return any(name in m.methods for m in metas)

    def __getattr__(self, name: str) -> Any:
        # Only reached for names the pool itself lacks: the sub-envs' attribute, one value
        # per env, read where it costs no I/O. Sub-envs in this process (coroutine and
        # thread backends) are read in place (a thread backend's env in its thread when
        # idle, never waiting on its work). Sub-envs elsewhere (worker processes) would
        # cost a blocking round trip per env on the event loop, for every typo or hasattr:
        # the awaited forms do that, all envs at once (and the sync facades fan ``env.name``
        # out through them).
        backend = self.__dict__.get("_backend")
        if name.startswith("_") or backend is None or "_metas" not in self.__dict__:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        if self.backend in _IN_PROCESS:
            return [backend.getattr_sync(i, name) for i in range(self.num_envs)]
        if self.sub_env_has_method(name):
            hint = f"call it on every sub-env with `await pool.call({name!r}, ...)`"
        else:
            hint = f"read the sub-envs' attribute with `await pool.get_attr({name!r})`"
        raise AttributeError(
            f"{type(self).__name__!r} object has no attribute {name!r}; its sub-envs live in "
            f"other processes: {hint} (or use a sync facade: ParallelEnv / SyncEnv fan "
            "`env.name` out)"
        )

    def rand_action(self, tensordict: TensorDictBase | None = None) -> TensorDictBase:
        """Random actions; for a streamed subset (an ``"env_index"`` entry), those envs' own."""
        if tensordict is None and self._lazy:
            # heterogeneous actions need a lazy stack to live in (one element per env)
            tensordict = LazyStackedTensorDict(
                *(TensorDict(batch_size=self._sub_batch, device=self.device) for _ in self._all),
                stack_dim=0,
            )
        if tensordict is None:
            return super().rand_action(tensordict)
        raw = entry(tensordict, "env_index")  # (the entry dict: read on every step)
        if raw is None:
            if not (
                self._lazy
                and isinstance(tensordict, LazyStackedTensorDict)
                and tensordict.stack_dim == 0
                and tensordict.batch_size == self.batch_size
            ):
                return super().rand_action(tensordict)
            rows = self._all
        elif tensordict.batch_size == self._sub_batch:
            index: Any = int(torch.as_tensor(raw).reshape(-1)[0])
            rows = [index]
        else:
            index = torch.as_tensor(raw).reshape(tensordict.batch_size[0], -1)[:, 0]
            rows = index.tolist()
            if rows == self._all and not self._lazy:  # the whole batch, in order
                return super().rand_action(tensordict)
        if self._lazy and (
            tensordict.batch_size == self._sub_batch
            or (isinstance(tensordict, LazyStackedTensorDict) and tensordict.stack_dim == 0)
        ):
            # each env's own action spec (they may differ, in dtype too: one stacked draw
            # would promote them to one dtype), element by element
            specs = self.full_action_spec.unbind(0)
            if tensordict.batch_size == self._sub_batch:
                tensordict.update(specs[index].rand())
            else:
                for sub, i in zip(tensordict.tensordicts, rows):  # type: ignore[attr-defined]
                    sub.update(specs[i].rand())
            return tensordict
        one = self._one_action_spec()
        if one is not None:
            # every env's spec is the same: a draw for the envs asked for alone
            tensordict.update(one.rand() if type(index) is int else one.rand((len(rows),)))
        else:
            tensordict.update(self.full_action_spec.rand()[index])
        return tensordict

    def _one_action_spec(self) -> Any:
        """The sub-envs' action spec when the pool's is that one spec stacked (each env's
        own bounds alike), else None; settled once per action spec."""
        spec = self.full_action_spec
        cached = self.__dict__.get("_one_action")
        if cached is None or cached[0] is not spec:
            one = spec[0] if self.num_envs else None
            try:
                same = one is not None and bool(torch.stack([one] * self.num_envs, 0) == spec)
            except Exception:  # (specs that do not stack or compare: draw for every env)
                same = False
            cached = self.__dict__["_one_action"] = (spec, one if same else None)
        return cached[1]

    def step_mdp(self, tensordict: TensorDictBase) -> TensorDictBase:
        """The input of the next step from a stepped tensordict (keeps ``"env_index"``)."""
        return self._step_mdp(tensordict)

    def _step_mdp(self, td: TensorDictBase) -> TensorDictBase:
        out = super()._step_mdp(td)
        if self.on_error == "observe":
            # a step's error entries describe that step, as its reward does: they do not
            # become the next step's input (nor its observations in a trajectory)
            present = [key for key in ERROR_KEYS if key in out.keys()]
            if present:
                out = out.exclude(*present)
        return out

    # ------------------------------------------------------------------ closing
    async def _aclose(self) -> None:
        self._fail_in_flight()  # (every ticket released: its step timer cancelled)
        for op in self._recv_waiters:
            self._wake(op, None)
        try:
            await self._backend.aclose(self.close_timeout)
        finally:
            self._gc.release()


class CoroutineAsyncEnvPool(AsyncEnvPool):
    """:class:`AsyncEnvPool` on the coroutine backend (``backend="coroutine"``)."""

    _backend_name = "coroutine"


class ThreadingAsyncEnvPool(AsyncEnvPool):
    """:class:`AsyncEnvPool` on the thread backend (``backend="threading"``): one thread per env."""

    _backend_name = "thread"


#: The pool class each backend's pools are built as (``"module:Class"`` for those in
#: modules imported on first use).
_BY_BACKEND: dict[str, type[AsyncEnvPool] | str] = {
    "coroutine": CoroutineAsyncEnvPool,
    "thread": ThreadingAsyncEnvPool,
    "process": "aenv.pool._process_pool:ProcessorAsyncEnvPool",
}


def _pool_class(name: str, default: type[AsyncEnvPool]) -> type[AsyncEnvPool]:
    found = _BY_BACKEND.get(name, default)
    if isinstance(found, str):
        module_name, _, cls_name = found.partition(":")
        found = _BY_BACKEND[name] = getattr(importlib.import_module(module_name), cls_name)
    assert not isinstance(found, str)
    return found
