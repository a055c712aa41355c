"""Small shape, device and dtype helpers shared by every spec module (no spec classes here)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from aenv.exceptions import SpecError

__all__ = [
    "DEVICE_TYPING",
    "SHAPE_TYPING",
    "concrete_shape",
    "has_dynamic",
    "index_shape",
    "norm_dim",
    "parse_shape",
    "shape_matches",
    "to_device",
    "torch_dtype",
]

SHAPE_TYPING = int | Sequence[int] | torch.Size
DEVICE_TYPING = str | int | torch.device | None


def parse_shape(shape: Any) -> torch.Size:
    """Turns an int, a sequence of ints, or a torch.Size into a torch.Size."""
    if shape is None:
        return torch.Size(())
    if isinstance(shape, torch.Size):
        return shape
    if isinstance(shape, (int, np.integer)):
        return torch.Size((int(shape),))
    try:
        out = torch.Size(int(s) for s in shape)
    except (TypeError, ValueError) as exc:
        raise SpecError(f"invalid shape {shape!r}: expected an int or a sequence of ints") from exc
    for s in out:
        if s < -1:
            raise SpecError(f"invalid shape {tuple(out)}: sizes must be >= 0 (or -1 for dynamic)")
    return out


def parse_shape_args(shape: tuple[Any, ...]) -> torch.Size:
    """Accepts ``f(2, 3)`` as well as ``f((2, 3))`` / ``f(torch.Size([2, 3]))``."""
    if len(shape) == 1 and not isinstance(shape[0], (int, np.integer)):
        return parse_shape(shape[0])
    return parse_shape(shape)


def to_device(device: DEVICE_TYPING) -> torch.device | None:
    """Normalises a device argument (``None`` stays ``None``)."""
    if device is None:
        return None
    if isinstance(device, torch.device):
        return device
    if isinstance(device, int):
        return torch.device("cuda", device)
    return torch.device(device)


def np_dtype(dtype: torch.dtype) -> np.dtype:
    """The numpy dtype of a torch dtype."""
    return torch.empty(0, dtype=dtype).numpy().dtype


def torch_dtype(dtype: Any) -> torch.dtype:
    """Turns a torch or numpy dtype (or a numpy type) into a torch dtype."""
    if isinstance(dtype, torch.dtype):
        return dtype
    return torch.from_numpy(np.empty(0, dtype=np.dtype(dtype))).dtype


def has_dynamic(shape: torch.Size) -> bool:
    """Whether a shape has a dynamic (-1) dim."""
    return -1 in shape


def concrete_shape(shape: Sequence[int]) -> torch.Size:
    """The shape with every dynamic (-1) dim replaced by 1 (for bound and mask tensors)."""
    return torch.Size(1 if s == -1 else s for s in shape)


def shape_matches(spec_shape: torch.Size, shape: Sequence[int]) -> bool:
    """Whether ``shape`` fits ``spec_shape``, a -1 in the spec matching any size."""
    if len(spec_shape) != len(shape):
        return False
    return all(s == -1 or s == v for s, v in zip(spec_shape, shape))


def norm_dim(dim: int, ndim: int, *, insert: bool = False) -> int:
    """A non-negative dim (``insert=True`` allows ``ndim`` itself, as unsqueeze does)."""
    top = ndim + 1 if insert else ndim
    out = dim + top if dim < 0 else dim
    if not 0 <= out < top:
        raise SpecError(f"dim {dim} is out of range for {ndim} dims")
    return out


def index_shape(shape: torch.Size, index: Any) -> torch.Size:
    """The shape that indexing a tensor of ``shape`` with ``index`` gives (no real allocation)."""
    probe = torch.zeros(()).expand(concrete_shape(shape))
    out = list(probe[index].shape)
    # keep dynamic dims dynamic where they survive a plain slice(None)
    if has_dynamic(shape):
        idx = index if isinstance(index, tuple) else (index,)
        if all(isinstance(i, (int, slice)) for i in idx):
            pos = 0
            for dim, i in enumerate(idx):
                if isinstance(i, slice):
                    if shape[dim] == -1 and i == slice(None):
                        out[pos] = -1
                    pos += 1
            for dim in range(len(idx), len(shape)):
                if shape[dim] == -1:
                    out[pos] = -1
                pos += 1
    return torch.Size(out)
