"""Gymnasium vector envs' autoreset modes mapped onto aenv's done / ``"_reset"`` semantics.

aenv's contract: a step's ``"next"`` holds the last observation of a finished episode along
with its done flags; the episode's successor starts only at ``reset`` (``"_reset"`` masks
select sub-envs). Gymnasium 1.x vector envs do it three ways:

* ``NEXT_STEP``: the step after a done resets that sub-env instead of stepping it. aenv's
  partial reset calls ``reset(options={"reset_mask": m})``, which resets it and clears the
  pending autoreset, so no reset observation is ever returned by a step.
* ``SAME_STEP``: the done step already returns the next episode's first observation, and the
  last one sits in ``info["final_obs"]``. The step's output gets ``final_obs`` back in place;
  the first observation is kept and handed out by the partial reset that follows.
* ``DISABLED``: sub-envs stay done until reset with ``reset_mask``. A done sub-env that a
  partial step leaves out is reset first (its output is masked anyway), since gymnasium
  refuses to step it.

In every mode, stepping a sub-env that finished and was not reset raises
:class:`~aenv.exceptions.ResetNeededError` instead of passing a reset off as a transition.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from tensordict import TensorDictBase

from aenv.exceptions import ResetNeededError

__all__ = ["VectorAutoreset", "autoreset_mode_of", "normalize_autoreset_mode"]

NEXT_STEP, SAME_STEP, DISABLED = "next_step", "same_step", "disabled"


def normalize_autoreset_mode(mode: Any) -> str:
    """``"next_step"``, ``"same_step"`` or ``"disabled"`` for a mode given as gymnasium's
    enum or a string in either spelling (``"NextStep"``, ``"next_step"``)."""
    value = str(getattr(mode, "value", mode)).replace("_", "").lower()
    names = {"nextstep": NEXT_STEP, "samestep": SAME_STEP, "disabled": DISABLED}
    if value not in names:
        raise ValueError(
            f"unknown gymnasium autoreset mode {mode!r}; expected one of {list(names.values())}"
        )
    return names[value]


def autoreset_mode_of(venv: Any) -> str:
    """The autoreset mode of a gymnasium vector env (see :func:`normalize_autoreset_mode`)."""
    mode = getattr(venv, "autoreset_mode", None)
    if mode is None:
        mode = getattr(venv, "metadata", {}).get("autoreset_mode", NEXT_STEP)
    return normalize_autoreset_mode(mode)


def _take(batch: Any, index: int, value: Any) -> None:
    """Write one sub-env's ``value`` at ``index`` of a batched observation (in place)."""
    if isinstance(batch, dict):
        for key in batch:
            _take(batch[key], index, value[key])
    elif isinstance(batch, tuple):
        for b, v in zip(batch, value):
            _take(b, index, v)
    else:
        batch[index] = value


def _index(batch: Any, index: int) -> Any:
    if isinstance(batch, dict):
        return {k: _index(v, index) for k, v in batch.items()}
    if isinstance(batch, tuple):
        return tuple(_index(v, index) for v in batch)
    return batch[index]


def _copy(batch: Any) -> Any:
    if isinstance(batch, dict):
        return {k: _copy(v) for k, v in batch.items()}
    if isinstance(batch, tuple):
        return tuple(_copy(v) for v in batch)
    return np.array(batch, copy=True)


class VectorAutoreset:
    """Per-sub-env autoreset bookkeeping of a wrapped gymnasium vector env."""

    def __init__(self, venv: Any, num_envs: int) -> None:
        self.venv = venv
        self.num_envs = num_envs
        self.mode = autoreset_mode_of(venv)
        self.copy_outputs = not getattr(venv, "copy", True)
        self.finished = np.zeros(num_envs, dtype=np.bool_)
        self.pending = np.zeros(num_envs, dtype=np.bool_)  # SAME_STEP: already reset by gym
        self.last_raw: tuple[Any, Any] | None = None  # obs / info holding pending starts
        self.gym_flag = np.zeros(num_envs, dtype=np.bool_)  # NEXT_STEP: gym resets it next
        self.skipped = np.zeros(num_envs, dtype=np.bool_)

    def before_step(self, tensordict: TensorDictBase) -> None:
        """Check that no stepped sub-env needs a reset; in DISABLED mode reset skipped ones."""
        step_mask = tensordict.get("_step", None)
        stepping = (
            np.ones(self.num_envs, dtype=np.bool_)
            if step_mask is None
            else step_mask.reshape(self.num_envs).cpu().numpy().astype(np.bool_)
        )
        stale = self.finished & stepping
        if stale.any():
            raise ResetNeededError(
                f"sub-envs {np.flatnonzero(stale).tolist()} finished their episode and were "
                "not reset; call reset with a '_reset' mask (or step_and_maybe_reset) first"
            )
        self.skipped = ~stepping
        if step_mask is not None and not stepping.all():
            skipped_live = ~stepping & ~self.finished
            if skipped_live.any():
                raise ValueError(
                    "a gymnasium vector env steps all its sub-envs at once: a '_step' mask may "
                    f"only leave out finished sub-envs, not {np.flatnonzero(skipped_live).tolist()}"
                )
        if self.mode == DISABLED and self.finished.any():
            # gymnasium refuses to step done sub-envs: start them anew (their output is masked;
            # they stay finished for aenv until its own reset)
            self.venv.reset(options={"reset_mask": self.finished.copy()})

    def after_step(self, obs: Any, terminated: Any, truncated: Any, info: dict[str, Any]) -> Any:
        """Record which sub-envs finished; in SAME_STEP mode put the last observations back."""
        done = np.logical_or(terminated, truncated).reshape(self.num_envs)
        if self.copy_outputs:
            obs = _copy(obs)
        skipped = self.skipped
        if skipped.any():
            # a pending start that gym stepped on is stale: aenv's reset must really reset it
            self.pending &= ~skipped
            if self.mode == NEXT_STEP:
                # skipped finished sub-envs with a pending autoreset were reset by this step:
                # keep their first observation for aenv's reset
                started = skipped & self.gym_flag
                if started.any():
                    self.last_raw = (_copy(obs), info)
                    self.pending |= started
        self.gym_flag = done.copy()
        if self.mode == SAME_STEP and done.any():
            self.last_raw = (_copy(obs), info)
            final = info.get("final_obs")
            if final is None:
                raise RuntimeError(
                    "a SAME_STEP vector env gave no info['final_obs'] on a done step"
                )
            obs = _copy(obs)
            for i in np.flatnonzero(done):
                _take(obs, int(i), final[i])
            self.pending |= done
        self.finished |= done
        return obs

    def reset(
        self, mask: np.ndarray | None, seed: Any = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        """Reset every sub-env (``mask`` None) or those in ``mask``; returns ``(obs, info)``."""
        venv = self.venv
        if mask is None or (mask.all() and not self.pending.any()):
            obs, info = venv.reset(seed=seed, options=options)
            self.finished[:] = False
            self.pending[:] = False
            self.gym_flag[:] = False
            self.last_raw = None
            return (_copy(obs) if self.copy_outputs else obs), info
        fresh = mask & ~self.pending
        from_stash = mask & self.pending
        if fresh.any():
            opts = dict(options or {})
            opts["reset_mask"] = fresh.copy()
            obs, info = venv.reset(options=opts)
            self.gym_flag &= ~fresh
            obs = _copy(obs)
        else:
            assert self.last_raw is not None
            obs, info = self.last_raw
        if from_stash.any() and fresh.any() and self.last_raw is not None:
            stash = self.last_raw[0]
            for i in np.flatnonzero(from_stash):
                _take(obs, int(i), _index(stash, int(i)))
        self.pending &= ~mask
        self.finished &= ~mask
        if not self.pending.any():
            self.last_raw = None
        return obs, info
