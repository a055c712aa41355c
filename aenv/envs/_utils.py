"""Helpers around envs: spec checks, random policy, exploration type, metadata, libraries."""

from __future__ import annotations

import functools
import importlib.util
import inspect
from typing import TYPE_CHECKING, Any

import torch
from tensordict import LazyStackedTensorDict, TensorDictBase
from tensordict.nn import InteractionType as ExplorationType
from tensordict.nn import set_interaction_type as set_exploration_type

# tensordict.nn re-exports interaction_type only from 0.15 on; probabilistic has it in 0.14 too
from tensordict.nn.probabilistic import interaction_type as _interaction_type

from aenv._mdp import unravel
from aenv.envs._specs import fake_from_specs
from aenv.specs import Composite, TensorSpec

if TYPE_CHECKING:
    from aenv.envs._common import EnvBase

__all__ = [
    "EnvMetaData",
    "ExplorationType",
    "RandomPolicy",
    "acheck_env_specs",
    "exploration_type",
    "get_available_libraries",
    "set_exploration_type",
]


def exploration_type() -> ExplorationType | None:
    """The exploration type set by the innermost ``set_exploration_type`` (None if unset).

    ``set_exploration_type`` / ``ExplorationType`` are tensordict's interaction-type tools,
    so probabilistic ``tensordict.nn`` modules honour them directly.
    """
    return _interaction_type()


class RandomPolicy:
    """A policy drawing actions uniformly from an action spec.

    Example:
        >>> policy = RandomPolicy(env.full_action_spec)
        >>> td = policy(await env.reset())
    """

    def __init__(
        self, action_spec: TensorSpec, action_key: str | tuple[str, ...] = "action"
    ) -> None:
        self.action_spec = action_spec
        self.action_key = action_key

    def __call__(self, td: TensorDictBase) -> TensorDictBase:
        spec = self.action_spec
        if isinstance(spec, Composite):
            return td.update(spec.rand(td.batch_size[: td.batch_dims - spec.ndim]))
        # a leaf: its shape starts with the env's batch dims, which td may already carry
        if tuple(spec.shape[: td.batch_dims]) == tuple(td.batch_size):
            td.set(self.action_key, spec.rand())
        else:
            td.set(self.action_key, spec.rand(td.batch_size))
        return td


@functools.cache
def public_methods(cls: type) -> frozenset[str]:
    """The names of ``cls``'s public methods (functions, static and class methods)."""
    kinds = (staticmethod, classmethod, functools.partialmethod)
    found = ((n, inspect.getattr_static(cls, n)) for n in dir(cls) if not n.startswith("_"))
    # plain functions, not every method descriptor: spec-derived values are descriptors too
    return frozenset(n for n, a in found if inspect.isfunction(a) or isinstance(a, kinds))


def _env_methods(env: Any) -> frozenset[str]:
    """The public methods of ``env`` and of the envs it wraps (a transformed env reaches its
    base env's methods through attribute reads)."""
    methods: frozenset[str] = frozenset()
    while env is not None:
        methods |= public_methods(type(env))  # type: ignore[arg-type]
        env = env.__dict__.get("base_env")
    return methods


class EnvMetaData:
    """What other processes need to know of an env without building it.

    Holds the specs, batch size, device and batch-lock flag, and makes a zero
    ``tensordict`` (as ``env.fake_tensordict()``, made from the specs on first read: a pool
    of thousands of envs reads none); picklable, for building buffers or checking data in
    another process.
    """

    def __init__(
        self,
        *,
        tensordict: TensorDictBase | None = None,
        specs: dict[str, Composite],
        batch_size: torch.Size,
        device: torch.device | None,
        batch_locked: bool = True,
        env_str: str = "",
        methods: frozenset[str] = frozenset(),
    ) -> None:
        self._tensordict = tensordict
        self.specs = specs
        self.batch_size = torch.Size(batch_size)
        self.device = device
        self.batch_locked = batch_locked
        self.env_str = env_str
        # the env's public method names: a pool tells a method read from an attribute
        # read without asking the env (sync facades fan a method read out as calls)
        self.methods = methods

    @property
    def tensordict(self) -> TensorDictBase:
        """A zero-filled tensordict with every key a step produces, ``"next"`` included."""
        td = self._tensordict
        if td is None:
            td = self._tensordict = fake_from_specs(
                self.specs["output_spec"], self.specs["input_spec"], self.batch_size, self.device
            )
        return td

    @tensordict.setter
    def tensordict(self, value: TensorDictBase) -> None:
        self._tensordict = value

    @classmethod
    def metadata_from_env(cls, env: EnvBase) -> EnvMetaData:
        inp, out = env.input_spec, env.output_spec
        if not env.is_spec_locked:
            # (locked specs are never changed in place, only replaced: shared, not copied)
            inp, out = inp.clone(), out.clone()
        return cls(
            specs={"input_spec": inp, "output_spec": out},
            batch_size=env.batch_size,
            device=env.device,
            batch_locked=env.batch_locked,
            env_str=repr(env),
            methods=_env_methods(env),
        )

    def expand(self, *size: int) -> EnvMetaData:
        size_t = torch.Size(size[0] if len(size) == 1 and not isinstance(size[0], int) else size)
        return EnvMetaData(
            tensordict=self.tensordict.expand(*size_t).clone(),
            specs={k: v.expand(*size_t) for k, v in self.specs.items()},
            batch_size=size_t,
            device=self.device,
            batch_locked=self.batch_locked,
            env_str=self.env_str,
            methods=self.methods,
        )

    def to(self, device: torch.device | str) -> EnvMetaData:
        dev = torch.device(device)
        return EnvMetaData(
            tensordict=self.tensordict.to(dev),
            specs={k: v.to(dev) for k, v in self.specs.items()},
            batch_size=self.batch_size,
            device=dev,
            batch_locked=self.batch_locked,
            env_str=self.env_str,
            methods=self.methods,
        )

    def __getstate__(self) -> dict[str, Any]:
        return dict(self.__dict__)

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def __repr__(self) -> str:
        return f"EnvMetaData(env={self.env_str}, batch_size={tuple(self.batch_size)}, device={self.device})"


async def acheck_env_specs(
    env: EnvBase,
    return_contiguous: bool = True,
    check_dtype: bool = True,
    seed: int | None = None,
    tensordict: TensorDictBase | None = None,
    max_steps: int = 3,
) -> None:
    """Check that what the env really outputs matches its specs; raises AssertionError if not.

    Runs a short rollout and compares it, key by key, with ``env.fake_tensordict()``: same
    keys, shapes and (with ``check_dtype``) dtypes, and every value inside its spec. The
    coroutine twin of :func:`aenv.check_env_specs` (in :mod:`aenv.sync`).

    Example:
        >>> await acheck_env_specs(CountingEnv())
    """
    from aenv.envs._common import EnvBase

    if not isinstance(env, EnvBase):
        raise TypeError(
            f"acheck_env_specs checks an aenv env, got {type(env).__name__} (a sync facade "
            "is checked with check_env_specs(facade))"
        )
    if seed is not None:
        await env.set_seed(seed)
    if tensordict is not None:
        td0 = await env.reset(tensordict.clone())
        rollout = await env.rollout(
            max_steps,
            tensordict=td0,
            auto_reset=False,
            return_contiguous=return_contiguous,
            break_when_any_done=False,
        )
    else:
        rollout = await env.rollout(
            max_steps, return_contiguous=return_contiguous, break_when_any_done=False
        )
    fake = env.fake_tensordict()
    batch_dims = rollout.batch_dims - 1
    step0 = rollout.unbind(batch_dims)[0] if not env.batch_locked or env.batch_size else rollout[0]
    extra = step0.batch_size[: step0.batch_dims - len(env.batch_size)]
    if extra:
        fake = fake.expand(*extra, *fake.batch_size)
    fake_keys = {unravel(k) for k in fake.keys(True, True)}
    real_keys = {unravel(k) for k in step0.keys(True, True)}
    missing = fake_keys - real_keys
    # an env may also output its state under "next" (the state of the next step, as
    # TorchRL's envs do): allowed, and checked against the state spec below
    state = env.input_spec["full_state_spec"]
    next_state = {("next", *unravel(k)) for k in state.keys(True, True)} & real_keys
    extra_keys = {k for k in real_keys - fake_keys - next_state if k[-1] not in ("_reset", "_step")}
    if missing or extra_keys:
        raise AssertionError(
            "the env's outputs and its specs disagree: keys in the specs but not in the rollout: "
            f"{sorted(missing)}; keys in the rollout but not in the specs: {sorted(extra_keys)}"
        )
    problems = []
    for key in fake_keys:
        for a, b in zip(_values(fake, key), _values(step0, key)):
            if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
                continue
            if a.shape != b.shape and not _dynamic_match(env, key, a.shape, b.shape):
                problems.append(
                    f"{key}: spec shape {tuple(a.shape)}, rollout shape {tuple(b.shape)}"
                )
            elif check_dtype and a.dtype != b.dtype:
                problems.append(f"{key}: spec dtype {a.dtype}, rollout dtype {b.dtype}")
    if problems:
        raise AssertionError(
            "the env's outputs and its specs disagree:\n  " + "\n  ".join(problems)
        )
    for key in sorted(next_state):
        spec, value = state[key[1:]], step0.get(key)
        if extra:
            spec = spec.expand(*extra, *spec.shape)
        if isinstance(value, torch.Tensor) and not spec.is_in(value):
            raise AssertionError(f"{key!r} = {value} is outside its state spec {spec!r}")
    for name in ("full_observation_spec", "full_done_spec"):
        spec = env.output_spec[name]
        if extra:
            spec = spec.expand(*extra, *spec.shape)
        for key in spec.keys(True, True):
            # a heterogeneous level (elements of different shapes) is checked as a whole
            key, value = _readable(step0, ("next", *unravel(key)))
            if isinstance(value, TensorDictBase | torch.Tensor) and not spec[key[1:]].is_in(value):
                raise AssertionError(f"{key!r} = {value} is outside its spec {spec[key[1:]]!r}")


def _values(td: TensorDictBase, key: tuple[str, ...]) -> list[Any]:
    """The values of ``key`` in ``td``: one, or one per element of a lazy stack whose
    elements differ in shape (read element by element, through nested stacks)."""
    if isinstance(td, LazyStackedTensorDict):
        try:
            return [td.get(key)]
        except RuntimeError:
            return [v for sub in td.tensordicts for v in _values(sub, key)]
    for i in range(1, len(key)):
        sub = td.get(key[:i], None)
        if isinstance(sub, LazyStackedTensorDict):
            return _values(sub, key[i:])
    return [td.get(key)]


def _readable(td: TensorDictBase, key: tuple[str, ...]) -> tuple[tuple[str, ...], Any]:
    """``key`` and its value, or the deepest level above it that reads as one value."""
    while True:
        try:
            return key, td.get(key)
        except RuntimeError:  # a lazy stack of entries of different shapes
            if len(key) <= 2:
                raise
            key = key[:-1]


def _dynamic_match(
    env: EnvBase, key: tuple[str, ...], spec_shape: torch.Size, shape: torch.Size
) -> bool:
    leaf = key[1:] if key[0] == "next" else key
    for name in ("full_observation_spec", "full_state_spec"):
        container = env.output_spec if name == "full_observation_spec" else env.input_spec
        spec = container[name]
        if leaf in spec.keys(True, True):
            decl = spec[leaf].shape
            return len(decl) == len(shape) and all(d == -1 or d == s for d, s in zip(decl, shape))
    return False


def get_available_libraries() -> dict[str, bool]:
    """Which optional libraries aenv can use here (name -> importable)."""
    names = ["gymnasium", "gym", "torchrl", "ray", "uvloop", "tqdm", "rich", "matplotlib"]
    names += ["chess", "envpool", "imageio"]
    names += ["pettingzoo", "dm_control", "pyspiel", "mo_gymnasium"]
    return {name: importlib.util.find_spec(name) is not None for name in names}
