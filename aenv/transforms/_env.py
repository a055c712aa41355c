"""TransformedEnv: an async env made of a base env and a chain of transforms."""

from __future__ import annotations

import inspect
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase

from aenv._mdp import mask_merge, reduce_mask
from aenv.envs._common import EnvBase, _EnvMeta
from aenv.specs import Composite
from aenv.transforms._base import Transform
from aenv.transforms._compose import Compose, not_a_transform

__all__ = ["TransformedEnv"]


class _TransformedEnvMeta(_EnvMeta):
    """Lets ``TransformedEnv(facade, ...)`` transform a sync facade (``SerialEnv``,
    ``ParallelEnv``, ``SyncEnv``): the transformed env wraps the facade's async env and comes
    back as a sync facade on the same runner, so sync code keeps calling it synchronously."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        env: Any = args[0] if args else kwargs.get("env")
        # a facade says what it is: this layer does not import the sync one above it
        if getattr(type(env), "_aenv_sync_facade", False):
            if args:
                args = (env.env, *args[1:])
            else:
                kwargs["env"] = env.env
            return env._rewrap(super().__call__(*args, **kwargs))
        return super().__call__(*args, **kwargs)


class TransformedEnv(EnvBase, metaclass=_TransformedEnvMeta):
    """An env whose inputs and outputs go through transforms on their way to a base env.

    Steps run the inverse transforms on (a shallow copy of) the input, await the base env's
    step, then the forward transforms on its ``"next"`` output; resets run the forward
    transforms' reset hooks on the base env's reset output. Specs are the base env's specs as
    the transforms map them (cached, recomputed when transforms are added). Batch size,
    device and ``batch_locked`` come from the base env; unknown attributes are read from it.

    A sync facade (``SerialEnv``, ``ParallelEnv``, ``SyncEnv``) is accepted as the base env:
    ``TransformedEnv(ParallelEnv(4, make_env), StepCounter(10))`` transforms the facade's
    async env and returns a sync facade (:class:`~aenv.sync.SyncEnv`) over the result, on
    the same runner; ``facade.append_transform(t)`` does the same.

    Args:
        env: the base env (or a sync facade, see above).
        transform: a Transform (a Compose for several), or None to add them later.
        cache_specs: kept for TorchRL compatibility; specs are always cached and recomputed
            when the transform chain changes (call ``env.transform_changed()`` after changing a
            transform's parameters in a way that alters specs).

    Example:
        >>> env = TransformedEnv(CountingEnv(), Compose(StepCounter(), RewardSum()))
        >>> r = await env.rollout(3)
        >>> r["next", "episode_reward"].squeeze(-1)
        tensor([1., 2., 3.])
        >>> type(env.transform[-1].parent.transform[0])  # the env up to RewardSum
        <class 'aenv.transforms._counters.StepCounter'>
    """

    def __init__(
        self,
        env: EnvBase,
        transform: Transform | None = None,
        cache_specs: bool = True,
        **kwargs: Any,
    ) -> None:
        if not isinstance(env, EnvBase):
            raise TypeError(f"TransformedEnv wraps an EnvBase, got {type(env).__name__}")
        self.__dict__["base_env"] = env
        self._batch_locked = env.batch_locked
        kwargs.setdefault("allow_done_after_reset", env.allow_done_after_reset)
        kwargs.setdefault("run_type_checks", False)
        super().__init__(device=env.device, batch_size=env.batch_size, **kwargs)
        self.cache_specs = cache_specs
        if transform is None:
            transform = Compose()
        elif not isinstance(transform, Compose):
            if not isinstance(transform, Transform):
                raise TypeError(f"transform must be a Transform, got {not_a_transform(transform)}")
            if transform.__dict__.get("_container") is not None:
                transform.set_container(self)  # raises: the transform has a parent already
            transform = Compose(transform)
        transform.set_container(self)
        self.__dict__["transform"] = transform
        self._compute_specs()

    # ------------------------------------------------------------------ specs and chain
    def _compute_specs(self) -> None:
        base = self.base_env
        out = base.output_spec.clone()
        out.unlock_()
        inp = base.input_spec.clone()
        inp.unlock_()
        # the batch size first: spec hooks (e.g. BatchSizeTransform's) may depend on it
        self.batch_size = self._chain.transform_env_batch_size(base.batch_size)
        out = self._chain.transform_output_spec(out)
        inp = self._chain.transform_input_spec(inp)
        self.__dict__["output_spec"] = out
        self.__dict__["input_spec"] = inp
        dev = _spec_device(out)
        self._device = dev if dev is not None else base.device
        self._needs_inv = self._chain._needs_inv
        self._specs_changed()

    @property
    def _chain(self) -> Compose:
        # the chain itself (always a Compose), whatever a subclass makes of ``transform``
        return self.__dict__["transform"]  # type: ignore[no-any-return]

    def transform_changed(self) -> None:
        """Recompute the specs (after a transform's parameters changed what they describe)."""
        self._compute_specs()

    def append_transform(self, transform: Transform) -> TransformedEnv:
        """Append a transform (outermost); returns the env."""
        self._chain.append(transform)
        return self

    def insert_transform(self, index: int, transform: Transform) -> TransformedEnv:
        """Insert a transform at ``index`` of the chain (0 is next to the base env)."""
        self._chain.insert(index, transform)
        return self

    @property
    def batch_locked(self) -> bool:
        return self.base_env.batch_locked

    @batch_locked.setter
    def batch_locked(self, value: bool) -> None:
        self.base_env.batch_locked = value
        self._batch_locked = bool(value)

    def __getattr__(self, name: str) -> Any:
        # only public attributes fall through: private ones are this env's own business
        if name.startswith("_") or "base_env" not in self.__dict__:
            raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")
        return getattr(self.__dict__["base_env"], name)

    def __repr__(self) -> str:
        return f"TransformedEnv(env={self.base_env!r}, transform={self._chain!r})"

    # ------------------------------------------------------------------ step
    async def step(self, tensordict: TensorDictBase) -> TensorDictBase:
        # fast path: the base env checks the batch and completes done flags; transforms keep
        # them consistent. Partial steps and type checks take EnvBase's generic path.
        if self.run_type_checks or "_step" in tensordict.keys():
            return await super().step(tensordict)
        self._check_open()
        tensordict.set("next", await self._step(tensordict))
        return tensordict

    async def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        transform = self._chain
        td_in = tensordict
        if self._needs_inv:
            td_in = transform._inv_call(tensordict.copy())
            if inspect.isawaitable(td_in):
                td_in = await td_in
        partial = td_in.get("_step", None)
        mask = None
        if partial is not None:
            mask = reduce_mask(partial, (*td_in.batch_size, 1)).to(torch.bool)
            if not bool(mask.any()):
                return self._previous_as_next(tensordict.exclude("_step", "next"))
            if bool(mask.all()):
                td_in = td_in.exclude("_step")
                mask = None
        td_in = await self.base_env.step(td_in)
        next_td = td_in.get("next")
        out = transform._step(tensordict, next_td)
        if inspect.isawaitable(out):
            out = await out
        if mask is not None:
            mask_merge(out, tensordict.exclude("next"), mask)
        return out

    # ------------------------------------------------------------------ reset
    async def _reset(
        self, tensordict: TensorDictBase | None = None, **kwargs: Any
    ) -> TensorDictBase:
        transform = self._chain
        td_in = None
        if tensordict is None and self.batch_size != self.base_env.batch_size:
            # a transform changed the batch size: the base env resets a batch of that size
            tensordict = TensorDict({}, batch_size=self.batch_size, device=self.device)
        if tensordict is not None:
            td_in = tensordict.select(*self.reset_keys, *self.state_keys, strict=False)
            td_in = transform._reset_env_preprocess(td_in)
            if inspect.isawaitable(td_in):
                td_in = await td_in
        td_reset = await self._base_reset(td_in, **kwargs)
        if tensordict is None:
            tensordict = TensorDict({}, batch_size=td_reset.batch_size, device=td_reset.device)
        out = transform._reset(tensordict, td_reset)
        if inspect.isawaitable(out):
            out = await out
        return out

    async def _base_reset(self, td_in: TensorDictBase | None, **kwargs: Any) -> TensorDictBase:
        return await self.base_env.reset(td_in, **kwargs)

    # ------------------------------------------------------------------ seeding and closing
    def _set_seed(self, seed: int | None) -> None:  # pragma: no cover - set_seed is overridden
        raise NotImplementedError

    async def set_seed(self, seed: int | None = None, static_seed: bool = False) -> int | None:
        """Seed the base env; returns the next seed."""
        return await self.base_env.set_seed(seed, static_seed)

    async def _aclose(self) -> None:
        await self.base_env.aclose()

    def __getstate__(self) -> dict[str, Any]:
        return dict(self.__dict__)

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)


def _spec_device(spec: Composite) -> torch.device | None:
    obs = spec["full_observation_spec"]
    return obs.device if obs.device is not None else spec.device
