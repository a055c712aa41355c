"""TorchRLWrapper: any TorchRL env (a ``TransformedEnv``, a ``ParallelEnv``, a library
wrapper...) as an aenv env whose calls run off the event loop."""

from __future__ import annotations

from typing import Any

from tensordict import TensorDictBase

from aenv.envs._common import EnvBase
from aenv.envs._threads import run_blocking
from aenv.libs._torchrl_specs import from_torchrl_spec, torchrl_module

__all__ = ["TorchRLWrapper"]


class TorchRLWrapper(EnvBase):
    """A TorchRL ``EnvBase`` (any of them: a plain env, a ``TransformedEnv``, a batched
    ``SerialEnv`` / ``ParallelEnv``, one of TorchRL's library wrappers) as an aenv env.

    The specs are TorchRL's, converted to aenv's (:func:`~aenv.libs.torchrl.from_torchrl_spec`);
    batch size, device and batch-locking are the env's. TorchRL's calls are synchronous,
    so by default they run in a worker thread and the event loop stays free (``blocking``).
    Data passes as it is: both libraries use ``tensordict`` TensorDicts. Partial resets and
    steps (``"_reset"`` / ``"_step"``) reach the TorchRL env, which honours them itself.

    Seeding: ``await env.set_seed(s)`` calls the TorchRL env's ``set_seed``; so does
    ``await env.reset(seed=s)`` before resetting.

    Args:
        env: the TorchRL env (it is closed with this wrapper).
        blocking: run TorchRL's calls in a worker thread (True) or inline on the loop.
        allow_done_after_reset: see :class:`~aenv.EnvBase` (default: the TorchRL env's).
        run_type_checks, spec_locked: see :class:`~aenv.EnvBase`.

    Example:
        >>> from torchrl.envs import GymEnv, StepCounter, TransformedEnv
        >>> env = TorchRLWrapper(TransformedEnv(GymEnv("CartPole-v1"), StepCounter()))
        >>> td = await env.rollout(5, break_when_any_done=False)
        >>> td["next", "step_count"].squeeze(-1).tolist()
        [1, 2, 3, 4, 5]
    """

    def __init__(
        self,
        env: Any,
        *,
        blocking: bool = True,
        allow_done_after_reset: bool | None = None,
        run_type_checks: bool = False,
        spec_locked: bool = True,
    ) -> None:
        trl = torchrl_module()
        if not isinstance(env, trl.envs.EnvBase):
            raise TypeError(
                f"TorchRLWrapper wraps a torchrl.envs.EnvBase, got {type(env).__name__}"
            )
        from aenv.libs._to_torchrl import AenvTorchRLEnv  # torchrl is importable here

        if isinstance(env, AenvTorchRLEnv):
            # an aenv env seen through TorchRL: wrapping it back would run aenv's loop runner
            # from inside itself
            raise TypeError(
                "TorchRLWrapper got an aenv env exposed to TorchRL (to_torchrl): use its "
                "aenv_env attribute, the aenv env itself"
            )
        if allow_done_after_reset is None:
            allow_done_after_reset = bool(getattr(env, "_allow_done_after_reset", False))
        super().__init__(
            device=env.device,
            batch_size=env.batch_size,
            run_type_checks=run_type_checks,
            allow_done_after_reset=allow_done_after_reset,
            spec_locked=spec_locked,
        )
        self._env = env
        self.blocking = blocking  # type: ignore[misc]
        self._batch_locked = bool(env.batch_locked)
        self.output_spec = from_torchrl_spec(env.output_spec)  # type: ignore[assignment]
        self.input_spec = from_torchrl_spec(env.input_spec)  # type: ignore[assignment]

    @property
    def env(self) -> Any:
        """The wrapped TorchRL env."""
        return self._env

    def __getattr__(self, name: str) -> Any:
        # public names fall through to the TorchRL env (its transform, its own methods...)
        env = self.__dict__.get("_env")
        if env is None or name.startswith("_"):
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return getattr(env, name)

    def _reset(self, tensordict: TensorDictBase | None, **kwargs: Any) -> TensorDictBase:
        seed = kwargs.pop("seed", None)
        if seed is not None:
            self._env.set_seed(int(seed))
        # a shallow copy: TorchRL's reset writes into its input, aenv merges the result
        inp = None if tensordict is None else tensordict.copy()
        return self._env.reset(inp, **kwargs)  # type: ignore[no-any-return]

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        # TorchRL writes "next" into its input: give it a shallow copy without one
        out = self._env.step(tensordict.exclude("next"))
        return out.get("next")  # type: ignore[no-any-return]

    def _set_seed(self, seed: int | None) -> None:
        self._env.set_seed(seed)

    async def _aclose(self) -> None:
        env = self._env
        if getattr(env, "is_closed", False):
            return
        if self.blocking:
            await run_blocking(env.close)
        else:
            env.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._env!r})"
