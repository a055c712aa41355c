"""Concatenation transforms: CatTensors (several keys into one) and CatFrames (frame stacking)."""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch
from tensordict import TensorDictBase

from aenv._mdp import NestedKey, unravel
from aenv.exceptions import SpecError
from aenv.specs import Bounded, Composite, NonTensor, TensorSpec, Unbounded
from aenv.transforms._base import Transform, _norm_keys
from aenv.transforms._t2_common import check_negative_dim, map_leaf, where_batch

__all__ = ["CatFrames", "CatTensors"]

Keys = Sequence[NestedKey] | NestedKey | None


def _sort_key(key: NestedKey) -> str:
    return key if isinstance(key, str) else ".".join(key)


class CatTensors(Transform):
    """Concatenates several keys in a single tensor.

    Entries are concatenated along ``dim`` into ``out_key`` (and, with ``del_keys``, removed).
    Entries with no dim beyond the batch dims (scalars per element) get a trailing size-1 dim
    first when ``unsqueeze_if_required``. The output spec is ``Bounded`` when every input is
    (bounds concatenated), else ``Unbounded``, with the promoted dtype.

    Args:
        in_keys: entries to concatenate; None: every root-level floating-point observation
            with at most one dim beyond the batch dims, read from the specs when the
            transform joins an env.
        out_key: where to write the result (default ``"observation_vector"``).
        dim: the (negative) dim to concatenate along (default -1).
        del_keys: remove the inputs from the output (default True). Keep them (False) when
            the env reads them back as state, as a stateless env like PendulumEnv does.
        unsqueeze_if_required: add a trailing dim to per-element scalars (default True).
        sort: sort ``in_keys`` by name, so the layout does not depend on their order.

    Example:
        >>> t = CatTensors(["th", "thdot"], "obs", del_keys=False)
        >>> env = TransformedEnv(PendulumEnv(), t)
        >>> (await env.reset())["obs"].shape
        torch.Size([2])
    """

    def __init__(
        self,
        in_keys: Keys = None,
        out_key: NestedKey = "observation_vector",
        dim: int = -1,
        *,
        del_keys: bool = True,
        unsqueeze_if_required: bool = True,
        sort: bool = True,
    ) -> None:
        keys = _norm_keys(in_keys)
        if sort:
            keys = sorted(keys, key=_sort_key)
        super().__init__(keys)
        self.out_keys = [out_key]  # several in_keys, one out_key
        self.dim = check_negative_dim(type(self).__name__, dim)
        self.del_keys = del_keys
        self.unsqueeze_if_required = unsqueeze_if_required
        self.sort = sort

    @property
    def out_key(self) -> NestedKey:
        return self.out_keys[0]

    def _call(self, next_tensordict: TensorDictBase) -> TensorDictBase:
        values = []
        bd = next_tensordict.batch_dims
        for key in self.in_keys:
            value = next_tensordict.get(key, None)
            if value is None:
                raise KeyError(
                    f"CatTensors: {key!r} is missing from the data (keys: "
                    f"{list(next_tensordict.keys(True, True))})"
                )
            # nested entries may sit under extra (agent) dims: count them as batch dims too
            sub_bd = bd
            if isinstance(key, tuple) and len(key) > 1:
                parent = next_tensordict.get(key[:-1])
                sub_bd = parent.batch_dims
            if self.unsqueeze_if_required and value.ndim == sub_bd:
                value = value.unsqueeze(-1)
            values.append(value)
        if not values:
            return next_tensordict
        next_tensordict.set(self.out_key, torch.cat(values, self.dim))
        if self.del_keys:
            out = unravel(self.out_key)
            for key in self.in_keys:
                if unravel(key) != out:
                    next_tensordict.del_(key)
        return next_tensordict

    def _default_keys(self, spec: Composite) -> list[NestedKey]:
        keys = []
        for key, leaf in spec.items():
            if isinstance(leaf, (Composite, NonTensor)) or leaf.dtype is None:
                continue
            if leaf.dtype.is_floating_point and leaf.ndim <= spec.ndim + 1:
                keys.append(key)
        return sorted(keys, key=_sort_key) if self.sort else keys

    def transform_observation_spec(self, observation_spec: Composite) -> Composite:
        if not self.in_keys:
            self.in_keys = self._default_keys(observation_spec)
            if not self.in_keys:
                raise SpecError("CatTensors: no observation to concatenate was found in the specs")
        present = [k for k in self.in_keys if k in observation_spec]
        if not present:
            return observation_spec
        if len(present) != len(self.in_keys):
            missing = [k for k in self.in_keys if k not in observation_spec]
            raise SpecError(f"CatTensors: keys {missing} are not in the observation spec")
        leaves: list[TensorSpec] = []
        for key in self.in_keys:
            leaf = observation_spec[key]
            if isinstance(leaf, (Composite, NonTensor)):
                raise SpecError(f"CatTensors: {key!r} is not a tensor entry")
            batch_nd = observation_spec.ndim
            if isinstance(key, tuple) and len(key) > 1:
                batch_nd = observation_spec[key[:-1]].ndim
            if self.unsqueeze_if_required and leaf.ndim == batch_nd:
                leaf = map_leaf(leaf, (*leaf.shape, 1), lambda t: t.unsqueeze(-1))
            leaves.append(leaf)
        shapes = [list(leaf.shape) for leaf in leaves]
        d = self.dim
        nd = len(shapes[0])
        for s in shapes[1:]:
            if len(s) != nd or any(
                a != b for i, (a, b) in enumerate(zip(s, shapes[0])) if i != nd + d
            ):
                raise SpecError(
                    f"CatTensors: cannot concatenate shapes {[tuple(x) for x in shapes]} along dim {d}"
                )
        shape = list(shapes[0])
        shape[d] = sum(s[d] for s in shapes)
        dtype = functools.reduce(torch.promote_types, [leaf.dtype for leaf in leaves])
        device = leaves[0].device
        out: TensorSpec
        if all(isinstance(leaf, Bounded) for leaf in leaves) and not dtype.is_complex:
            low = torch.cat([leaf.low.to(dtype) for leaf in leaves], d)  # type: ignore[attr-defined]
            high = torch.cat([leaf.high.to(dtype) for leaf in leaves], d)  # type: ignore[attr-defined]
            out = Bounded(low, high, shape=shape, dtype=dtype, device=device)
        else:
            out = Unbounded(shape, device=device, dtype=dtype)
        if self.del_keys:
            for key in self.in_keys:
                del observation_spec[key]
        observation_spec[self.out_key] = out
        return observation_spec

    def transform_reward_spec(self, reward_spec: Composite) -> Composite:
        return reward_spec

    def transform_done_spec(self, done_spec: Composite) -> Composite:
        return done_spec

    def extra_repr(self) -> str:
        return f"in_keys={self.in_keys}, out_key={self.out_key!r}, dim={self.dim}, del_keys={self.del_keys}"


class CatFrames(Transform):
    """Concatenates successive observation frames into a single tensor.

    Keeps the last ``N`` frames of each entry (a buffer per batch element) and outputs them
    concatenated along ``dim``, oldest first. On reset, the buffer of each element being
    reset is filled with the first frame (``padding="same"``) or with ``padding_value``
    followed by that frame (``"constant"``); a partial reset only touches the elements it
    flags. The buffers are module buffers: clones share them and they follow
    ``state_dict``.

    Used as a module on rollout data (``transform(td)``, time as the last batch dim), it
    builds the same stacks from the trajectory itself, restarting at every ``done``.

    Args:
        N: number of frames.
        dim: the (negative) dim to concatenate along, e.g. -3 for ``(C, H, W)`` images.
        in_keys: entries to stack (default ``["pixels"]``); out_keys: where to write (in place).
        padding: ``"same"`` (default) or ``"constant"``.
        padding_value: the fill of ``"constant"`` padding.
        reset_key: the ``"_reset"`` entry to read (default the root one).
        done_key: the done entry marking trajectory ends in rollout data (default ``"done"``).

    Example:
        >>> env = TransformedEnv(CountingEnv(), CatFrames(3, -1, in_keys=["observation"]))
        >>> td = await env.rand_step(await env.reset())
        >>> td["next", "observation"]
        tensor([0., 0., 1.])
    """

    _PADDINGS = ("same", "constant")

    def __init__(
        self,
        N: int,
        dim: int,
        in_keys: Keys = None,
        out_keys: Keys = None,
        padding: str = "same",
        padding_value: float = 0.0,
        *,
        reset_key: NestedKey | None = None,
        done_key: NestedKey | None = None,
    ) -> None:
        super().__init__(["pixels"] if in_keys is None else in_keys, out_keys)
        if int(N) < 1:
            raise ValueError(f"CatFrames: N must be >= 1, got {N}")
        if padding not in self._PADDINGS:
            raise ValueError(f"CatFrames: padding must be one of {self._PADDINGS}, got {padding!r}")
        self.N = int(N)
        self.dim = check_negative_dim(type(self).__name__, dim)
        self.padding = padding
        self.padding_value = padding_value
        self.reset_key: NestedKey = "_reset" if reset_key is None else reset_key
        self.done_key: NestedKey = "done" if done_key is None else done_key
        for i in range(len(self.in_keys)):
            self.register_buffer(f"_frames_{i}", None, persistent=False)

    # ------------------------------------------------------------------ buffers
    def _get_buffer(self, i: int) -> torch.Tensor | None:
        return self._buffers.get(f"_frames_{i}")

    def _set_buffer(self, i: int, value: torch.Tensor) -> None:
        current = self._buffers.get(f"_frames_{i}")
        if current is not None and current.shape == value.shape and current.dtype == value.dtype:
            current.copy_(value)  # in place, so clones sharing the buffer see it
        else:
            self._buffers[f"_frames_{i}"] = value.clone()

    def _padded(self, value: torch.Tensor) -> torch.Tensor:
        if self.padding == "same":
            return torch.cat([value] * self.N, self.dim)
        pad = torch.full_like(value, self.padding_value)
        return torch.cat([pad] * (self.N - 1) + [value], self.dim)

    def _mask(
        self, td: TensorDictBase | None, key: NestedKey, like: torch.Tensor
    ) -> torch.Tensor | None:
        if td is None:
            return None
        mask = td.get(key, None)
        if mask is None:
            return None
        mask = mask.to(torch.bool)
        if mask.ndim > td.batch_dims and mask.shape[-1] == 1:
            mask = mask.squeeze(-1)
        if like.shape[: mask.ndim] != mask.shape:
            raise RuntimeError(
                f"CatFrames: a mask of shape {tuple(mask.shape)} does not match data of shape "
                f"{tuple(like.shape)}"
            )
        return None if bool(mask.all()) else mask

    # ------------------------------------------------------------------ env hooks
    def _reset(
        self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase
    ) -> TensorDictBase:
        for i, (in_key, out_key) in enumerate(zip(self.in_keys, self.out_keys)):
            value = tensordict_reset.get(in_key, None)
            if value is None:
                continue
            fresh = self._padded(value)
            buffer = self._get_buffer(i)
            mask = self._mask(tensordict, self.reset_key, value)
            if mask is None or buffer is None or buffer.shape != fresh.shape:
                self._set_buffer(i, fresh)
            else:
                self._set_buffer(i, where_batch(mask, fresh, buffer))
            tensordict_reset.set(out_key, fresh)
        return tensordict_reset

    def _step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
        for i, (in_key, out_key) in enumerate(zip(self.in_keys, self.out_keys)):
            value = next_tensordict.get(in_key, None)
            if value is None:
                raise KeyError(f"CatFrames: {in_key!r} is missing from the step output")
            buffer = self._get_buffer(i)
            if buffer is None:  # stepped without a reset through this transform
                stacked = self._padded(value)
            else:
                size = value.shape[self.dim]
                expected = list(value.shape)
                expected[self.dim] = size * self.N
                if list(buffer.shape) != expected:
                    raise RuntimeError(
                        f"CatFrames: {in_key!r} has shape {tuple(value.shape)} but the frame buffer "
                        f"holds {tuple(buffer.shape)}; reset the env with this batch size first"
                    )
                older = buffer.narrow(self.dim, size, size * (self.N - 1))
                stacked = torch.cat([older, value], self.dim)
            step_mask = self._mask(tensordict, "_step", value)
            if step_mask is not None and buffer is not None:
                self._set_buffer(i, where_batch(step_mask, stacked, buffer))
            else:
                self._set_buffer(i, stacked)
            next_tensordict.set(out_key, stacked)
        return next_tensordict

    def _call(self, next_tensordict: TensorDictBase) -> TensorDictBase:
        return self._step(next_tensordict.empty(), next_tensordict)

    # ------------------------------------------------------------------ rollout data
    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        """Stack frames over the time dim (the last batch dim) of rollout data; in place.

        Frames before a trajectory's start (the first step, or the step after a
        ``("next", done_key)``) are padded as on reset. Root entries and their ``"next"``
        twins are both stacked (the ``"next"`` stack needs the root entry).
        """
        if tensordict.batch_dims < 1:
            raise ValueError("CatFrames.forward needs data with a time dim (the last batch dim)")
        lead = tensordict.batch_size
        steps = lead[-1]
        done = tensordict.get(("next", *unravel(self.done_key)), None)
        ends = torch.zeros(lead, dtype=torch.bool, device=tensordict.device)
        if done is not None:
            ends = done.reshape(*lead, -1).any(-1)
        boundary = torch.zeros_like(ends)
        boundary[..., 0] = True
        boundary[..., 1:] = ends[..., :-1]
        idx = torch.arange(steps, device=ends.device).expand_as(ends)
        # starts[..., t]: the index of the first step of t's trajectory
        starts = torch.where(boundary, idx, torch.zeros_like(idx)).cummax(-1).values
        for in_key, out_key in zip(self.in_keys, self.out_keys):
            root = tensordict.get(in_key, None)
            if root is None:
                continue
            nxt = tensordict.get(("next", *unravel(in_key)), None)
            frames = [self._frame(root, idx - j, starts) for j in range(self.N - 1, -1, -1)]
            if nxt is not None:
                nframes = [self._frame(root, idx + 1 - j, starts) for j in range(self.N - 1, 0, -1)]
                tensordict.set(("next", *unravel(out_key)), torch.cat([*nframes, nxt], self.dim))
            tensordict.set(out_key, torch.cat(frames, self.dim))
        return tensordict

    def _frame(self, value: torch.Tensor, src: torch.Tensor, starts: torch.Tensor) -> torch.Tensor:
        """``value`` at time ``src`` (per element), padded where ``src`` precedes the start."""
        t_dim = src.ndim - 1
        gather = torch.maximum(src, starts)
        gather = gather.reshape(*gather.shape, *([1] * (value.ndim - src.ndim))).expand_as(value)
        frame = value.gather(t_dim, gather)
        if self.padding == "constant":
            frame = where_batch(src >= starts, frame, torch.full_like(frame, self.padding_value))
        return frame

    def _transform_spec(self, spec: TensorSpec) -> TensorSpec:
        d = self.dim + spec.ndim
        if not 0 <= d < spec.ndim:
            raise SpecError(
                f"CatFrames: dim {self.dim} is out of range for shape {tuple(spec.shape)}"
            )
        shape = list(spec.shape)
        shape[d] *= self.N
        return map_leaf(spec, shape, lambda t: torch.cat([t] * self.N, d))

    def extra_repr(self) -> str:
        return f"N={self.N}, dim={self.dim}, padding={self.padding!r}, {super().extra_repr()}"
