"""A stateless, batch-unlocked pendulum: all state travels in the tensordict."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from aenv._mdp import getter
from aenv.envs._common import EnvBase
from aenv.specs import Bounded, Categorical, Composite, Unbounded

__all__ = ["PendulumEnv"]

_TWO_PI = 2 * math.pi
_NO_BATCH = torch.Size(())

_CPU = torch.device("cpu")
_DEFAULTS = {
    "max_speed": 8.0,
    "max_torque": 2.0,
    "dt": 0.05,
    "g": 10.0,
    "m": 1.0,
    "l": 1.0,
}


def _plain_scalar(t: torch.Tensor) -> bool:
    """A one-element float32 CPU tensor outside any autograd graph."""
    return t.dtype == torch.float32 and t.numel() == 1 and t.is_cpu and not t.requires_grad


class PendulumEnv(EnvBase):
    """The classic swing-up pendulum, written as a pure function of the tensordict.

    The env keeps no state: angle ``"th"``, angular speed ``"thdot"`` and the physical
    ``"params"`` travel in the tensordict, so one env serves any batch size
    (``batch_locked = False``). Observations are ``"th"`` and ``"thdot"``; the action
    ``"action"`` is a torque in ``[-max_torque, max_torque]``; the reward is
    ``-(angle^2 + 0.1 thdot^2 + 0.001 u^2)``. It never terminates: bound rollouts with
    ``max_steps`` (or a StepCounter transform).

    Example:
        >>> env = PendulumEnv()
        >>> td = await env.reset(TensorDict({}, batch_size=[8]))
        >>> (await env.rollout(5, tensordict=td, auto_reset=False)).batch_size
        torch.Size([8, 5])
    """

    _batch_locked = False

    def __init__(
        self, td_params: TensorDictBase | None = None, seed: int | None = None, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        if td_params is None:
            td_params = self.gen_params()
        self.td_params = td_params if self.device is None else td_params.to(self.device)
        self._make_specs(self.td_params)
        self._coef_cache: tuple[Any, ...] | None = None
        self.rng = torch.Generator()
        self.rng.manual_seed(seed if seed is not None else torch.seed() % (2**31))

    @staticmethod
    def gen_params(g: float = 10.0, batch_size: tuple[int, ...] = ()) -> TensorDictBase:
        """Physical parameters as a tensordict (``g`` may be changed), expanded to ``batch_size``."""
        values = dict(_DEFAULTS, g=g)
        params = TensorDict(
            {k: torch.tensor(v) for k, v in values.items()},
            batch_size=(),
        )
        td = TensorDict({"params": params}, batch_size=())
        return td.expand(*batch_size).contiguous() if batch_size else td

    def _make_specs(self, td_params: TensorDictBase) -> None:
        max_speed = float(td_params["params", "max_speed"].max())
        max_torque = float(td_params["params", "max_torque"].max())
        params_spec = Composite(
            {k: Unbounded(shape=(), dtype=torch.float32) for k in _DEFAULTS},
        )
        self.observation_spec = Composite(
            th=Bounded(-math.pi, math.pi, shape=(), dtype=torch.float32),
            thdot=Bounded(-max_speed, max_speed, shape=(), dtype=torch.float32),
            params=params_spec,
        )
        self.state_spec = self.observation_spec.clone()
        self.action_spec = Bounded(-max_torque, max_torque, shape=(1,), dtype=torch.float32)
        self.reward_spec = Unbounded(shape=(1,))
        self.full_done_spec = Composite(
            done=Categorical(2, shape=(1,), dtype=torch.bool),
            terminated=Categorical(2, shape=(1,), dtype=torch.bool),
        )

    def _set_seed(self, seed: int | None) -> None:
        self.rng.manual_seed(seed if seed is not None else torch.seed() % (2**31))

    def _reset(self, tensordict: TensorDictBase | None, **kwargs: Any) -> TensorDictBase:
        if tensordict is None or tensordict.get("params", None) is None:
            batch = tensordict.batch_size if tensordict is not None else ()
            params = self.gen_params(batch_size=batch)["params"]
        else:
            params = tensordict["params"]
        batch = params.batch_size
        device = self.device
        # the generator is a CPU one (the same draws on every device)
        th = ((torch.rand(batch, generator=self.rng) * 2 - 1) * math.pi).to(device)
        thdot = (torch.rand(batch, generator=self.rng) * 2 - 1).to(device)
        done = torch.zeros((*batch, 1), dtype=torch.bool, device=device)
        return TensorDict(
            {"th": th, "thdot": thdot, "params": params, "done": done, "terminated": done.clone()},
            batch_size=batch,
            device=device,
        )

    def _coefficients(self, params: TensorDictBase) -> tuple[torch.Tensor, ...]:
        """``(gravity, torque, dt, max_torque, max_speed)`` of ``params``, computed once.

        The physical parameters ride along in every step's tensordict, mostly as the very
        same tensors: the derived coefficients are kept for the tensors they came from and
        recomputed when any of them is another tensor or was changed in place.
        """
        get = getter(params)
        leaves = tuple(get(k) for k in ("g", "m", "l", "dt", "max_torque", "max_speed"))
        versions = tuple(t._version for t in leaves)
        cached = self._coef_cache
        if (
            cached is not None
            and all(a is b for a, b in zip(cached[0], leaves))
            and cached[1] == versions
        ):
            return cached[2]
        g, m, length, dt, max_torque, max_speed = leaves
        coefs = (1.5 * g / length * dt, 3.0 / (m * length * length) * dt, dt, max_torque, max_speed)
        # one set of parameters (no batch): the same coefficients as Python floats
        plain = all(c.ndim == 0 and not c.requires_grad for c in coefs)
        scalars = tuple(float(c) for c in coefs) if plain else None
        self._coef_cache = (leaves, versions, coefs, scalars)
        return coefs

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        get = getter(tensordict)
        th, thdot, params = get("th"), get("thdot"), get("params")
        gravity, torque, dt, max_torque, max_speed = self._coefficients(params)
        action = get("action")
        if (
            th.ndim == 0
            and self._coef_cache[3] is not None  # type: ignore[index]
            and _plain_scalar(th)
            and _plain_scalar(thdot)
            and _plain_scalar(action)
        ):
            return self._step_one(th, thdot, action, params)
        u = action.squeeze(-1).clamp(-max_torque, max_torque)
        angle = torch.remainder(th + math.pi, 2 * math.pi).sub_(math.pi)
        cost = angle.mul_(angle)
        cost.addcmul_(thdot, thdot, value=0.1).addcmul_(u, u, value=0.001)
        new_thdot = torch.addcmul(thdot, gravity, th.sin()).addcmul_(torque, u)
        new_thdot = new_thdot.clamp_(-max_speed, max_speed)
        new_th = torch.addcmul(th, new_thdot, dt).add_(math.pi).remainder_(2 * math.pi)
        new_th = new_th.sub_(math.pi)
        batch = tensordict.batch_size
        done = torch.zeros((*batch, 1), dtype=torch.bool, device=new_th.device)
        return TensorDict._new_unsafe(
            {
                "th": new_th,
                "thdot": new_thdot,
                "params": params,
                "reward": cost.neg_().unsqueeze(-1),
                "done": done,
                "terminated": done.clone(),
            },
            batch_size=batch,
            device=None if self.device is None else new_th.device,
            nested=False,
        )

    def _step_one(
        self,
        th: torch.Tensor,
        thdot: torch.Tensor,
        action: torch.Tensor,
        params: TensorDictBase,
    ) -> TensorDictBase:
        """One unbatched step, in Python floats (a few scalar tensor ops cost far more).

        The same dynamics as the batched path; values are computed in double precision and
        stored as float32, so they may differ from it in the last bit.
        """
        gravity, torque, dt, max_torque, max_speed = self._coef_cache[3]  # type: ignore[index]
        th_f, thdot_f = th.item(), thdot.item()
        u = min(max(action.item(), -max_torque), max_torque)
        angle = (th_f + math.pi) % _TWO_PI - math.pi
        cost = angle * angle + 0.1 * thdot_f * thdot_f + 0.001 * u * u
        new_thdot = thdot_f + gravity * math.sin(th_f) + torque * u
        new_thdot = min(max(new_thdot, -max_speed), max_speed)
        new_th = (th_f + new_thdot * dt + math.pi) % _TWO_PI - math.pi
        flags = torch.from_numpy(np.zeros((2, 1), dtype=np.bool_))
        return TensorDict._new_unsafe(
            {
                "th": torch.from_numpy(np.array(new_th, dtype=np.float32)),
                "thdot": torch.from_numpy(np.array(new_thdot, dtype=np.float32)),
                "params": params,
                "reward": torch.from_numpy(np.array((-cost,), dtype=np.float32)),
                "done": flags[0],
                "terminated": flags[1],
            },
            batch_size=_NO_BATCH,
            device=None if self.device is None else _CPU,
            nested=False,
        )
