"""``Transform``: the piece a :class:`~aenv.transforms.TransformedEnv` chains (``Compose``, a
chain of transforms, is in :mod:`aenv.transforms._compose`).

A transform sits between a base env (the "inside") and the user (the "outside"). Forward hooks
run on what the base env outputs (reset and step results); inverse hooks run on what the user
gives before the base env sees it. ``in_keys`` name inner entries read by the forward hooks
and ``out_keys`` the outer entries they write; ``out_keys_inv`` name outer entries read by the
inverse hooks and ``in_keys_inv`` the inner entries they write.

Hooks a subclass overrides (any of them may be ``async def`` or return an awaitable; the
machinery awaits only when it gets one, so sync transforms pay nothing for that):

``_apply_transform(value) -> value``
    Per tensor, forward; the default ``_call`` applies it to every present ``in_key`` and
    writes the result at the matching ``out_key``.
``_inv_apply_transform(value) -> value``
    Per tensor, inverse; the default ``_inv_call`` reads each present ``out_key_inv`` and
    writes at ``in_key_inv``.
``_call(next_td) -> next_td``
    Forward on a step's ``"next"`` content (and, by default, on reset outputs). The default
    raises ``KeyError`` when an ``in_key`` is missing from a step's output.
``_step(td, next_td) -> next_td``
    Forward on a step: ``td`` is the outer input (read-only, e.g. previous counters),
    ``next_td`` the base env's ``"next"``. Default: ``_call(next_td)``.
``_reset(td, td_reset) -> td_reset``
    Forward on a reset: ``td`` is the outer reset input (an empty TensorDict when the user
    passed none) and carries the ``"_reset"`` masks of a partial reset (root entries already
    expanded to nested levels); ``td_reset`` is the base env's reset output. Where a mask is
    False the env restores the input's values afterwards, so a transform only has to get the
    reset elements right, but stateful transforms must only reset their state there (see
    :func:`reset_mask`). Default: ``_call(td_reset)`` skipping missing keys.
``_inv_call(td) -> td``
    Inverse on the (shallow-copied) step input before the base env steps. Writing a
    ``"_step"`` entry there (bool, batch-shaped) skips elements: they get their previous
    values, and the forward hooks' results for them are discarded (see ConditionalSkip).
``_reset_env_preprocess(td) -> td``
    Inverse on a reset input (state entries and ``"_reset"`` masks) before the base env
    resets. Default: identity.

Spec hooks map the base env's specs to what the transformed env really outputs (they get
unlocked clones they may modify in place, and return the spec):
``transform_output_spec(output_spec)`` dispatches to ``transform_observation_spec``,
``transform_reward_spec`` and ``transform_done_spec`` (each on the ``full_*`` composite);
``transform_input_spec(input_spec)`` dispatches to ``transform_action_spec`` and
``transform_state_spec`` (inner input spec -> the outer one the user must provide). The
defaults of the three output hooks rewrite, for each ``(in_key, out_key)`` pair whose
``in_key`` the composite holds, ``spec[out_key] = self._transform_spec(spec[in_key])``; the
two input hooks do ``spec[out_key_inv] = self._inv_transform_spec(spec[in_key_inv])``.
``_transform_spec`` / ``_inv_transform_spec`` (leaf -> leaf) default to identity (a clone
when the key changes), so a transform keeping shapes and dtypes needs no spec code.

Other hooks: ``_needs_inv`` (property; False lets the env skip the inverse pass and its
copy; default: True when there are inverse keys or ``_inv_call`` is overridden).

Navigation: ``parent`` (a TransformedEnv over the same base env with clones of the
transforms before this one, or None), ``container`` (the TransformedEnv holding the
transform, through Composes, or None), ``set_container`` (raises when the transform already
belongs elsewhere: ``clone()`` it), ``reset_parent()``, ``clone()`` (a copy without parent,
sharing buffers, so clones see in-place buffer updates).
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

import torch
from tensordict import TensorDictBase
from torch import nn

from aenv._mdp import NestedKey, unravel
from aenv.specs import Composite, TensorSpec

if TYPE_CHECKING:
    from aenv.transforms._env import TransformedEnv

__all__ = ["Transform", "reset_mask"]


def _norm_keys(keys: Sequence[NestedKey] | NestedKey | None) -> list[NestedKey]:
    if keys is None:
        return []
    if isinstance(keys, (str, tuple)):
        return [keys]
    return [k if isinstance(k, str) else tuple(k) for k in keys]


def reset_mask(
    td: TensorDictBase | None,
    prefix: tuple[str, ...] | NestedKey = (),
    like: torch.Tensor | None = None,
) -> torch.Tensor | None:
    """The ``"_reset"`` mask a reset-aware transform must honour at level ``prefix``.

    Returns the bool mask at ``(*prefix, "_reset")`` in ``td`` or, failing that, the root one
    (expanded to ``like``'s shape when ``like`` is given and deeper); None when ``td`` holds
    no mask at all, meaning that everything is reset.

    Example:
        >>> td = TensorDict({"_reset": torch.tensor([[True], [False]])}, [2])
        >>> reset_mask(td).squeeze(-1)
        tensor([ True, False])
    """
    if td is None:
        return None
    prefix_t = () if prefix == () else unravel(cast(NestedKey, prefix))
    mask = td.get((*prefix_t, "_reset"), None) if prefix_t else None
    if mask is None:
        mask = td.get("_reset", None)
        if mask is None:
            return None
    mask = mask.to(torch.bool)
    if like is not None and mask.shape != like.shape:
        while mask.ndim > td.batch_dims and mask.shape[-1] == 1:
            mask = mask.squeeze(-1)
        mask = mask.reshape(*mask.shape, *([1] * (like.ndim - mask.ndim))).expand(like.shape)
    return mask


def _map_entries(
    td: TensorDictBase,
    pairs: Sequence[tuple[NestedKey, NestedKey]],
    fn: Any,
    strict_owner: str | None,
) -> Any:
    """``td[dst] = fn(td[src])`` for each ``(src, dst)`` pair, in order; a missing ``src`` is
    skipped, or raises ``KeyError`` naming ``strict_owner`` when one is given. Awaits (and
    returns a coroutine) only once ``fn`` hands back an awaitable."""
    for i, (src, dst) in enumerate(pairs):
        value = td.get(src, None)
        if value is None:
            if strict_owner is not None:
                raise KeyError(f"{strict_owner}: {src!r} is missing from {td.keys()}")
            continue
        out = fn(value)
        if inspect.isawaitable(out):
            return _map_entries_rest(td, out, dst, pairs[i + 1 :], fn, strict_owner)
        td.set(dst, out)
    return td


async def _map_entries_rest(
    td: TensorDictBase,
    pending: Any,
    dst: NestedKey,
    rest: Sequence[tuple[NestedKey, NestedKey]],
    fn: Any,
    strict_owner: str | None,
) -> TensorDictBase:
    td.set(dst, await pending)
    out = _map_entries(td, rest, fn, strict_owner)
    return await out if inspect.isawaitable(out) else out  # type: ignore[no-any-return]


class Transform(nn.Module):
    """Base class of env transforms: forward on outputs, inverse on inputs, and specs.

    Args:
        in_keys: inner entries the forward hooks read.
        out_keys: outer entries they write (default: ``in_keys``).
        in_keys_inv: inner entries the inverse hooks write (base env input names).
        out_keys_inv: outer entries they read (default: ``in_keys_inv``).

    The hooks to override are listed in :mod:`aenv.transforms._base`'s docstring.

    Example:
        >>> class Double(Transform):
        ...     def _apply_transform(self, obs):
        ...         return obs * 2
        >>> env = TransformedEnv(CountingEnv(), Double(in_keys=["observation"]))
        >>> td = await env.rand_step(await env.reset())
        >>> td["next", "observation"]
        tensor([2.])
    """

    def __init__(
        self,
        in_keys: Sequence[NestedKey] | NestedKey | None = None,
        out_keys: Sequence[NestedKey] | NestedKey | None = None,
        in_keys_inv: Sequence[NestedKey] | NestedKey | None = None,
        out_keys_inv: Sequence[NestedKey] | NestedKey | None = None,
    ) -> None:
        super().__init__()
        self.in_keys = _norm_keys(in_keys)
        self.out_keys = _norm_keys(out_keys) if out_keys is not None else list(self.in_keys)
        self.in_keys_inv = _norm_keys(in_keys_inv)
        self.out_keys_inv = (
            _norm_keys(out_keys_inv) if out_keys_inv is not None else list(self.in_keys_inv)
        )
        for name, a, b in (
            ("out_keys", self.in_keys, self.out_keys),
            ("out_keys_inv", self.in_keys_inv, self.out_keys_inv),
        ):
            if len(a) != len(b):
                raise ValueError(f"{type(self).__name__}: {name} must match its in-keys in length")
        self.__dict__["_container"] = None
        self.__dict__["_parent_cache"] = None

    # ------------------------------------------------------------------ per-tensor hooks
    def _apply_transform(self, value: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__} does not implement _apply_transform")

    def _inv_apply_transform(self, value: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__} does not implement _inv_apply_transform")

    # ------------------------------------------------------------------ tensordict hooks
    def _call(self, next_tensordict: TensorDictBase) -> Any:
        return self._apply_keys(next_tensordict, strict=True)

    def _apply_keys(self, td: TensorDictBase, strict: bool) -> Any:
        owner = type(self).__name__ if strict else None
        return _map_entries(
            td, list(zip(self.in_keys, self.out_keys)), self._apply_transform, owner
        )

    def _step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> Any:
        return self._call(next_tensordict)

    def _reset(self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase) -> Any:
        if type(self)._call is Transform._call:
            return self._apply_keys(tensordict_reset, strict=False)
        return self._call(tensordict_reset)

    def _inv_call(self, tensordict: TensorDictBase) -> Any:
        pairs = list(zip(self.out_keys_inv, self.in_keys_inv))
        return _map_entries(tensordict, pairs, self._inv_apply_transform, None)

    def _reset_env_preprocess(self, tensordict: TensorDictBase) -> Any:
        return tensordict

    @property
    def _needs_inv(self) -> bool:
        return bool(self.in_keys_inv) or type(self)._inv_call is not Transform._inv_call

    def forward(self, tensordict: TensorDictBase) -> Any:
        """Apply the forward transform to ``tensordict`` (e.g. rollout data); in place."""
        return self._call(tensordict)

    def inv(self, tensordict: TensorDictBase) -> Any:
        """Apply the inverse transform to a shallow copy of ``tensordict``."""
        return self._inv_call(tensordict.copy())

    # ------------------------------------------------------------------ spec hooks
    def _transform_spec(self, spec: TensorSpec) -> TensorSpec:
        return spec

    def _inv_transform_spec(self, spec: TensorSpec) -> TensorSpec:
        return spec

    def _map_specs(
        self, spec: Composite, pairs: Sequence[tuple[NestedKey, NestedKey]], inverse: bool
    ) -> Composite:
        fn = self._inv_transform_spec if inverse else self._transform_spec
        for src, dst in pairs:
            if src not in spec.keys(include_nested=True, leaves_only=True):
                continue
            leaf = spec[src]
            new = fn(leaf if unravel(src) == unravel(dst) else leaf.clone())
            if new is not leaf or unravel(src) != unravel(dst):
                spec[dst] = new
        return spec

    def transform_observation_spec(self, observation_spec: Composite) -> Composite:
        return self._map_specs(observation_spec, list(zip(self.in_keys, self.out_keys)), False)

    def transform_reward_spec(self, reward_spec: Composite) -> Composite:
        return self._map_specs(reward_spec, list(zip(self.in_keys, self.out_keys)), False)

    def transform_done_spec(self, done_spec: Composite) -> Composite:
        return self._map_specs(done_spec, list(zip(self.in_keys, self.out_keys)), False)

    def transform_action_spec(self, action_spec: Composite) -> Composite:
        return self._map_specs(action_spec, list(zip(self.in_keys_inv, self.out_keys_inv)), True)

    def transform_state_spec(self, state_spec: Composite) -> Composite:
        return self._map_specs(state_spec, list(zip(self.in_keys_inv, self.out_keys_inv)), True)

    def transform_env_batch_size(self, batch_size: torch.Size) -> torch.Size:
        """The batch size of the env seen through this transform (default: unchanged)."""
        return batch_size

    def transform_output_spec(self, output_spec: Composite) -> Composite:
        for name, fn in (
            ("full_observation_spec", self.transform_observation_spec),
            ("full_reward_spec", self.transform_reward_spec),
            ("full_done_spec", self.transform_done_spec),
        ):
            output_spec[name] = fn(output_spec[name])
        return output_spec

    def transform_input_spec(self, input_spec: Composite) -> Composite:
        for name, fn in (
            ("full_action_spec", self.transform_action_spec),
            ("full_state_spec", self.transform_state_spec),
        ):
            input_spec[name] = fn(input_spec[name])
        return input_spec

    # ------------------------------------------------------------------ parent and container
    def set_container(self, container: Transform | TransformedEnv) -> None:
        """Attach the transform to a Compose or an env; raises if it belongs elsewhere."""
        current = self.__dict__.get("_container")
        if current is not None and current is not container:
            raise RuntimeError(
                f"{type(self).__name__} already belongs to {type(current).__name__}; a transform "
                "can have one parent only: use transform.clone() to get a copy without parent"
            )
        self.__dict__["_container"] = container
        self._clear_parent_cache()

    def reset_parent(self) -> None:
        """Detach the transform from its container (and forget its parent)."""
        self.__dict__["_container"] = None
        self._clear_parent_cache()

    def _clear_parent_cache(self) -> None:
        self.__dict__["_parent_cache"] = None

    @property
    def container(self) -> TransformedEnv | None:
        """The TransformedEnv holding this transform (through Composes), or None."""
        from aenv.transforms._env import TransformedEnv

        node = self.__dict__.get("_container")
        while node is not None and not isinstance(node, TransformedEnv):
            node = node.__dict__.get("_container")
        return node

    def _env_and_preceding(self) -> tuple[TransformedEnv | None, list[Transform]]:
        from aenv.transforms._env import TransformedEnv

        node = self.__dict__.get("_container")
        if node is None:
            return None, []
        if isinstance(node, TransformedEnv):
            return node, []
        from aenv.transforms._compose import Compose

        env, before = node._env_and_preceding()
        if env is None:
            return None, []
        siblings = list(node.transforms) if isinstance(node, Compose) else []
        idx = next(i for i, t in enumerate(siblings) if t is self)
        return env, [*before, *siblings[:idx]]

    @property
    def parent(self) -> TransformedEnv | None:
        """A TransformedEnv of the base env and (clones of) the transforms before this one.

        It wraps the same base env: use it to read specs, not to run a second rollout.
        """
        cached = self.__dict__.get("_parent_cache")
        if cached is not None:
            return cast("TransformedEnv", cached)
        from aenv.transforms._compose import Compose
        from aenv.transforms._env import TransformedEnv

        env, before = self._env_and_preceding()
        if env is None:
            return None
        # the async base env itself (a sync view of the env may show another ``base_env``)
        base = env.__dict__["base_env"]
        parent = TransformedEnv(base, Compose(*[t.clone() for t in before]))
        self.__dict__["_parent_cache"] = parent
        return parent

    def _invalidate_specs(self) -> None:
        """Tell the env holding this transform that its specs must be recomputed."""
        env = self.container
        if env is not None:
            env.transform_changed()

    # ------------------------------------------------------------------ copies
    def clone(self) -> Transform:
        """A copy without parent that shares buffers (in-place buffer updates are seen by both)."""
        new = copy.copy(self)
        state = new.__dict__
        state["_buffers"] = dict(self._buffers)
        state["_parameters"] = dict(self._parameters)
        state["_modules"] = {
            k: (m.clone() if isinstance(m, Transform) else m) for k, m in self._modules.items()
        }
        for name in ("in_keys", "out_keys", "in_keys_inv", "out_keys_inv"):
            state[name] = list(state[name])
        state["_container"] = None
        state["_parent_cache"] = None
        return new

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_parent_cache"] = None
        return state

    def extra_repr(self) -> str:
        parts = [f"in_keys={self.in_keys}"]
        if self.out_keys != self.in_keys:
            parts.append(f"out_keys={self.out_keys}")
        if self.in_keys_inv:
            parts.append(f"in_keys_inv={self.in_keys_inv}")
            if self.out_keys_inv != self.in_keys_inv:
                parts.append(f"out_keys_inv={self.out_keys_inv}")
        return ", ".join(parts)
