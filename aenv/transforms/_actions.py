"""Action-side transforms from the seeds: DiscreteActionProjection and gSDENoise."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from tensordict import TensorDictBase

from aenv._mdp import NestedKey
from aenv.specs import Categorical, OneHot, TensorSpec, Unbounded
from aenv.transforms._base import Transform
from aenv.transforms._primer import TensorDictPrimer

__all__ = ["DiscreteActionProjection", "gSDENoise"]


class DiscreteActionProjection(Transform):
    """Exposes a discrete action space of ``max_actions`` over an env that has
    ``num_actions_effective`` actions (one policy for envs with different action counts).

    The outer action spec has ``max_actions`` actions; an action beyond the env's range is
    replaced by a uniformly drawn valid one before the env steps. One-hot (``OneHot``) and
    index (``Categorical``) actions are both handled. With ``include_forward`` the action in
    the step's output is mapped back to the outer space.

    Args:
        num_actions_effective: the env's number of actions.
        max_actions: the number of actions the outside sees.
        action_key: the action entry.
        include_forward: map the action back in the output.

    Example:
        >>> env = TransformedEnv(GymEnv("CartPole-v1"), DiscreteActionProjection(2, 7))
        >>> env.action_spec.n
        7
    """

    def __init__(
        self,
        num_actions_effective: int,
        max_actions: int,
        action_key: NestedKey = "action",
        include_forward: bool = True,
    ) -> None:
        if not 0 < num_actions_effective <= max_actions:
            raise ValueError(
                f"need 0 < num_actions_effective ({num_actions_effective}) <= max_actions "
                f"({max_actions})"
            )
        super().__init__(
            in_keys=[action_key] if include_forward else [],
            in_keys_inv=[action_key],
        )
        self.num_actions_effective = num_actions_effective
        self.max_actions = max_actions
        self.include_forward = include_forward
        self._one_hot = True

    def _inv_transform_spec(self, spec: TensorSpec) -> TensorSpec:
        if isinstance(spec, OneHot):
            self._one_hot = True
            if spec.n != self.num_actions_effective:
                raise ValueError(
                    f"DiscreteActionProjection: the env has {spec.n} actions, "
                    f"num_actions_effective is {self.num_actions_effective}"
                )
            shape = (*spec.shape[:-1], self.max_actions)
            return OneHot(self.max_actions, shape=shape, dtype=spec.dtype, device=spec.device)
        if isinstance(spec, Categorical):
            self._one_hot = False
            if spec.n != self.num_actions_effective:
                raise ValueError(
                    f"DiscreteActionProjection: the env has {spec.n} actions, "
                    f"num_actions_effective is {self.num_actions_effective}"
                )
            return Categorical(
                self.max_actions, shape=spec.shape, dtype=spec.dtype, device=spec.device
            )
        raise TypeError(
            f"DiscreteActionProjection needs a OneHot or Categorical action, got {type(spec).__name__}"
        )

    def _inv_apply_transform(self, action: torch.Tensor) -> torch.Tensor:
        n = self.num_actions_effective
        if self._one_hot:
            if action.shape[-1] != self.max_actions:
                raise ValueError(
                    f"DiscreteActionProjection: one-hot action of size {action.shape[-1]}, "
                    f"expected {self.max_actions}"
                )
            index = action.to(torch.int64).argmax(-1)
        else:
            index = action.to(torch.int64)
        out_of_range = index >= n
        if bool(out_of_range.any()):
            index = torch.where(out_of_range, torch.randint_like(index, n), index)
        if self._one_hot:
            return torch.nn.functional.one_hot(index, n).to(action.dtype)
        return index.to(action.dtype)

    def _apply_transform(self, action: torch.Tensor) -> torch.Tensor:
        if not self._one_hot:
            return action
        pad = self.max_actions - action.shape[-1]
        return torch.nn.functional.pad(action, (0, pad)) if pad > 0 else action

    def _call(self, next_tensordict: TensorDictBase) -> TensorDictBase:
        # the action is in the step input, not in "next": nothing to map there
        return next_tensordict

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        """Map the (inner) actions of ``tensordict`` to the outer space, in place."""
        for key in self.in_keys:
            value = tensordict.get(key, None)
            if value is not None:
                tensordict.set(key, self._apply_transform(value))
        return tensordict


class gSDENoise(TensorDictPrimer):
    """Primes the exploration noise of generalized state-dependent exploration (gSDE).

    On every reset a standard normal matrix ``"_eps_gSDE"`` of shape
    ``(*batch, *shape, action_dim, state_dim)`` is drawn for the reset elements; steps
    carry it along unchanged, so a gSDE policy explores with the same noise for a whole
    episode. Without ``action_dim`` / ``state_dim`` a scalar noise per element is primed.

    Args:
        state_dim: size of the policy's state features.
        action_dim: size of the action.
        shape: extra leading dims of the noise.

    Example:
        >>> env = TransformedEnv(PendulumEnv(), gSDENoise(state_dim=3, action_dim=1))
        >>> (await env.reset())["_eps_gSDE"].shape
        torch.Size([1, 3])
    """

    def __init__(
        self,
        state_dim: int | None = None,
        action_dim: int | None = None,
        shape: Sequence[int] | None = None,
    ) -> None:
        tail = (action_dim, state_dim) if action_dim is not None and state_dim is not None else (1,)
        if (action_dim is None) != (state_dim is None):
            raise ValueError("gSDENoise needs both state_dim and action_dim, or neither")
        super().__init__({"_eps_gSDE": Unbounded((*(shape or ()), *tail))})

    def _initial(self, key: NestedKey, spec: TensorSpec, extra: torch.Size) -> torch.Tensor:
        zero = spec.zero(extra)
        return torch.randn(zero.shape, dtype=zero.dtype, device=zero.device)
