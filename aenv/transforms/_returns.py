"""Reward-side transforms from the seeds: TargetReturn and KLRewardTransform."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

import torch
from tensordict import TensorDictBase

from aenv._mdp import NestedKey
from aenv.specs import Composite, TensorSpec, Unbounded
from aenv.transforms._base import Transform
from aenv.transforms._counters import PerRewardState

__all__ = ["KLRewardTransform", "TargetReturn"]


class TargetReturn(PerRewardState):
    """A return-to-go target for return-conditioned policies (Decision Transformer).

    On reset ``out_key`` is set to ``target_return``; after each step it becomes the
    previous target minus the step's reward (``mode="reduce"``) or stays as it was
    (``mode="constant"``). The target is an observation and travels in the input (state),
    so it works on pools and with partial resets (only reset elements are re-targeted).

    Args:
        target_return: the initial target.
        mode: ``"reduce"`` or ``"constant"``.
        in_keys: the reward read (default ``["reward"]``).
        out_keys: the target written (default ``["target_return"]``).

    Example:
        >>> env = TransformedEnv(CountingEnv(max_steps=3), TargetReturn(10.0))
        >>> (await env.rollout(3))["next", "target_return"].squeeze(-1)
        tensor([9., 8., 7.])
    """

    def __init__(
        self,
        target_return: float,
        mode: str = "reduce",
        in_keys: Sequence[NestedKey] | NestedKey | None = None,
        out_keys: Sequence[NestedKey] | NestedKey | None = None,
    ) -> None:
        if mode not in ("reduce", "constant"):
            raise ValueError(f"TargetReturn mode must be 'reduce' or 'constant', got {mode!r}")
        super().__init__(
            in_keys=in_keys if in_keys is not None else ["reward"],
            out_keys=out_keys if out_keys is not None else ["target_return"],
        )
        self.target_return = float(target_return)
        self.mode = mode
        self._specs: dict[NestedKey, TensorSpec] = {}
        self._env_ndim = 0

    def transform_output_spec(self, output_spec: Composite) -> Composite:
        return self._declare_per_reward(output_spec)

    def _reset_value(self, zero: torch.Tensor) -> torch.Tensor:
        return torch.full_like(zero, self.target_return)

    def _step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
        for in_key, out_key in zip(self.in_keys, self.out_keys):
            prev = tensordict.get(out_key, None)
            if prev is None:
                raise KeyError(
                    f"TargetReturn: the step input has no {out_key!r} (reset the env first)"
                )
            if self.mode == "reduce":
                next_tensordict.set(out_key, prev - next_tensordict.get(in_key))
            else:
                next_tensordict.set(out_key, prev.clone())
        return next_tensordict


class KLRewardTransform(Transform):
    """Penalises the reward by the KL divergence between the acting policy and a reference
    model, estimated on the action taken: ``reward - coef * (log_prob - ref_log_prob)``.

    The step input must carry the acting policy's log-probability of its action
    (``log_prob_key``, written by a probabilistic policy); the reference log-probability
    comes from ``ref_log_prob``: a callable (or TensorDict module) taking the step input
    and returning the reference model's log-probability of the same action (a tensor, or a
    tensordict holding it at ``ref_log_prob_key``); it may be ``async``. The estimate is
    also written next to the reward (``kl_key``).

    Args:
        ref_log_prob: the reference model's log-probability of the action taken.
        coef: weight of the penalty.
        in_keys: rewards to penalise (default ``["reward"]``).
        out_keys: where to write them (default: in place).
        log_prob_key: the acting policy's log-prob in the step input.
        ref_log_prob_key: where a tensordict result holds the reference log-prob.
        kl_key: the KL estimate written in ``"next"``.

    Example:
        >>> t = KLRewardTransform(ref_model, coef=0.1)  # ref_model(td) -> log-prob tensor
        >>> env = TransformedEnv(base_env, t)
    """

    def __init__(
        self,
        ref_log_prob: Callable[[TensorDictBase], Any],
        coef: float = 1.0,
        in_keys: Sequence[NestedKey] | NestedKey | None = None,
        out_keys: Sequence[NestedKey] | NestedKey | None = None,
        log_prob_key: NestedKey = "sample_log_prob",
        ref_log_prob_key: NestedKey = "ref_log_prob",
        kl_key: NestedKey = "kl",
    ) -> None:
        super().__init__(in_keys=in_keys if in_keys is not None else ["reward"], out_keys=out_keys)
        if not callable(ref_log_prob):
            raise TypeError("KLRewardTransform needs a callable reference model")
        self.ref_log_prob = ref_log_prob
        self.coef = coef
        self.log_prob_key = log_prob_key
        self.ref_log_prob_key = ref_log_prob_key
        self.kl_key = kl_key

    def transform_output_spec(self, output_spec: Composite) -> Composite:
        output_spec = super().transform_output_spec(output_spec)
        rewards = output_spec["full_reward_spec"]
        leaf = rewards[self.in_keys[0]]
        output_spec["full_observation_spec"][self.kl_key] = Unbounded(
            shape=leaf.shape, dtype=leaf.dtype, device=leaf.device
        )
        return output_spec

    def _reset(
        self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase
    ) -> TensorDictBase:
        env = self.container
        if env is not None:
            extra = tensordict_reset.batch_size[: tensordict_reset.batch_dims - len(env.batch_size)]
            tensordict_reset.set(self.kl_key, env.full_reward_spec[self.in_keys[0]].zero(extra))
        return tensordict_reset

    async def _step(
        self, tensordict: TensorDictBase, next_tensordict: TensorDictBase
    ) -> TensorDictBase:
        log_prob = tensordict.get(self.log_prob_key, None)
        if log_prob is None:
            raise KeyError(
                f"KLRewardTransform: the step input has no {self.log_prob_key!r} (the acting "
                "policy's log-probability of its action)"
            )
        ref = self.ref_log_prob(tensordict.copy())
        if inspect.isawaitable(ref):
            ref = await ref
        if isinstance(ref, TensorDictBase):
            ref = ref.get(self.ref_log_prob_key)
        if ref.shape != log_prob.shape:
            raise ValueError(
                f"KLRewardTransform: reference log-prob of shape {tuple(ref.shape)} does not "
                f"match {self.log_prob_key!r} of shape {tuple(log_prob.shape)}"
            )
        kl = (log_prob - ref).detach()
        for in_key, out_key in zip(self.in_keys, self.out_keys):
            reward = next_tensordict.get(in_key)
            next_tensordict.set(out_key, reward - self.coef * kl.reshape(reward.shape))
        reward = next_tensordict.get(self.out_keys[0])
        next_tensordict.set(self.kl_key, kl.reshape(reward.shape).to(reward.dtype))
        return next_tensordict
