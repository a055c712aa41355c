"""Model-based envs: a learned world model stepped as an env (ModelBasedEnvBase), and the
Dreamer imagination env built on it (DreamerEnv; its decoder transform is
:class:`aenv.transforms.DreamerDecoder`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase

from aenv.envs._common import EnvBase
from aenv.specs import Composite, TensorSpec, Unbounded

__all__ = ["DreamerEnv", "ModelBasedEnvBase"]


class ModelBasedEnvBase(EnvBase):
    """An env whose dynamics are a model: each step runs ``world_model`` (a TensorDict module,
    e.g. a ``TensorDictModule`` or ``TensorDictSequential``) on the step input.

    The world model reads the current state and the action from the input and writes the
    next step's entries under the observation, reward and done keys of the specs (at the
    root: the next state replaces the current one in what it returns); the step output is
    those entries (missing done flags are completed as for any env). Steps are not wrapped in
    ``no_grad``: rollouts through a differentiable model carry gradients (imagination
    rollouts for policy learning). The env is batch-unlocked: reset it with a tensordict of
    the batch you want to imagine.

    Subclasses set the specs and implement ``_reset`` (the start states, e.g. drawn from
    the specs or taken from the input).

    Args:
        world_model: the module stepping the state.
        device: device of the model's tensors.
        batch_size: the env's own batch dims (usually none).
        run_type_checks: check outputs against the specs.

    Example:
        >>> class LinearWorld(ModelBasedEnvBase):
        ...     def __init__(self, model):
        ...         super().__init__(model)
        ...         self.observation_spec = Composite(obs=Unbounded((4,)))
        ...         self.action_spec = Unbounded((1,))
        ...         self.reward_spec = Unbounded((1,))
        ...     def _reset(self, td):
        ...         return TensorDict(obs=torch.zeros(*td.batch_size, 4), batch_size=td.batch_size)
        >>> env = LinearWorld(model)
        >>> r = await env.rollout(10, tensordict=await env.reset(TensorDict({}, [32])), auto_reset=False)
    """

    _batch_locked = False

    def __init__(
        self,
        world_model: Callable[[TensorDictBase], Any],
        *,
        device: Any = None,
        batch_size: Sequence[int] | None = None,
        run_type_checks: bool = False,
        allow_done_after_reset: bool = False,
    ) -> None:
        super().__init__(
            device=device,
            batch_size=torch.Size(batch_size) if batch_size is not None else None,
            run_type_checks=run_type_checks,
            allow_done_after_reset=allow_done_after_reset,
        )
        if not callable(world_model):
            raise TypeError("ModelBasedEnvBase needs a callable world model")
        self.world_model = world_model

    def _set_seed(self, seed: int | None) -> None:
        if seed is not None:
            torch.manual_seed(seed)

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        out = self.world_model(tensordict.copy())
        if not isinstance(out, TensorDictBase):
            raise TypeError(f"the world model must return a TensorDict, got {type(out).__name__}")
        keys = [
            *self.observation_spec.keys(True, True),
            *self.full_reward_spec.keys(True, True),
            *self.full_done_spec.keys(True, True),
        ]
        missing = [k for k in self.observation_spec.keys(True, True) if k not in out.keys(True)]
        if missing:
            raise KeyError(
                f"the world model wrote no {missing} (observation keys of the specs); it wrote "
                f"{sorted(map(str, out.keys(True, True)))}"
            )
        return out.select(*keys, strict=False)


class DreamerEnv(ModelBasedEnvBase):
    """Dreamer's imagination env: the latent ``"state"`` (stochastic) and ``"belief"``
    (deterministic, recurrent) are stepped by the world model (the RSSM prior and a reward
    model: it reads ``"state"``, ``"belief"`` and ``"action"`` and writes the next
    ``"state"``, ``"belief"`` and ``"reward"``).

    A reset starts from zeros, or from the ``"state"`` / ``"belief"`` of the input (e.g.
    posterior states of real data, to imagine from them). ``obs_decoder`` (optional) is kept
    for :class:`~aenv.transforms.DreamerDecoder`, which decodes the latents into observations.

    Args:
        world_model: the latent transition and reward module.
        prior_shape: shape of ``"state"``.
        belief_shape: shape of ``"belief"``.
        action_spec: the action spec (default: unbounded, shape ``(1,)``).
        obs_decoder: a module from latents to observations.

    Example:
        >>> env = DreamerEnv(world_model, prior_shape=(30,), belief_shape=(200,),
        ...                  action_spec=Bounded(-1, 1, (6,)))
        >>> start = TensorDict({"state": post_state, "belief": post_belief}, [B])
        >>> imagined = await env.rollout(15, policy, tensordict=await env.reset(start),
        ...                              auto_reset=False)
    """

    def __init__(
        self,
        world_model: Callable[[TensorDictBase], Any],
        prior_shape: Sequence[int],
        belief_shape: Sequence[int],
        action_spec: TensorSpec | None = None,
        obs_decoder: Callable[..., Any] | None = None,
        device: Any = None,
    ) -> None:
        super().__init__(world_model, device=device)
        self.prior_shape = torch.Size(prior_shape)
        self.belief_shape = torch.Size(belief_shape)
        self.observation_spec = Composite(
            state=Unbounded(self.prior_shape), belief=Unbounded(self.belief_shape)
        )
        self.state_spec = self.observation_spec.clone()
        self.action_spec = action_spec if action_spec is not None else Unbounded((1,))
        self.reward_spec = Unbounded((1,))
        self.obs_decoder = obs_decoder

    def _reset(self, tensordict: TensorDictBase | None, **kwargs: Any) -> TensorDictBase:
        batch = tensordict.batch_size if tensordict is not None else torch.Size()
        out = TensorDict({}, batch_size=batch, device=self.device)
        for key, shape in (("state", self.prior_shape), ("belief", self.belief_shape)):
            given = tensordict.get(key, None) if tensordict is not None else None
            out.set(key, given if given is not None else torch.zeros(*batch, *shape))
        return out
