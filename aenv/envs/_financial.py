"""FinancialRegimeEnv: a stateless trading env over a regime-switching price process."""

from __future__ import annotations

import math
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase

from aenv.envs._common import EnvBase
from aenv.specs import Binary, Categorical, Composite, Unbounded

__all__ = ["FinancialRegimeEnv"]

_DT = 1.0 / 252.0  # one trading day

_PARAMS = {
    "initial_price": 100.0,
    "volatility": 0.2,
    "drift": 0.05,
    "bear_drift": -0.05,
    "switch_prob": 0.02,
    "transaction_cost": 0.001,
    "max_steps": 252.0,
}


class FinancialRegimeEnv(EnvBase):
    """Trade one asset (hold, buy, sell) whose price follows a regime-switching geometric
    Brownian motion (the seeds' ``FinancialRegimeEnv``, with TorchRL's keys and rewards).

    The env keeps no state: the observation ``"price_history"`` (the last ``window_size``
    prices), ``"current_holdings"`` (bool), ``"entry_price"``, ``"step_count"``, the hidden
    ``"regime"`` (0 bull: drift ``drift``; 1 bear: drift ``bear_drift``; it switches with
    probability ``switch_prob`` per step) and ``"params"`` travel in the tensordict, so one env
    serves any batch (``batch_locked = False``). Actions: 0 hold, 1 buy (when flat), 2 sell
    (when holding); a buy pays ``transaction_cost * price``, a sell earns the trade's return
    ``(price - entry) / entry`` minus the cost, and holding earns a tenth of the step's price
    return. Episodes are truncated after ``max_steps`` steps.

    Args:
        td_params: parameters from :meth:`gen_params` (default ones otherwise).
        seed: seed of the env's generator.
        window_size: length of the price history (default 50).
        device: device of the tensors.

    Example:
        >>> env = FinancialRegimeEnv(seed=0)
        >>> td = await env.reset(TensorDict({}, batch_size=[4]))
        >>> (await env.rollout(10, tensordict=td, auto_reset=False))["next", "reward"].shape
        torch.Size([4, 10, 1])
    """

    _batch_locked = False

    def __init__(
        self,
        td_params: TensorDictBase | None = None,
        seed: int | None = None,
        window_size: int = 50,
        device: Any = None,
    ) -> None:
        super().__init__(device=device)
        if window_size < 2:
            raise ValueError(f"window_size must be >= 2, got {window_size}")
        self.window_size = window_size
        if td_params is None:
            td_params = self.gen_params()
        self.td_params = td_params if self.device is None else td_params.to(self.device)
        params = Composite({k: Unbounded((), dtype=torch.float32) for k in _PARAMS})
        self.observation_spec = Composite(
            price_history=Unbounded((window_size,), dtype=torch.float32),
            current_holdings=Binary(1, shape=(1,), dtype=torch.bool),
            entry_price=Unbounded((1,), dtype=torch.float32),
            step_count=Unbounded((), dtype=torch.int64),
            regime=Categorical(2, shape=(), dtype=torch.int64),
            params=params,
        )
        self.state_spec = self.observation_spec.clone()
        self.action_spec = Categorical(3, shape=(1,), dtype=torch.int64)
        self.reward_spec = Unbounded((1,))
        flag = Categorical(2, shape=(1,), dtype=torch.bool)
        self.full_done_spec = Composite(done=flag, terminated=flag.clone(), truncated=flag.clone())
        self.rng = torch.Generator(device=device)
        self.rng.manual_seed(seed if seed is not None else 0)

    @staticmethod
    def gen_params(batch_size: tuple[int, ...] = (), **overrides: float) -> TensorDictBase:
        """The process's parameters (any of ``initial_price``, ``volatility``, ``drift``,
        ``bear_drift``, ``switch_prob``, ``transaction_cost``, ``max_steps`` overridden),
        under ``"params"``, expanded to ``batch_size``."""
        unknown = set(overrides) - set(_PARAMS)
        if unknown:
            raise ValueError(f"unknown FinancialRegimeEnv parameters {sorted(unknown)}")
        values = {**_PARAMS, **overrides}
        params = TensorDict({k: torch.tensor(float(v)) for k, v in values.items()}, [])
        td = TensorDict({"params": params}, [])
        return td.expand(*batch_size).contiguous() if batch_size else td

    def _set_seed(self, seed: int | None) -> None:
        self.rng.manual_seed(seed if seed is not None else torch.seed() % (2**31))

    def _noise(self, shape: torch.Size | tuple[int, ...]) -> torch.Tensor:
        return torch.randn(shape, generator=self.rng, device=self.device)

    def _reset(self, tensordict: TensorDictBase | None, **kwargs: Any) -> TensorDictBase:
        batch = tensordict.batch_size if tensordict is not None else torch.Size()
        params = tensordict.get("params", None) if tensordict is not None else None
        if params is None:
            params = self.td_params["params"].expand(*batch).clone()
        vol = params["volatility"].unsqueeze(-1)
        steps = self._noise((*batch, self.window_size)) * vol * math.sqrt(_DT)
        prices = params["initial_price"].unsqueeze(-1) * torch.exp(steps.cumsum(-1))
        dev = self.device
        return TensorDict(
            {
                "price_history": prices.to(torch.float32),
                "current_holdings": torch.zeros((*batch, 1), dtype=torch.bool, device=dev),
                "entry_price": torch.zeros((*batch, 1), device=dev),
                "step_count": torch.zeros(batch, dtype=torch.int64, device=dev),
                "regime": torch.zeros(batch, dtype=torch.int64, device=dev),
                "params": params,
            },
            batch_size=batch,
            device=dev,
        )

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        params = tensordict["params"]
        history = tensordict["price_history"]
        holding = tensordict["current_holdings"].squeeze(-1)
        entry = tensordict["entry_price"].squeeze(-1)
        action = tensordict["action"].squeeze(-1)
        regime = tensordict["regime"]
        batch = tensordict.batch_size
        switch = torch.rand(batch, generator=self.rng, device=self.device) < params["switch_prob"]
        regime = torch.where(switch, 1 - regime, regime)
        drift = torch.where(regime == 0, params["drift"], params["bear_drift"])
        price = history[..., -1]
        shock = self._noise(batch) * params["volatility"] * math.sqrt(_DT)
        next_price = price * torch.exp(drift * _DT + shock)
        cost = params["transaction_cost"] * price
        buy = (action == 1) & ~holding
        sell = (action == 2) & holding
        trade = (price - entry) / entry.clamp_min(1e-6)
        reward = torch.where(buy, -cost, torch.zeros_like(price))
        reward = torch.where(sell, trade - cost, reward)
        new_holding = (holding | buy) & ~sell
        reward = reward + torch.where(new_holding, 0.1 * (next_price - price) / price, 0.0)
        new_entry = torch.where(buy, price, torch.where(sell, torch.zeros_like(entry), entry))
        steps = tensordict["step_count"] + 1
        truncated = (steps >= params["max_steps"]).unsqueeze(-1)
        return TensorDict(
            {
                "price_history": torch.cat([history[..., 1:], next_price.unsqueeze(-1)], -1),
                "current_holdings": new_holding.unsqueeze(-1),
                "entry_price": new_entry.unsqueeze(-1),
                "step_count": steps,
                "regime": regime,
                "params": params,
                "reward": reward.unsqueeze(-1).to(torch.float32),
                "done": truncated,
                "terminated": torch.zeros_like(truncated),
                "truncated": truncated.clone(),
            },
            batch_size=batch,
            device=self.device,
        )
