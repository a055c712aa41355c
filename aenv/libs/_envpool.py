"""EnvPool (C++ envs stepped by a thread pool) as an aenv env: the seeds' ``MultiThreadedEnv``
and ``MultiThreadedEnvWrapper``. EnvPool is an optional dependency (``pip install envpool``)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from aenv.envs._common import EnvBase
from aenv.libs._flags import require
from aenv.specs import Categorical, Composite, OneHot, from_gym_space

__all__ = ["MultiThreadedEnv", "MultiThreadedEnvWrapper"]


def _envpool() -> Any:
    return require(
        "envpool", "MultiThreadedEnv needs EnvPool: pip install envpool (or aenv[envpool])"
    )


class MultiThreadedEnvWrapper(EnvBase):
    """An EnvPool env (built with ``env_type="gymnasium"``) as one aenv env of batch size
    ``(num_envs,)``.

    EnvPool steps its C++ envs on its own threads; this wrapper hands it whole batches.
    Partial resets (``"_reset"``) reset only the flagged envs and partial steps (``"_step"``)
    step only the flagged ones, through EnvPool's ``env_id`` arguments, so EnvPool's own
    auto-reset never triggers in aenv's rollouts (done envs are reset explicitly).

    Args:
        env: the EnvPool env.
        categorical_action_encoding: Discrete actions as indices (``Categorical``) rather
            than one-hot.
        device: device of the output tensors.

    Example:
        >>> import envpool
        >>> env = MultiThreadedEnvWrapper(envpool.make("CartPole-v1", env_type="gymnasium", num_envs=4))
        >>> (await env.rollout(10, break_when_any_done=False)).batch_size
        torch.Size([4, 10])
    """

    def __init__(
        self,
        env: Any = None,
        *,
        categorical_action_encoding: bool = False,
        device: Any = None,
    ) -> None:
        if env is None:
            raise TypeError("MultiThreadedEnvWrapper needs an EnvPool env")
        config = getattr(env, "config", None)
        if not isinstance(config, dict) or "num_envs" not in config:
            raise TypeError(f"expected an EnvPool env, got {type(env).__name__}")
        num_envs = int(config["num_envs"])
        super().__init__(device=device, batch_size=(num_envs,))
        self._env = env
        self.num_workers = num_envs
        self.categorical_action_encoding = categorical_action_encoding
        bs = self.batch_size
        obs = from_gym_space(
            env.observation_space,
            device=device,
            categorical_action_encoding=categorical_action_encoding,
            batch_size=bs,
        )
        self.observation_spec = (
            obs if isinstance(obs, Composite) else Composite(observation=obs, shape=bs)
        )
        self.action_spec = from_gym_space(
            env.action_space,
            device=device,
            categorical_action_encoding=categorical_action_encoding,
            batch_size=bs,
        )
        flag = Categorical(2, shape=(*bs, 1), dtype=torch.bool, device=device)
        self.full_done_spec = Composite(
            done=flag, terminated=flag.clone(), truncated=flag.clone(), shape=bs
        )
        self._ids = np.arange(num_envs)

    def __getattr__(self, name: str) -> Any:
        # public names fall through to the EnvPool env (its config, spec, ...)
        env = self.__dict__.get("_env")
        if env is None or name.startswith("_"):
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return getattr(env, name)

    # ------------------------------------------------------------------ conversions
    def _obs(self, obs: Any, ids: np.ndarray) -> TensorDict:
        out = TensorDict({}, batch_size=self.batch_size, device=self.device)
        spec = self.observation_spec
        values = obs if isinstance(obs, dict) else {"observation": obs}
        for key, value in values.items():
            leaf = spec[key]
            full = leaf.zero()
            full[torch.as_tensor(ids)] = torch.as_tensor(np.asarray(value)).to(full.dtype)
            out.set(key, full)
        return out

    def _action(self, td: TensorDictBase, ids: np.ndarray) -> np.ndarray:
        action = td.get("action")[torch.as_tensor(ids)]
        if isinstance(self.action_spec, OneHot):
            action = action.to(torch.int64).argmax(-1)
        return action.detach().cpu().numpy()

    def _flag(self, value: Any, ids: np.ndarray) -> torch.Tensor:
        full = torch.zeros((*self.batch_size, 1), dtype=torch.bool, device=self.device)
        full[torch.as_tensor(ids), 0] = torch.as_tensor(np.asarray(value), dtype=torch.bool)
        return full

    # ------------------------------------------------------------------ env API
    def _set_seed(self, seed: int | None) -> None:
        if seed is not None:
            raise RuntimeError(
                "an EnvPool env is seeded when it is made; MultiThreadedEnv(..., seed=) or "
                "MultiThreadedEnv.set_seed rebuilds it with a new seed"
            )

    def _reset(self, tensordict: TensorDictBase | None, **kwargs: Any) -> TensorDictBase:
        ids = self._ids
        mask = tensordict.get("_reset", None) if tensordict is not None else None
        if mask is not None:
            ids = self._ids[mask.reshape(-1).cpu().numpy().astype(bool)]
        obs, _ = self._env.reset(ids)
        out = self._obs(obs, ids)
        zeros = torch.zeros((*self.batch_size, 1), dtype=torch.bool, device=self.device)
        out.update({"done": zeros, "terminated": zeros.clone(), "truncated": zeros.clone()})
        return out

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        ids = self._ids
        stepping = tensordict.get("_step", None)
        if stepping is not None:
            ids = self._ids[stepping.reshape(-1).cpu().numpy().astype(bool)]
        obs, reward, terminated, truncated, _ = self._env.step(self._action(tensordict, ids), ids)
        out = self._obs(obs, ids)
        rew = torch.zeros((*self.batch_size, 1), dtype=torch.float32, device=self.device)
        rew[torch.as_tensor(ids), 0] = torch.as_tensor(np.asarray(reward), dtype=torch.float32)
        term, trunc = self._flag(terminated, ids), self._flag(truncated, ids)
        out.update({"reward": rew, "terminated": term, "truncated": trunc, "done": term | trunc})
        return out

    async def _aclose(self) -> None:
        close = getattr(self._env, "close", None)
        if callable(close):
            close()

    def __repr__(self) -> str:
        name = self._env.config.get("task_id", type(self._env).__name__)
        return f"{type(self).__name__}({name!r}, num_envs={self.num_workers})"


class MultiThreadedEnv(MultiThreadedEnvWrapper):
    """``num_workers`` EnvPool envs of one task, built by id (the seeds' ``MultiThreadedEnv``).

    Args:
        num_workers: number of envs (the batch size).
        env_name: an EnvPool task id, e.g. ``"CartPole-v1"`` or ``"Pong-v5"``.
        create_env_kwargs: passed to ``envpool.make``.
        seed: EnvPool's seed (``set_seed`` rebuilds the envs with another one).
        categorical_action_encoding, device: see :class:`MultiThreadedEnvWrapper`.

    Example:
        >>> env = MultiThreadedEnv(8, "CartPole-v1")
        >>> (await env.rollout(100, break_when_any_done=False))["next", "reward"].shape
        torch.Size([8, 100, 1])
    """

    def __init__(
        self,
        num_workers: int,
        env_name: str,
        create_env_kwargs: dict[str, Any] | None = None,
        *,
        seed: int = 0,
        categorical_action_encoding: bool = False,
        device: Any = None,
    ) -> None:
        self.env_name = env_name
        self.create_env_kwargs = dict(create_env_kwargs or {})
        super().__init__(
            self._make(num_workers, seed),
            categorical_action_encoding=categorical_action_encoding,
            device=device,
        )

    def _make(self, num_workers: int, seed: int) -> Any:
        envpool = _envpool()
        return envpool.make(
            self.env_name,
            env_type="gymnasium",
            num_envs=num_workers,
            seed=seed,
            **self.create_env_kwargs,
        )

    def _set_seed(self, seed: int | None) -> None:
        if seed is None:
            return
        old = self._env
        self._env = self._make(self.num_workers, int(seed))
        close = getattr(old, "close", None)
        if callable(close):
            close()
