"""Bookkeeping transforms: TrajCounter, FiniteTensorDictCheck, RemoveEmptySpecs."""

from __future__ import annotations

import torch
from tensordict import TensorDict, TensorDictBase

from aenv._mdp import NestedKey, unravel
from aenv.exceptions import SpecViolationError
from aenv.specs import Composite, Unbounded
from aenv.transforms._base import Transform
from aenv.transforms._t2_common import batch_mask, where_batch

__all__ = ["FiniteTensorDictCheck", "RemoveEmptySpecs", "TrajCounter"]


class TrajCounter(Transform):
    """Global trajectory counter transform.

    Every trajectory gets an id (``out_key``, int64 of shape ``(*batch, 1)``): each reset
    element takes the next value of a counter, and steps carry the id forward. A partial
    reset gives new ids to the reset elements only. The counter is a module buffer, so
    clones of the transform (``transform.clone()``, the parents of later transforms) share
    it and never hand out the same id twice in one process.

    Args:
        out_key: where to write the id (default ``"traj_count"``).

    Example:
        >>> env = TransformedEnv(CountingEnv(max_steps=2), TrajCounter())
        >>> r = await env.rollout(6, break_when_any_done=False)
        >>> r["traj_count"].squeeze(-1)
        tensor([0, 0, 1, 1, 2, 2])
    """

    _counter: torch.Tensor

    def __init__(self, out_key: NestedKey = "traj_count") -> None:
        super().__init__(out_keys=[])
        self.out_key = out_key
        self.register_buffer("_counter", torch.zeros((), dtype=torch.int64))
        self._last: torch.Tensor | None = None

    @property
    def counter(self) -> int:
        """The id the next trajectory will get."""
        return int(self._counter.item())

    def _take(self, n: int, device: torch.device) -> torch.Tensor:
        start = int(self._counter.item())
        self._counter.add_(n)  # in place: clones share the counter
        return torch.arange(start, start + n, dtype=torch.int64, device=device)

    def _reset(
        self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase
    ) -> TensorDictBase:
        bs = tensordict_reset.batch_size
        device = self._counter.device
        mask = batch_mask(tensordict, bs)
        if mask is None:
            ids = self._take(bs.numel(), device).reshape(*bs, 1)
        else:
            prev = tensordict.get(self.out_key, None)
            if not isinstance(prev, torch.Tensor) or prev.shape != (*bs, 1):
                prev = (
                    self._last if self._last is not None and self._last.shape == (*bs, 1) else None
                )
            if prev is None:
                prev = torch.full((*bs, 1), -1, dtype=torch.int64, device=device)
            fresh = torch.full_like(prev, -1)
            fresh[mask] = self._take(int(mask.sum()), device).unsqueeze(-1)
            ids = where_batch(mask, fresh, prev)
        self._last = ids
        if tensordict_reset.device is not None:
            ids = ids.to(tensordict_reset.device)
        tensordict_reset.set(self.out_key, ids)
        return tensordict_reset

    def _step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
        ids = tensordict.get(self.out_key, None)
        if ids is None:
            ids = self._last
        if ids is None or ids.shape != (*next_tensordict.batch_size, 1):
            raise KeyError(
                f"TrajCounter: {self.out_key!r} is missing from the step input; reset the env "
                "through the transformed env first"
            )
        next_tensordict.set(self.out_key, ids.clone())
        return next_tensordict

    def _call(self, next_tensordict: TensorDictBase) -> TensorDictBase:
        return next_tensordict

    def transform_observation_spec(self, observation_spec: Composite) -> Composite:
        bs = observation_spec.shape
        observation_spec[self.out_key] = Unbounded(
            (*bs, 1), dtype=torch.int64, device=observation_spec.device
        )
        return observation_spec

    def extra_repr(self) -> str:
        return f"out_key={self.out_key!r}, counter={self.counter}"


class FiniteTensorDictCheck(Transform):
    """This transform will check that all the items of the tensordict are finite, and raise an
    exception if they are not.

    Every floating-point (and complex) tensor of each step and reset output is checked; a
    NaN or infinity raises :class:`~aenv.exceptions.SpecViolationError` (a ``ValueError``)
    naming the key.

    Example:
        >>> env = TransformedEnv(PendulumEnv(), FiniteTensorDictCheck())
        >>> _ = await env.rollout(3)  # raises if the env ever outputs nan or inf
    """

    def __init__(self) -> None:
        super().__init__()

    def _call(self, next_tensordict: TensorDictBase) -> TensorDictBase:
        for key, value in next_tensordict.items(include_nested=True, leaves_only=True):
            if not isinstance(value, torch.Tensor):
                continue
            if (value.is_floating_point() or value.is_complex()) and not bool(
                torch.isfinite(value).all()
            ):
                raise SpecViolationError(
                    f"FiniteTensorDictCheck: the entry {key!r} holds non-finite values "
                    f"(nan: {int(torch.isnan(value).sum())}, inf: {int(torch.isinf(value).sum())})",
                    key=key,
                )
        return next_tensordict

    def _reset(
        self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase
    ) -> TensorDictBase:
        return self._call(tensordict_reset)


def _empty_composite_keys(spec: Composite) -> list[tuple[str, ...]]:
    """Keys of the composites of ``spec`` that hold no leaf at all (outermost ones only)."""
    out = []
    for key, value in spec.items():
        if isinstance(value, Composite):
            if value.is_empty():
                out.append(unravel(key))
            else:
                out.extend((key, *sub) for sub in _empty_composite_keys(value))
    return out


def _drop_empty(td: TensorDictBase) -> TensorDictBase:
    for key in list(td.keys()):
        value = td.get(key)
        if isinstance(value, TensorDictBase):
            if value.is_empty():
                td.del_(key)
            else:
                _drop_empty(value)
    return td


class RemoveEmptySpecs(Transform):
    """Removes empty specs and content from an environment.

    Composite entries with no leaf (``Composite()`` in a spec, empty sub-TensorDicts in the
    data) are dropped from every spec and from step and reset outputs. On the way in, the
    empty entries the base env declares as input (actions, state) are put back, so it sees
    what it expects.

    Example:
        >>> env = TransformedEnv(EnvWithEmptyEntries(), RemoveEmptySpecs())
        >>> "empty" in env.observation_spec
        False
    """

    def __init__(self) -> None:
        super().__init__()

    def _call(self, next_tensordict: TensorDictBase) -> TensorDictBase:
        return _drop_empty(next_tensordict)

    def _reset(
        self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase
    ) -> TensorDictBase:
        return _drop_empty(tensordict_reset)

    def _restore(self, tensordict: TensorDictBase, names: tuple[str, ...]) -> TensorDictBase:
        parent = self.parent
        if parent is None:
            return tensordict
        extra = tensordict.batch_size[: tensordict.batch_dims - len(parent.batch_size)]
        for name in names:
            spec = parent.input_spec[name]
            for key in _empty_composite_keys(spec):
                if tensordict.get(key, None) is None:
                    shape = (*extra, *spec[key].shape)
                    tensordict.set(key, TensorDict({}, batch_size=shape, device=tensordict.device))
        return tensordict

    def _inv_call(self, tensordict: TensorDictBase) -> TensorDictBase:
        return self._restore(tensordict, ("full_action_spec", "full_state_spec"))

    def _reset_env_preprocess(self, tensordict: TensorDictBase) -> TensorDictBase:
        return self._restore(tensordict, ("full_state_spec",))

    @staticmethod
    def _prune(spec: Composite) -> Composite:
        for key in sorted(_empty_composite_keys(spec), key=len, reverse=True):
            del spec[key]
        return spec

    def transform_output_spec(self, output_spec: Composite) -> Composite:
        for name in ("full_observation_spec", "full_reward_spec", "full_done_spec"):
            output_spec[name] = self._prune(output_spec[name])
        return output_spec

    def transform_input_spec(self, input_spec: Composite) -> Composite:
        for name in ("full_action_spec", "full_state_spec"):
            input_spec[name] = self._prune(input_spec[name])
        return input_spec
