"""EnvBase: the async environment base class."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from tensordict import TensorDict, TensorDictBase

from aenv._mdp import (
    any_true,
    complete_done,
    entry,
    fast_step_mdp,
    getter,
    mask_merge,
    pad_mask,
    put,
    reduce_mask,
    set_next,
    step_mdp,
    unravel,
)
from aenv._mdp_tree import NO_DIMS, fast_update
from aenv.envs._actions import cast_action, check_stacked_action, heterogeneous, write_casts
from aenv.envs._specs import EnvSpecsMixin, fake_from_specs
from aenv.envs._threads import run_blocking
from aenv.exceptions import (
    BatchSizeError,
    DoneAfterResetError,
    EnvClosedError,
    SpecViolationError,
)

if TYPE_CHECKING:
    from aenv.envs._rollout_batch import BatchStepper

__all__ = ["EnvBase"]


class _EnvMeta(type):
    """Runs ``_post_init`` once the most-derived ``__init__`` has finished.

    Also implements the ``auto_reset`` / ``auto_reset_replace`` arguments every env accepts
    (unless its ``__init__`` declares ``auto_reset`` itself): with ``auto_reset=True`` the
    env comes back wrapped in an :class:`~aenv.transforms.AutoResetEnv`.
    """

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        auto_reset = False
        replace = True
        if "auto_reset" in kwargs and not _declares_auto_reset(cls):
            auto_reset = bool(kwargs.pop("auto_reset"))
            replace = bool(kwargs.pop("auto_reset_replace", True))
        obj = super().__call__(*args, **kwargs)
        obj._post_init()
        if auto_reset:
            from aenv.transforms._autoreset import wrap_auto_reset

            return wrap_auto_reset(obj, replace)
        return obj


@functools.cache
def _declares_auto_reset(cls: type) -> bool:
    """Whether ``cls.__init__`` takes ``auto_reset`` itself (then it is passed through)."""
    try:
        return "auto_reset" in inspect.signature(cls.__init__).parameters  # type: ignore[misc]
    except (TypeError, ValueError):
        return False


class EnvBase(EnvSpecsMixin, metaclass=_EnvMeta):
    """Base class of every aenv environment; all I/O methods are coroutines.

    Subclasses set their specs in ``__init__`` (shapes include ``batch_size``) and implement
    ``_reset(td)``, ``_step(td)`` and ``_set_seed(seed)``, each either ``async def`` or plain
    ``def``. A plain ``def`` runs inline; an env whose sync methods block (I/O, sleeps, C
    calls holding the GIL) sets ``blocking = True`` and they then run in a worker thread,
    so the event loop never stalls.

    Args:
        device: device of the env's tensors (None: wherever they are made).
        batch_size: the env's own batch dims; spec shapes start with them.
        run_type_checks: check every step's output (and actions' values) against the specs.
        allow_done_after_reset: accept a done flag set right after a reset.
        spec_locked: lock the specs after ``__init__`` (assigning a spec still works).

    Example:
        >>> class Counter(EnvBase):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.observation_spec = Composite(count=Unbounded((1,)))
        ...         self.action_spec = Unbounded((1,))
        ...     async def _reset(self, td):
        ...         self.n = 0
        ...         return TensorDict(count=torch.zeros(1))
        ...     async def _step(self, td):
        ...         self.n += 1
        ...         return TensorDict(count=torch.full((1,), float(self.n)),
        ...                           reward=torch.ones(1), done=torch.tensor([self.n >= 5]))
        ...     def _set_seed(self, seed):
        ...         pass
        >>> rollout = await Counter().rollout(10)
        >>> rollout.batch_size
        torch.Size([5])
    """

    blocking: ClassVar[bool] = False
    _handles_partial_steps: ClassVar[bool] = False
    #: set by envs whose ``_step`` always returns consistent ``done`` / ``terminated`` (and
    #: declared ``truncated``) entries, so the per-step completion can be skipped
    _done_outputs_complete: ClassVar[bool] = False
    #: whether :meth:`rand_action` draws each action spec's ``rand()`` in order, so that a
    #: rollout may draw them a chunk of steps at a time (:class:`~aenv.envs._rollout_stores._Draws`);
    #: False for a class replacing ``rand_action`` unless it says so too
    _rand_from_specs: ClassVar[bool] = True
    _step_is_async: ClassVar[bool] = False
    _reset_is_async: ClassVar[bool] = False
    _seed_is_async: ClassVar[bool] = False

    async def _step_into(
        self, tensordict: TensorDictBase, out: TensorDictBase | None, index: int | None = None
    ) -> bool | TensorDictBase:
        """The env's step, from the checked input ``tensordict`` into the row ``out``.

        ``out`` is a preallocated TensorDict holding a step's ``"next"`` content as the
        specs plan it (:func:`~aenv.envs._rowplan.plan_rows`: a process worker's result
        slot, a pool's row), or None (no row: the caller takes a TensorDict). With ``index``,
        ``out`` holds rows along a leading dim (a rollout's time steps) and the step writes
        row ``index``; ``tensordict`` is then the input, or, when it has that leading dim too
        (more batch dims than the env), a buffer of inputs whose row ``index`` is the input.
        Returns the root ``"done"`` flag as a bool once every leaf of the row holds the
        step's value, completed as :meth:`step` gives it; or the step's completed ``"next"``
        TensorDict when nothing was written (no row, or a row the env cannot fill), for the
        caller to copy or ship.

        The default runs ``_step`` (inline, awaited, or in a thread for a blocking env) and
        completes its result (:meth:`_step_proc_data`); it never writes. An env that can
        write its outputs straight into a row overrides it (and its partner
        :meth:`_reset_into`); a subclass that replaces ``_step`` (or ``_reset``) below such
        an override gets the default back (see ``__init_subclass__``), so the override never
        stands in for code it does not run.
        """
        if index is not None and tensordict.batch_dims > len(self.batch_size):
            tensordict = tensordict[index]
        if self._step_is_async:
            next_td = await self._step(tensordict)
        elif self.blocking:
            next_td = await run_blocking(self._step, tensordict)
        else:
            next_td = self._step(tensordict)
        return self._step_proc_data(next_td, tensordict)

    async def _reset_into(
        self, stepped: TensorDictBase, out: TensorDictBase | None, index: int | None = None
    ) -> bool | TensorDictBase:
        """After the step ``stepped`` (an input with its ``"next"``): the next step's input,
        with the elements that step ended reset, into the row ``out`` (a reset's outputs as
        the specs plan them: a process worker's reset slot) or None. With ``index``,
        ``stepped`` and ``out`` hold rows along a leading dim (a rollout's buffers: the
        step is row ``index`` of ``stepped``, the input it gives goes to row ``index`` of
        ``out``).

        Returns True once ``out`` holds it, or the TensorDict when nothing was written. The
        default is ``step_mdp`` of ``stepped``, ``"_reset"`` flags where done, then
        :meth:`reset` when any is set: the "maybe reset" of :meth:`step_and_maybe_reset`.
        """
        if self._closed:
            self._check_open()
        if index is not None and stepped.batch_dims > len(self.batch_size):
            stepped = stepped[index]
        next_input = self._step_mdp(stepped)
        if self._any_done_write_reset(next_input):
            return await self.reset(next_input)
        return next_input

    def _rollout_stepper(self, plain: bool) -> BatchStepper | None:
        """How a rollout takes this batched env's whole-batch steps when it keeps them in
        time rows (:mod:`aenv.envs._rollout_batch`), or None: TensorDicts keep them.
        ``plain``: the env keeps :class:`EnvBase`'s ``step`` and ``step_and_maybe_reset``
        (the default stepper runs their bodies); a pool takes its backend's stacked path
        (and overlaps consecutive steps where the backend can)."""
        if not plain:
            return None
        from aenv.envs._rollout_batch import BatchStepper

        return BatchStepper(self)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # The one rule for direct writers: a class replacing _step or _reset below a class
        # whose _step_into / _reset_into write straight into rows (standing in for the
        # _step / _reset they knew) gets the defaults back, which call its own.
        if ("_step" in cls.__dict__ or "_reset" in cls.__dict__) and not (
            "_step_into" in cls.__dict__ or "_reset_into" in cls.__dict__
        ):
            cls._step_into = EnvBase._step_into  # type: ignore[method-assign]
            cls._reset_into = EnvBase._reset_into  # type: ignore[method-assign]
        if "rand_action" in cls.__dict__ and "_rand_from_specs" not in cls.__dict__:
            cls._rand_from_specs = False
        locked = cls.__dict__.get("batch_locked")
        if isinstance(locked, bool):  # TorchRL's `batch_locked = False` class attribute
            cls._batch_locked = locked
            delattr(cls, "batch_locked")  # the property (and its setter) again
        cls._step_is_async = inspect.iscoroutinefunction(cls._step)
        cls._reset_is_async = inspect.iscoroutinefunction(cls._reset)
        cls._seed_is_async = inspect.iscoroutinefunction(cls._set_seed)

    def __init__(
        self,
        *,
        device: torch.device | str | int | None = None,
        batch_size: torch.Size | tuple[int, ...] | list[int] | None = None,
        run_type_checks: bool = False,
        allow_done_after_reset: bool = False,
        spec_locked: bool = True,
    ) -> None:
        self._device = torch.device(device) if device is not None else None
        # (one empty Size for every unbatched env: an object fewer per env of a big pool)
        self.batch_size = torch.Size(batch_size) if batch_size else NO_DIMS
        self.run_type_checks = run_type_checks
        self.allow_done_after_reset = allow_done_after_reset
        self._spec_locked = False
        self._want_spec_lock = spec_locked
        self._closed = False
        if not hasattr(self, "_batch_locked"):
            self._batch_locked = True
        self._init_specs()

    def _post_init(self) -> None:
        self._finish_specs()

    # ------------------------------------------------------------------ basic attributes
    @property
    def device(self) -> torch.device | None:
        return self._device

    @property
    def batch_locked(self) -> bool:
        """Whether inputs must have exactly the env's batch size (False: any leading dims)."""
        return self._batch_locked

    @batch_locked.setter
    def batch_locked(self, value: bool) -> None:
        self._batch_locked = bool(value)

    @property
    def is_closed(self) -> bool:
        return self._closed

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(batch_size={tuple(self.batch_size)}, device={self.device}, "
            f"batch_locked={self.batch_locked})"
        )

    # ------------------------------------------------------------------ to implement
    def _reset(self, tensordict: TensorDictBase | None, **kwargs: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__} must implement _reset")

    def _step(self, tensordict: TensorDictBase) -> Any:
        raise NotImplementedError(f"{type(self).__name__} must implement _step")

    def _set_seed(self, seed: int | None) -> Any:
        raise NotImplementedError(f"{type(self).__name__} must implement _set_seed")

    async def _aclose(self) -> None:
        """Release the env's resources; subclasses override (called once by ``aclose``)."""

    async def _run(self, is_async: bool, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if is_async:
            return await fn(*args, **kwargs)
        if self.blocking:
            return await run_blocking(fn, *args, **kwargs)
        return fn(*args, **kwargs)

    # ------------------------------------------------------------------ checks
    def _check_open(self) -> None:
        if self._closed:
            raise EnvClosedError(f"{type(self).__name__} is closed")

    def _check_batch(self, td: TensorDictBase) -> None:
        bs = self.batch_size
        if self._batch_locked:
            if td.batch_size != bs:
                raise BatchSizeError(
                    f"{type(self).__name__} is batch-locked: expected an input of batch size "
                    f"{tuple(bs)}, got {tuple(td.batch_size)}"
                )
        elif bs and td.batch_size[len(td.batch_size) - len(bs) :] != bs:
            raise BatchSizeError(
                f"{type(self).__name__}: input batch size {tuple(td.batch_size)} must end with "
                f"the env's batch size {tuple(bs)}"
            )

    def _check_actions(self, td: TensorDictBase) -> None:
        extra = self._extra_dims(td)
        get = getter(td)
        # (tensordict or None for td, key, value) casts, written once every action passed
        # the checks: a failed check leaves the input as it came
        casts: list[tuple[Any, Any, torch.Tensor]] = []
        for key, spec, tensorlike in self._action_checks:
            mixed = spec.dtype is None  # a stack of specs whose dtypes differ
            try:
                value = get(key)
            except RuntimeError:  # a lazy stack whose actions differ in shape
                value, mixed = None, True
            if mixed:  # (also every non-tensor action: its spec has no dtype either)
                if heterogeneous(td, key, spec):  # one spec per element of a lazy stack
                    casts += check_stacked_action(td, key, spec, self.run_type_checks)
                    continue
            if value is None:
                raise SpecViolationError(
                    f"action key {key!r} is missing from the input; expected {spec!r}", key=key
                )
            if not tensorlike:
                continue
            shape = value.shape
            expected = spec.shape if not extra else torch.Size((*extra, *spec.shape))
            if shape != expected and (
                len(shape) != len(expected)
                or any(e != -1 and e != s for e, s in zip(expected, shape))
            ):
                raise SpecViolationError(
                    f"action {key!r} has shape {tuple(shape)}, expected {tuple(expected)} "
                    f"(spec {spec!r})",
                    key=key,
                )
            if value.dtype != spec.dtype:
                value = cast_action(key, spec, value)
                casts.append((None, key, value))
            if self.run_type_checks:
                check = spec.expand(*expected) if extra else spec
                if not check.is_in(value):
                    raise SpecViolationError(
                        f"action {key!r} is outside its spec {spec!r}: got min "
                        f"{value.min().item() if value.numel() else None}, max "
                        f"{value.max().item() if value.numel() else None}",
                        key=key,
                    )
        if casts:
            write_casts(td, casts)

    def _extra_dims(self, td: TensorDictBase) -> torch.Size:
        """Leading dims of ``td`` beyond the env's batch size (none on a batch-locked env)."""
        if self._batch_locked:
            return NO_DIMS
        return td.batch_size[: td.batch_dims - len(self.batch_size)]

    # ------------------------------------------------------------------ step
    async def step(self, tensordict: TensorDictBase) -> TensorDictBase:
        """Step the env with the action(s) in ``tensordict``; writes results under ``"next"``.

        A boolean ``"_step"`` entry restricts the step to some batch elements; the others
        get their previous values (from ``tensordict``) or zeros under ``"next"``.
        """
        return await self._step_checked(tensordict, True)

    async def _step_checked(
        self, tensordict: TensorDictBase, check_actions: bool
    ) -> TensorDictBase:
        """:meth:`step`'s body; ``check_actions=False`` skips the action checks, for actions
        drawn from the action spec by :meth:`rand_action` (they pass by construction)."""
        if self._closed:
            self._check_open()
        self._check_batch(tensordict)
        if not self._handles_partial_steps:
            partial = entry(tensordict, "_step")
            if partial is not None:
                mask = reduce_mask(partial, (*tensordict.batch_size, 1)).to(torch.bool)
                if bool(mask.all()):
                    tensordict = tensordict.exclude("_step")
                else:
                    next_td = await self._partial_step(tensordict, mask)
                    tensordict.set("next", next_td)
                    return tensordict
        if check_actions:
            self._check_actions(tensordict)
        result = await self._step_into(tensordict, None)
        assert not isinstance(result, bool)  # no row given: nothing written
        return set_next(tensordict, result)

    async def _partial_step(self, tensordict: TensorDictBase, mask: torch.Tensor) -> TensorDictBase:
        base = tensordict.exclude("_step", "next")
        if not bool(mask.any()):
            return self._previous_as_next(base)
        if not self._batch_locked:
            sub = base[mask]
            self._check_actions(sub)
            sub_next = await self._step_into(sub, None)
            assert not isinstance(sub_next, bool)
            full = self._previous_as_next(base)
            for key in sub_next.keys(include_nested=True, leaves_only=True):
                if full.get(key, None) is None:
                    value = sub_next.get(key)
                    full.set(key, value.new_zeros((*mask.shape, *value.shape[1:])))
            full[mask] = sub_next
            return full
        # batch-locked: the env sees "_step" and may honour it; outputs are masked anyway
        base.set("_step", tensordict.get("_step"))
        self._check_actions(base)
        next_td = await self._step_into(base, None)
        assert not isinstance(next_td, bool)
        return mask_merge(next_td, base, mask)

    def _previous_as_next(self, td: TensorDictBase) -> TensorDictBase:
        """The ``"next"`` of an element that did not step: its current values, zero reward."""
        out = self.output_spec.zero(self._extra_dims(td))
        flat = TensorDict({}, batch_size=td.batch_size, device=td.device)
        for sub in ("full_observation_spec", "full_done_spec", "full_reward_spec"):
            flat.update(out.get(sub))
        rewards = {unravel(k) for k in self.reward_keys}
        for key in flat.keys(include_nested=True, leaves_only=True):
            if unravel(key) in rewards:
                continue
            prev = td.get(key, None)
            if prev is not None:
                # a copy: partial steps write the stepped elements into it
                flat.set(key, prev.clone())
        return flat

    def _step_proc_data(self, next_td: Any, input_td: TensorDictBase) -> TensorDictBase:
        if type(next_td) is not TensorDict and not isinstance(next_td, TensorDictBase):
            raise TypeError(
                f"{type(self).__name__}._step must return a TensorDict, got {type(next_td).__name__}"
            )
        if self._device is not None and next_td.device != self._device:
            next_td = self._on_device(next_td)
        # (every step of every env passes here: the batch-locked case and a plain
        # TensorDict's string keys read without a call)
        extra = NO_DIMS if self._batch_locked else self._extra_dims(input_td)
        plain = type(next_td) is TensorDict
        for key, zero in self._reward_zero.items():
            got = (
                next_td._tensordict.get(key)
                if plain and type(key) is str
                else next_td.get(key, None)
            )
            if got is None:
                next_td.set(
                    key, zero.expand(*extra, *zero.shape).clone() if extra else zero.clone()
                )
        if not self._done_outputs_complete:
            zeros = self._done_zeros
            if extra:
                zeros = {p: z.expand(*extra, *z.shape) for p, z in zeros.items()}
            complete_done(next_td, self._done_groups, zeros)
        if self.run_type_checks:
            self._check_outputs(next_td, extra)
        return next_td

    def _on_device(self, td: TensorDictBase) -> TensorDictBase:
        """``td`` (a ``_step`` or ``_reset`` output) on the env's device: as in TorchRL, an
        env's outputs live on ``env.device`` whatever device its code made them on. An env
        that builds them there (tensors and TensorDict) never pays for this cast."""
        return td.to(self._device)

    def _check_outputs(self, td: TensorDictBase, extra: torch.Size) -> None:
        for name in ("full_observation_spec", "full_reward_spec", "full_done_spec"):
            spec = self.output_spec[name]
            if extra:
                spec = spec.expand(*extra, *spec.shape)
            spec.assert_is_in(td)

    # ------------------------------------------------------------------ reset
    async def reset(
        self, tensordict: TensorDictBase | None = None, **kwargs: Any
    ) -> TensorDictBase:
        """Reset the env (or the parts flagged by ``"_reset"`` entries) and return the first
        tensordict of a rollout: observations, state and done flags.

        With partial ``"_reset"`` masks, only flagged elements are reset: the others keep the
        values of the input ``tensordict`` (updated in place), and ``"_reset"`` entries are
        removed. A ``"_reset"`` at the root overrides nested ones.
        """
        self._check_open()
        masks: dict[tuple[str, ...], torch.Tensor] | None = None
        if tensordict is not None:
            self._check_batch(tensordict)
            masks = self._reset_masks(tensordict)
            if masks is not None and not any(bool(m.any()) for m in masks.values()):
                self._drop_reset_keys(tensordict)
                return tensordict
        out = await self._run(self._reset_is_async, self._reset, tensordict, **kwargs)
        return self._reset_proc_data(tensordict, out, masks)

    def _reset_masks(self, td: TensorDictBase) -> dict[tuple[str, ...], torch.Tensor] | None:
        reset_keys = self.reset_keys
        found = {}
        get = getter(td)
        for key in reset_keys:
            value = get(key)
            if value is not None:
                found[unravel(key)[:-1]] = value
        if not found:
            return None
        if () in found:
            root = found[()]
            # the root entry supersedes nested ones: make the env see the same masks
            for key in reset_keys:
                prefix = unravel(key)[:-1]
                if prefix and prefix in found:
                    nested = found[prefix]
                    r = reduce_mask(root, self._done_shape(()))
                    td.set(key, pad_mask(r, nested.ndim).expand_as(nested).clone())
            return {(): reduce_mask(root, self._done_shape(())).to(torch.bool)}
        return {p: reduce_mask(m, self._done_shape(p)).to(torch.bool) for p, m in found.items()}

    def _done_shape(self, prefix: tuple[str, ...]) -> torch.Size:
        names = self._done_groups.get(prefix)
        if not names:
            return torch.Size([1])
        return self.full_done_spec[(*prefix, names[0])].shape

    def _drop_reset_keys(self, td: TensorDictBase) -> None:
        for key in self.reset_keys:
            if entry(td, key) is not None:
                del td[key]

    def _reset_proc_data(
        self,
        tensordict: TensorDictBase | None,
        out: Any,
        masks: dict[tuple[str, ...], torch.Tensor] | None,
    ) -> TensorDictBase:
        if not isinstance(out, TensorDictBase):
            raise TypeError(
                f"{type(self).__name__}._reset must return a TensorDict, got {type(out).__name__}"
            )
        if self._device is not None and out.device != self._device:
            out = self._on_device(out)
        extra = out.batch_size[: out.batch_dims - len(self.batch_size)]
        zeros = self._done_zeros
        if extra:
            zeros = {p: z.expand(*extra, *z.shape) for p, z in zeros.items()}
        complete_done(out, self._done_groups, zeros)
        self._drop_reset_keys(out)
        if masks is not None and tensordict is not None:
            for prefix, mask in masks.items():
                if any_true(mask) if mask.numel() == 1 else bool(mask.all()):
                    continue  # every element was reset: nothing of the input to keep
                if prefix:
                    sub_new = out.get(prefix, None)
                    if sub_new is not None:
                        mask_merge(sub_new, tensordict.get(prefix, None), mask)
                else:
                    mask_merge(out, tensordict, mask)
        if not self.allow_done_after_reset:
            self._check_done_after_reset(out, masks)
        if self.run_type_checks:
            for name in ("full_observation_spec", "full_done_spec"):
                spec = self.output_spec[name]
                (spec.expand(*extra, *spec.shape) if extra else spec).assert_is_in(out)
        if tensordict is None:
            return out
        self._drop_reset_keys(tensordict)
        return fast_update(tensordict, out)

    def _check_done_after_reset(
        self, out: TensorDictBase, masks: dict[tuple[str, ...], torch.Tensor] | None
    ) -> None:
        for prefix in self._done_groups:
            sub = out.get(prefix, None) if prefix else out
            if sub is None:
                continue
            done = entry(sub, "done")
            if done is None or not any_true(done):
                continue  # (no element done: none done after its reset)
            flag = reduce_mask(done, done.shape)
            mask = None
            if masks is not None:
                mask = masks.get(prefix, masks.get(()))
            if mask is not None and mask.shape == flag.shape[: mask.ndim]:
                flag = flag & pad_mask(mask, flag.ndim)
            if bool(flag.any()):
                raise DoneAfterResetError(
                    f"{type(self).__name__} returned done=True right after a reset "
                    f"(level {prefix or 'root'}); pass allow_done_after_reset=True if that is "
                    "expected"
                )

    # ------------------------------------------------------------------ composites
    async def step_and_maybe_reset(
        self, tensordict: TensorDictBase
    ) -> tuple[TensorDictBase, TensorDictBase]:
        """Step, then reset the elements that are done.

        Returns ``(stepped, next_input)``: the stepped tensordict (with ``"next"``) and the
        input of the next step (``step_mdp`` of it, with done elements reset).
        """
        tensordict = await self.step(tensordict)
        next_input = await self._reset_into(tensordict, None)
        assert not isinstance(next_input, bool)
        return tensordict, next_input

    def _step_mdp(self, td: TensorDictBase) -> TensorDictBase:
        """``step_mdp`` with this env's keys (the exclusion tree is cached)."""
        plan = self._fast_mdp
        if plan is not None:
            nxt = entry(td, "next")
            if nxt is not None:
                out = fast_step_mdp(td, nxt, *plan)
                if out is not None:
                    return out
        return step_mdp(td, reward_keys=self.reward_keys, _tree=self._mdp_tree)

    def _any_done_write_reset(self, td: TensorDictBase) -> bool:
        """Write ``"_reset"`` = done at each done level of ``td``; True if any is set."""
        any_done = False
        for prefix in self._done_groups:
            sub = td.get(prefix, None) if prefix else td
            if sub is None:
                continue
            done = entry(sub, "done")
            if done is None:
                continue
            if any_true(done):
                any_done = True
                sub.set("_reset", done.clone())
        return any_done

    # ------------------------------------------------------------------ helpers
    def rand_action(self, tensordict: TensorDictBase | None = None) -> TensorDictBase:
        """Write a random action (drawn from the action spec) into ``tensordict``."""
        if tensordict is None:
            tensordict = TensorDict({}, batch_size=self.batch_size, device=self.device)
        extra = self._extra_dims(tensordict)
        if extra:
            tensordict.update(self.full_action_spec.rand(extra))
        else:
            for key, spec, _ in self._action_checks:
                if type(key) is str:
                    put(tensordict, key, spec.rand())
                else:
                    tensordict.set(key, spec.rand())
        return tensordict

    async def rand_step(self, tensordict: TensorDictBase | None = None) -> TensorDictBase:
        """Step with a random action."""
        return await self.step(self.rand_action(tensordict))

    async def set_seed(self, seed: int | None = None, static_seed: bool = False) -> int | None:
        """Seed the env; returns the next seed to use (``seed + 1``, or ``seed`` if static)."""
        await self._run(self._seed_is_async, self._set_seed, seed)
        if seed is None or static_seed:
            return seed
        return seed + 1

    def fake_tensordict(self) -> TensorDictBase:
        """A zero-filled tensordict with every key a step produces, ``"next"`` included."""
        return fake_from_specs(self.output_spec, self.input_spec, self.batch_size, self.device)

    def add_truncated_keys(self) -> EnvBase:
        """Add a ``"truncated"`` entry beside every ``"done"`` in the done spec."""
        full = self.full_done_spec.clone()
        full.unlock_()
        for key in list(full.keys(include_nested=True, leaves_only=True)):
            key_t = unravel(key)
            if key_t[-1] == "done" and (*key_t[:-1], "truncated") not in full:
                full[(*key_t[:-1], "truncated")] = full[key].clone()
        self.full_done_spec = full
        return self

    # ------------------------------------------------------------------ lifecycle
    async def aclose(self) -> None:
        """Close the env and release its resources; idempotent."""
        if self._closed:
            return
        self._closed = True
        await self._aclose()

    def close(self) -> None:
        """Close the env from sync code (TorchRL's name); idempotent. In async code, and
        inside any running event loop, use ``await env.aclose()`` (this raises
        :class:`~aenv.exceptions.AsyncContextError` there)."""
        if self._closed:
            return
        from aenv.sync._runner import run_blocking

        run_blocking(self.aclose, api=f"{type(self).__name__}.close()", twin="await env.aclose()")

    def append_transform(self, transform: Any) -> EnvBase:
        """This env wrapped in a :class:`~aenv.TransformedEnv` with ``transform`` (TorchRL's
        shortcut; a TransformedEnv appends to its own chain instead)."""
        from aenv.transforms import TransformedEnv

        return TransformedEnv(self, transform)

    async def __aenter__(self) -> EnvBase:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # ------------------------------------------------------------------ rollout
    async def rollout(
        self,
        max_steps: int,
        policy: Callable[..., Any] | None = None,
        callback: Callable[..., Any] | None = None,
        *,
        auto_reset: bool = True,
        auto_cast_to_device: bool = False,
        break_when_any_done: bool | None = None,
        break_when_all_done: bool | None = None,
        return_contiguous: bool | None = True,
        tensordict: TensorDictBase | None = None,
        set_truncated: bool = False,
        storing_device: torch.device | str | None = None,
    ) -> TensorDictBase:
        """Run ``max_steps`` steps and stack them along a trailing ``"time"`` dim.

        ``policy`` is a ``TensorDictModule``, any callable on a TensorDict (returning it or
        None), an ``async def`` callable, or None for random actions. With
        ``break_when_any_done`` (the default) the rollout stops at the first done; with
        ``break_when_all_done`` done elements stop stepping (partial steps) until all are
        done; with neither, done elements are reset and the rollout goes on.

        ``auto_cast_to_device``: a policy with parameters on another device than the env
        is called on a copy of each step's input cast to that device, and its result is
        cast back to the env's device before the step. ``storing_device``: the device of
        the returned rollout (default: where the steps are).
        """
        from aenv.envs._rollout import run_rollout

        return await run_rollout(
            self,
            max_steps,
            policy,
            callback,
            auto_reset=auto_reset,
            auto_cast_to_device=auto_cast_to_device,
            break_when_any_done=break_when_any_done,
            break_when_all_done=break_when_all_done,
            return_contiguous=return_contiguous,
            tensordict=tensordict,
            set_truncated=set_truncated,
            storing_device=storing_device,
        )

    # ------------------------------------------------------------------ interruption
    def interrupt(self) -> None:
        """Stop the env's work in progress from outside, e.g. kill a subprocess it waits on.

        Called by a pool from another thread when it gives up on the env (a thread
        backend's step past its deadline, or closing while the env works), where the
        call itself cannot be cancelled. Must be thread-safe and must not block; the
        default does nothing.
        """
