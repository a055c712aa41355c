"""AenvTorchRLEnv: an aenv env (a pool included) as a TorchRL ``EnvBase``, for TorchRL's
collectors, replay buffers and losses. Imports torchrl: load it through
:mod:`aenv.libs.torchrl`, which says how to install it when it is missing."""

from __future__ import annotations

from typing import Any

from tensordict import TensorDictBase
from torchrl.envs import EnvBase as TorchRLEnvBase

from aenv.envs._common import EnvBase
from aenv.libs._from_torchrl import TorchRLWrapper
from aenv.libs._torchrl_specs import to_torchrl_spec
from aenv.sync._runner import Runner, get_runner

__all__ = ["AenvTorchRLEnv", "to_torchrl"]


class AenvTorchRLEnv(TorchRLEnvBase):
    """An aenv env as a TorchRL env: every TorchRL call is one awaited call of the aenv env
    on aenv's loop runner.

    Specs are the aenv env's, converted (:func:`~aenv.libs.torchrl.to_torchrl_spec`); batch
    size, device, batch-locking and ``allow_done_after_reset`` are the env's. An
    :class:`~aenv.AsyncEnvPool` is one TorchRL env of batch size ``(num_envs, ...)``: a
    TorchRL collector steps all its sub-envs in one call (on the pool's backend: coroutine,
    thread or process) and partial resets reach only the flagged sub-envs. Closing this env
    closes the aenv env.

    Args:
        env: the aenv env.
        runner: the loop runner to use (default: aenv's process-wide one).

    Example:
        >>> from torchrl.collectors import SyncDataCollector
        >>> from aenv.libs.gym import GymEnv
        >>> env = to_torchrl(AsyncEnvPool([lambda: GymEnv("CartPole-v1")] * 4))
        >>> collector = SyncDataCollector(env, None, frames_per_batch=64, total_frames=128)
        >>> next(iter(collector)).batch_size
        torch.Size([4, 16])
    """

    def __init__(self, env: EnvBase, *, runner: Runner | None = None) -> None:
        if not isinstance(env, EnvBase):
            raise TypeError(f"AenvTorchRLEnv wraps an aenv EnvBase, got {type(env).__name__}")
        if isinstance(env, TorchRLWrapper):
            raise TypeError(
                "AenvTorchRLEnv got a TorchRL env wrapped for aenv (TorchRLWrapper): use its "
                "env attribute, the TorchRL env itself (to_torchrl returns it)"
            )
        super().__init__(
            device=env.device,
            batch_size=env.batch_size,
            allow_done_after_reset=env.allow_done_after_reset,
        )
        self.aenv_env = env
        self._runner = runner
        # an instance attribute: TorchRL keeps its default on the class
        self._batch_locked = env.batch_locked
        out, inp = env.output_spec, env.input_spec
        self.full_observation_spec = to_torchrl_spec(out["full_observation_spec"])
        self.full_reward_spec = to_torchrl_spec(out["full_reward_spec"])
        self.full_done_spec = to_torchrl_spec(out["full_done_spec"])
        self.full_action_spec = to_torchrl_spec(inp["full_action_spec"])
        self.full_state_spec = to_torchrl_spec(inp["full_state_spec"])
        self.is_closed = False

    def _run(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        return (self._runner or get_runner()).run(fn, *args, **kwargs)

    def _reset(self, tensordict: TensorDictBase | None = None, **kwargs: Any) -> TensorDictBase:
        # aenv's reset updates its input in place; TorchRL wants a new TensorDict back
        inp = None if tensordict is None else tensordict.copy()
        return self._run(self.aenv_env.reset, inp, **kwargs)  # type: ignore[no-any-return]

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        out = self._run(self.aenv_env.step, tensordict.exclude("next"))
        return out.get("next")  # type: ignore[no-any-return]

    def _set_seed(self, seed: int | None) -> None:
        self._run(self.aenv_env.set_seed, seed)

    def close(self, *, raise_if_closed: bool = True) -> None:
        """Close the aenv env (TorchRL's ``close``; idempotent)."""
        if self.__dict__.get("is_closed", True):
            return
        self.is_closed = True
        self._run(self.aenv_env.aclose)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.aenv_env!r})"


def to_torchrl(env: EnvBase, *, runner: Runner | None = None) -> TorchRLEnvBase:
    """``env`` (any aenv env, a pool included) as a TorchRL env; see :class:`AenvTorchRLEnv`.
    A :class:`~aenv.libs.torchrl.TorchRLWrapper` gives back the TorchRL env it wraps.

    Example:
        >>> from torchrl.envs.utils import check_env_specs
        >>> check_env_specs(to_torchrl(PendulumEnv()))
    """
    if isinstance(env, TorchRLWrapper):
        return env.env
    return AenvTorchRLEnv(env, runner=runner)
