"""Conversion between gymnasium spaces and specs, both ways.

The spec keeps what its class cannot say (gymnasium dtype of discrete spaces, ``start``
offsets, Tuple-ness, Text's lengths and charset) in its private ``_meta`` so that
``to_gym_space(from_gym_space(space)) == space``.

Spaces whose values a tensor cannot hold (``Sequence``, ``Graph``, ``OneOf``, and spaces
of one's own, subclasses of ``gymnasium.spaces.Space``) become
``NonTensor`` specs whose values are gymnasium's own (a tuple, a ``GraphInstance``, an
``(index, value)`` pair); a ``Box`` of booleans becomes a boolean ``Categorical`` and a
multi-dimensional ``MultiDiscrete`` an integer ``Bounded``. Those specs keep the space itself
(``_meta["gym_space"]``), which :func:`to_gym_space` gives back.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from aenv.exceptions import SpecError

from ._base import TensorSpec
from ._composite import Composite
from ._discrete import Categorical, OneHot
from ._leaves import Binary, Bounded, NonTensor, Unbounded
from ._multi import MultiCategorical, MultiOneHot
from ._shape import DEVICE_TYPING, np_dtype, parse_shape, torch_dtype

__all__ = ["from_gym_space", "to_gym_space"]


def from_gym_space(
    space: Any,
    *,
    device: DEVICE_TYPING = None,
    categorical_action_encoding: bool = False,
    batch_size: Any = (),
) -> TensorSpec:
    """The spec of a gymnasium space, with ``batch_size`` prepended to its shape.

    Box gives Bounded (Unbounded when both bounds are infinite everywhere); Discrete gives
    OneHot (Categorical with ``categorical_action_encoding``); MultiDiscrete gives MultiOneHot
    (MultiCategorical); MultiBinary gives Binary; Dict gives Composite; Tuple gives a Composite
    with keys ``"0"``, ``"1"``, ...; Text gives NonTensor (``example_data=""``).

    Example:
        >>> import gymnasium as gym
        >>> from aenv.specs import from_gym_space, to_gym_space
        >>> space = gym.spaces.Box(-1.0, 1.0, shape=(3,))
        >>> spec = from_gym_space(space, batch_size=(2,))
        >>> spec.shape
        torch.Size([2, 3])
        >>> to_gym_space(from_gym_space(space)) == space
        True
    """
    from gymnasium import spaces

    batch = parse_shape(batch_size)
    cat = categorical_action_encoding
    spec: TensorSpec
    if isinstance(space, spaces.Box) and np.dtype(space.dtype) != np.bool_:
        dtype = torch_dtype(space.dtype)
        low, high = np.asarray(space.low), np.asarray(space.high)
        if (
            np.issubdtype(low.dtype, np.floating)
            and np.isneginf(low).all()
            and np.isposinf(high).all()
        ):
            spec = Unbounded(shape=space.shape, device=device, dtype=dtype)
        else:
            spec = Bounded(
                torch.as_tensor(low.copy()),
                torch.as_tensor(high.copy()),
                space.shape,
                device,
                dtype,
            )
    elif isinstance(space, spaces.Box) and np.dtype(space.dtype) == np.bool_:
        # Bounded has no boolean dtype: a two-valued Categorical holds the same values
        spec = Categorical(2, space.shape, device, torch.bool)
        spec._meta["gym_space"] = space
    elif isinstance(space, (spaces.Sequence, spaces.Graph, spaces.OneOf)):
        # variable-sized values: carried as they are, as non-tensor data
        spec = NonTensor(shape=(), device=device, example_data=None)
        spec._meta["gym_space"] = space
    elif isinstance(space, spaces.Discrete):
        dtype = torch_dtype(space.dtype)
        n = int(space.n)
        spec = Categorical(n, (), device, dtype) if cat else OneHot(n, (n,), device, dtype)
        spec._meta.update(gym_start=int(space.start), gym_dtype=space.dtype)
    elif isinstance(space, spaces.MultiDiscrete):
        nvec = np.asarray(space.nvec)
        dtype = torch_dtype(space.dtype)
        if nvec.ndim != 1:
            # MultiCategorical's nvec is one row: a grid of values is an integer box
            low = np.asarray(space.start, dtype=np.int64)
            high = low + nvec.astype(np.int64) - 1
            spec = Bounded(torch.as_tensor(low), torch.as_tensor(high), nvec.shape, device, dtype)
            spec._meta["gym_space"] = space
            return spec.expand(*batch, *spec.shape) if batch else spec
        spec = (
            MultiCategorical(nvec, None, device, dtype)
            if cat
            else MultiOneHot(nvec, None, device, torch.int64)
        )
        spec._meta.update(gym_start=np.asarray(space.start).tolist(), gym_dtype=space.dtype)
    elif isinstance(space, spaces.MultiBinary):
        shape = parse_shape(space.n)
        spec = Binary(shape[-1], shape, device, torch_dtype(space.dtype))
    elif isinstance(space, (spaces.Dict, spaces.Tuple)):
        subs = space.spaces if isinstance(space, spaces.Dict) else dict(enumerate(space.spaces))
        spec = Composite(
            {
                str(k): from_gym_space(v, device=device, categorical_action_encoding=cat)
                for k, v in subs.items()
            },
            device=device,
        )
        if isinstance(space, spaces.Tuple):
            spec._meta["gym_tuple"] = True
    elif isinstance(space, spaces.Text):
        spec = NonTensor(shape=(), device=device, example_data="")
        spec._meta["gym_text"] = {
            "max_length": space.max_length,
            "min_length": space.min_length,
            "charset": space.character_set,
        }
    elif isinstance(space, spaces.Space):
        # a space of its own (a user's subclass): its values carried as they are
        spec = NonTensor(shape=(), device=device, example_data=None)
        spec._meta["gym_space"] = space
    else:
        raise SpecError(f"no spec for gymnasium space {type(space).__name__}")
    if batch:
        spec = spec.expand(*batch, *spec.shape)
    return spec


def to_gym_space(spec: TensorSpec) -> Any:
    """The gymnasium space of a spec (the inverse of :func:`from_gym_space`).

    Batched discrete specs give MultiDiscrete spaces covering every element.
    """
    from gymnasium import spaces

    meta = spec._meta
    kept = meta.get("gym_space")
    if kept is not None:
        return _batched_kept(kept, spec)
    if isinstance(spec, Composite):
        if spec.__class__ is not Composite:
            raise SpecError(f"{type(spec).__name__} has no gymnasium space")
        if meta.get("gym_tuple"):
            return spaces.Tuple([to_gym_space(spec[str(i)]) for i in range(len(spec))])
        return spaces.Dict([(k, to_gym_space(v)) for k, v in spec.items()])
    if isinstance(spec, Bounded):
        return spaces.Box(
            spec.low.cpu().numpy(),
            spec.high.cpu().numpy(),
            tuple(spec.shape),
            np_dtype(spec.dtype),
        )
    if isinstance(spec, Unbounded):
        dtype = np_dtype(spec.dtype)
        if spec.dtype.is_floating_point:
            low, high = -np.inf, np.inf
        else:
            info = np.iinfo(dtype)
            low, high = info.min, info.max
        return spaces.Box(low, high, tuple(spec.shape), dtype)
    gym_dtype = meta.get("gym_dtype", np.int64)
    if isinstance(spec, (Categorical, OneHot)):
        batch = spec.shape if isinstance(spec, Categorical) else spec.shape[:-1]
        start = meta.get("gym_start", 0)
        if not batch:
            return spaces.Discrete(spec.n, start=start, dtype=gym_dtype)
        return spaces.MultiDiscrete(np.full(tuple(batch), spec.n), dtype=gym_dtype)
    if isinstance(spec, (MultiCategorical, MultiOneHot)):
        lead = tuple(spec.shape[:-1])
        nvec = np.asarray(spec.nvec.tolist())
        start = meta.get("gym_start")
        if lead:
            nvec = np.broadcast_to(nvec, (*lead, len(nvec))).copy()
            start = None
        return spaces.MultiDiscrete(nvec, dtype=gym_dtype, start=start)
    if isinstance(spec, Binary):
        n = spec.n if spec.ndim == 1 else tuple(spec.shape)
        return spaces.MultiBinary(n)
    if isinstance(spec, NonTensor):
        text = meta.get("gym_text")
        if text is not None:
            return spaces.Text(
                text["max_length"], min_length=text["min_length"], charset=text["charset"]
            )
        if isinstance(spec.example_data, str):
            import string

            return spaces.Text(4096, min_length=0, charset=string.printable)
        raise SpecError("only text NonTensor specs have a gymnasium space (Text)")
    raise SpecError(f"{type(spec).__name__} has no gymnasium space")


def _batched_kept(space: Any, spec: TensorSpec) -> Any:
    """A kept space, batched (as gymnasium's ``batch_space`` does) over the spec's leading
    dims."""
    from gymnasium.vector.utils import batch_space

    own = () if isinstance(spec, NonTensor) else tuple(space.shape or ())
    lead = tuple(spec.shape)[: spec.ndim - len(own)]
    for n in reversed(lead):
        space = batch_space(space, n)
    return space
