"""Checking a sub-env's input before it is sent: the streamed and per-env entry points.

A whole-batch ``pool.step`` checks its actions against the pool's stacked specs with
:meth:`EnvBase._check_actions`. ``async_step_send`` and ``step_one`` take one env's input
(or a few envs' along dim 0) and must refuse the same inputs, with the same errors, before
anything is sent: the sub-envs on the pool's lean path skip their own checks. The rule is
EnvBase's own, run on a spec-only stand-in of the sub-env built from the metadata the
backend reported; nothing here re-states it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tensordict import TensorDictBase

from aenv.envs._common import EnvBase
from aenv.envs._utils import EnvMetaData
from aenv.exceptions import SpecViolationError

__all__ = ["check_sub_inputs"]


class _SpecOnly(EnvBase):
    """A sub-env's specs and nothing else: what :meth:`EnvBase._check_actions` reads."""

    def __init__(self, meta: EnvMetaData) -> None:
        super().__init__(batch_size=meta.batch_size, device=meta.device)
        self.input_spec = meta.specs["input_spec"]  # type: ignore[assignment]

    def _set_seed(self, seed: int | None) -> None:  # pragma: no cover - never stepped
        raise NotImplementedError

    def _reset(self, tensordict: Any, **kwargs: Any) -> Any:  # pragma: no cover - never stepped
        raise NotImplementedError

    def _step(self, tensordict: Any) -> Any:  # pragma: no cover - never stepped
        raise NotImplementedError


def _checker(pool: Any, i: int) -> _SpecOnly:
    cache: dict[int, _SpecOnly] | None = pool.__dict__.get("_sub_checkers")
    if cache is None:
        cache = pool.__dict__["_sub_checkers"] = {}
    key = i if pool._lazy else 0  # a dense pool's sub-envs share their specs
    checker = cache.get(key)
    if checker is None:
        checker = cache[key] = _SpecOnly(pool._metas[key])
    return checker


def check_sub_inputs(
    pool: Any, op: str, indices: Sequence[int], subs: Sequence[TensorDictBase | None]
) -> None:
    """Check each env's step input as ``pool.step`` checks the batch (actions present, of
    their spec's shape, cast to its dtype where that holds them exactly, in the spec when
    the pool runs type checks). Raises :class:`~aenv.exceptions.SpecViolationError` naming
    the env, the key, the spec and what came; a refused input is not sent anywhere."""
    if op == "reset":
        return
    for i, sub in zip(indices, subs):
        if sub is None:
            continue
        checker = _checker(pool, i)
        checker.run_type_checks = pool.run_type_checks
        try:
            checker._check_actions(sub)
        except SpecViolationError as exc:
            raise SpecViolationError(f"env {i}: {exc}", key=exc.key) from None
