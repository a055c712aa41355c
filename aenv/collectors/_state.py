"""The state a collector saves and restores: policy weights, env state and counters."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase

__all__ = ["CollectorState"]


class CollectorState:
    """Mixin of :class:`~aenv.collectors.Collector`: ``state_dict``, ``load_state_dict`` and
    ``update_policy_weights_`` over the collector's env, policy and counters."""

    env: Any
    policy: Any
    traj_counter: Any
    _frames: int
    _iter: int
    _orig_policy: Any
    _policy_weights: TensorDictBase | None

    def state_dict(self) -> OrderedDict[str, Any]:
        """The policy's and env's state, and the collector's counters."""
        out: OrderedDict[str, Any] = OrderedDict()
        env_sd = getattr(self.env, "state_dict", None)
        if callable(env_sd):
            out["env_state_dict"] = env_sd()
        policy = self.policy
        if isinstance(policy, torch.nn.Module):
            out["policy_state_dict"] = policy.state_dict()
        out["frames"] = self._frames
        out["iter"] = self._iter
        out["traj_id"] = self.traj_counter.next_id
        return out

    def load_state_dict(self, state_dict: dict[str, Any], **kwargs: Any) -> None:
        """Restore what :meth:`state_dict` returned (policy, env, counters)."""
        if "env_state_dict" in state_dict:
            self.env.load_state_dict(state_dict["env_state_dict"], **kwargs)  # type: ignore[attr-defined]
        if "policy_state_dict" in state_dict:
            if not isinstance(self.policy, torch.nn.Module):
                raise RuntimeError("the state dict holds policy weights but the policy has none")
            self.policy.load_state_dict(state_dict["policy_state_dict"], **kwargs)
        self._frames = int(state_dict.get("frames", self._frames))
        self._iter = int(state_dict.get("iter", self._iter))
        self.traj_counter.next_id = max(
            int(state_dict.get("traj_id", self.traj_counter.next_id)), self.traj_counter.next_id
        )

    def update_policy_weights_(self, policy_weights: TensorDictBase | None = None) -> None:
        """Copy weights into the policy the collector runs: ``policy_weights`` when given,
        else those of the policy passed in (when the collector runs a copy of it)."""
        target = self._policy_weights
        if target is None:
            if policy_weights is not None:
                raise RuntimeError("the collector's policy has no weights to update")
            return
        if policy_weights is None:
            orig = self._orig_policy
            if not isinstance(orig, torch.nn.Module) or orig is self.policy:
                return
            policy_weights = TensorDict.from_module(orig)
        target.data.update_(policy_weights.data)
