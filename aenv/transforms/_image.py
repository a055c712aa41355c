"""Pixel transforms: ToTensorImage, Resize, GrayScale, CenterCrop, Crop.

Images are channels-first ``(..., C, H, W)`` after :class:`ToTensorImage`; any leading dims
(batch, time, stacked frames) are allowed. Everything is plain torch (no torchvision):
resizing is ``torch.nn.functional.interpolate``, crops are slices, grayscale uses the ITU-R
601 luma weights.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from aenv._mdp import NestedKey
from aenv.exceptions import SpecError
from aenv.specs import Bounded, TensorSpec
from aenv.transforms._base import Transform
from aenv.transforms._t2_common import map_leaf, rebound

__all__ = ["CenterCrop", "Crop", "GrayScale", "Resize", "ToTensorImage"]

Keys = Sequence[NestedKey] | NestedKey | None

_LUMA = (0.2989, 0.587, 0.114)
_MODES = ("nearest", "nearest-exact", "bilinear", "bicubic", "area")


def _pixel_keys(keys: Keys) -> Keys:
    return ["pixels"] if keys is None else keys


def _check_image_spec(owner: str, spec: TensorSpec, min_ndim: int = 3) -> None:
    if spec.ndim < min_ndim:
        raise SpecError(
            f"{owner}: expected an image spec of shape (..., C, H, W), got {tuple(spec.shape)}"
        )


def _back_to_dtype(value: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Cast a float result back to an integer image dtype, rounding and clamping."""
    if dtype.is_floating_point:
        return value.to(dtype)
    info = torch.iinfo(dtype)
    return value.round().clamp(info.min, info.max).to(dtype)


class ToTensorImage(Transform):
    """Transforms a numpy-like image ``(..., H, W, C)`` into a pytorch image ``(..., C, H, W)``.

    Integer images (``from_int``) are scaled to ``[0, 1]`` by dividing by 255; the result has
    ``dtype`` (float32 by default) and a ``Bounded(0, 1)`` spec.

    Args:
        from_int: divide by 255; None: when the input is not floating point.
        unsqueeze: insert a size-1 dim before ``C`` (a single-frame "time" dim).
        dtype: output dtype (default float32).
        in_keys: image entries (default ``["pixels"]``); out_keys: where to write (in place).
        shape_tolerant: leave images whose last dim is not 1 or 3 in their layout (already
            channels-first) and only convert their dtype.

    Example:
        >>> env = TransformedEnv(PixelEnv(), ToTensorImage())  # "pixels": uint8 (H, W, 3)
        >>> (await env.reset())["pixels"].dtype
        torch.float32
    """

    def __init__(
        self,
        from_int: bool | None = None,
        unsqueeze: bool = False,
        dtype: torch.dtype | None = None,
        in_keys: Keys = None,
        out_keys: Keys = None,
        shape_tolerant: bool = False,
    ) -> None:
        super().__init__(_pixel_keys(in_keys), out_keys)
        self.from_int = from_int
        self.unsqueeze = unsqueeze
        self.dtype = dtype if dtype is not None else torch.get_default_dtype()
        self.shape_tolerant = shape_tolerant

    def _channels_last(self, shape: Sequence[int]) -> bool:
        return not self.shape_tolerant or shape[-1] in (1, 3)

    def _scale(self, dtype: torch.dtype) -> bool:
        return self.from_int if self.from_int is not None else not dtype.is_floating_point

    def _apply_transform(self, value: torch.Tensor) -> torch.Tensor:
        scale = self._scale(value.dtype)
        if self._channels_last(value.shape):
            value = value.permute(*range(value.ndim - 3), -1, -3, -2)
        value = value.to(self.dtype)
        if scale:
            value = value.div(255)
        if self.unsqueeze:
            value = value.unsqueeze(-4)
        return value.contiguous()

    def _transform_spec(self, spec: TensorSpec) -> TensorSpec:
        _check_image_spec(type(self).__name__, spec)
        shape = list(spec.shape)
        if self._channels_last(shape):
            shape = [*shape[:-3], shape[-1], shape[-3], shape[-2]]
        if self.unsqueeze:
            shape.insert(len(shape) - 3, 1)
        if self._scale(spec.dtype):
            return Bounded(0.0, 1.0, shape=shape, dtype=self.dtype, device=spec.device)
        return rebound(spec, shape, dtype=self.dtype)

    def extra_repr(self) -> str:
        return f"from_int={self.from_int}, dtype={self.dtype}, {super().extra_repr()}"


class Resize(Transform):
    """Resizes a pixel observation ``(..., C, H, W)`` to ``(..., C, w, h)``.

    As in TorchRL, ``w`` is the size of dim -2 and ``h`` the size of the last dim. Integer images are resized
    in float and rounded back to their dtype. Bilinear and bicubic modes antialias when
    shrinking, as torchvision does; their results are clamped to the input's range, so
    outputs stay inside the spec.

    Args:
        w: output size of dim -2 (TorchRL's convention).
        h: output size of the last dim (default ``w``).
        interpolation: ``"bilinear"`` (default), ``"bicubic"``, ``"nearest"``,
            ``"nearest-exact"`` or ``"area"``.
        in_keys: image entries (default ``["pixels"]``); out_keys: where to write (in place).

    Example:
        >>> env = TransformedEnv(PixelEnv(), Compose(ToTensorImage(), Resize(64, 64)))
        >>> (await env.reset())["pixels"].shape
        torch.Size([3, 64, 64])
    """

    def __init__(
        self,
        w: int,
        h: int | None = None,
        interpolation: str = "bilinear",
        in_keys: Keys = None,
        out_keys: Keys = None,
    ) -> None:
        super().__init__(_pixel_keys(in_keys), out_keys)
        self.w = int(w)
        self.h = int(h) if h is not None else self.w
        if self.w <= 0 or self.h <= 0:
            raise ValueError(f"Resize: sizes must be positive, got w={w}, h={h}")
        interpolation = str(getattr(interpolation, "value", interpolation)).lower()
        if interpolation not in _MODES:
            raise ValueError(
                f"Resize: interpolation must be one of {_MODES}, got {interpolation!r}"
            )
        self.interpolation = interpolation

    def _apply_transform(self, value: torch.Tensor) -> torch.Tensor:
        if value.ndim < 3:
            raise ValueError(f"Resize: expected (..., C, H, W), got shape {tuple(value.shape)}")
        lead = value.shape[:-3]
        c, height, width = value.shape[-3:]
        x = value.reshape(-1, c, height, width)
        if not x.is_floating_point():
            x = x.to(torch.float32)
        kwargs: dict[str, object] = {}
        if self.interpolation in ("bilinear", "bicubic"):
            kwargs["align_corners"] = False
            kwargs["antialias"] = self.w < height or self.h < width
        out = F.interpolate(x, size=(self.w, self.h), mode=self.interpolation, **kwargs)  # type: ignore[arg-type]
        if self.interpolation in ("bilinear", "bicubic") and x.numel():
            # bicubic overshoots and antialiased weights round: keep to the input's range
            out = out.clamp(x.min(), x.max())
        out = _back_to_dtype(out, value.dtype)
        return out.reshape(*lead, c, self.w, self.h)

    def _transform_spec(self, spec: TensorSpec) -> TensorSpec:
        _check_image_spec(type(self).__name__, spec)
        return rebound(spec, (*spec.shape[:-2], self.w, self.h))

    def extra_repr(self) -> str:
        return (
            f"w={self.w}, h={self.h}, interpolation={self.interpolation!r}, {super().extra_repr()}"
        )


class GrayScale(Transform):
    """Turns a pixel observation ``(..., 3, H, W)`` to grayscale ``(..., 1, H, W)``.

    Uses the luma weights 0.2989 R + 0.587 G + 0.114 B; integer images keep their dtype.

    Args:
        in_keys: image entries (default ``["pixels"]``); out_keys: where to write (in place).

    Example:
        >>> env = TransformedEnv(PixelEnv(), Compose(ToTensorImage(), GrayScale()))
        >>> (await env.reset())["pixels"].shape[-3]
        1
    """

    def __init__(self, in_keys: Keys = None, out_keys: Keys = None) -> None:
        super().__init__(_pixel_keys(in_keys), out_keys)

    def _apply_transform(self, value: torch.Tensor) -> torch.Tensor:
        if value.ndim < 3 or value.shape[-3] != 3:
            raise ValueError(f"GrayScale: expected (..., 3, H, W), got shape {tuple(value.shape)}")
        x = value if value.is_floating_point() else value.to(torch.float32)
        r, g, b = x.unbind(-3)
        gray = (_LUMA[0] * r + _LUMA[1] * g + _LUMA[2] * b).unsqueeze(-3)
        return _back_to_dtype(gray, value.dtype)

    def _transform_spec(self, spec: TensorSpec) -> TensorSpec:
        _check_image_spec(type(self).__name__, spec)
        if spec.shape[-3] != 3:
            raise SpecError(f"GrayScale: expected 3 channels at dim -3, got {tuple(spec.shape)}")
        return rebound(spec, (*spec.shape[:-3], 1, *spec.shape[-2:]))


class Crop(Transform):
    """Crops the input image ``(..., C, H, W)`` at ``(top, left)`` to ``(..., C, w, h)`` (TorchRL's order).

    Args:
        w: output size of dim -2 (TorchRL's convention).
        h: output size of the last dim (default ``w``).
        top: first row kept (default 0).
        left: first column kept (default 0).
        in_keys: image entries (default ``["pixels"]``); out_keys: where to write (in place).

    Example:
        >>> env = TransformedEnv(PixelEnv(), Compose(ToTensorImage(), Crop(8, 4, top=2)))
        >>> (await env.reset())["pixels"].shape[-2:]
        torch.Size([4, 8])
    """

    def __init__(
        self,
        w: int,
        h: int | None = None,
        top: int = 0,
        left: int = 0,
        in_keys: Keys = None,
        out_keys: Keys = None,
    ) -> None:
        super().__init__(_pixel_keys(in_keys), out_keys)
        self.w = int(w)
        self.h = int(h) if h is not None else self.w
        self.top = int(top)
        self.left = int(left)
        if self.w <= 0 or self.h <= 0 or self.top < 0 or self.left < 0:
            raise ValueError(f"{type(self).__name__}: sizes must be > 0 and offsets >= 0")

    def _origin(self, height: int, width: int) -> tuple[int, int]:
        return self.top, self.left

    def _window(self, height: int, width: int) -> tuple[int, int]:
        top, left = self._origin(height, width)
        if top + self.w > height or left + self.h > width:
            raise ValueError(
                f"{type(self).__name__}: a {self.w}x{self.h} crop at ({top}, {left}) does not fit "
                f"in a {height}x{width} image"
            )
        return top, left

    def _apply_transform(self, value: torch.Tensor) -> torch.Tensor:
        top, left = self._window(value.shape[-2], value.shape[-1])
        return value[..., top : top + self.w, left : left + self.h]

    def _transform_spec(self, spec: TensorSpec) -> TensorSpec:
        _check_image_spec(type(self).__name__, spec, min_ndim=2)
        try:
            top, left = self._window(spec.shape[-2], spec.shape[-1])
        except ValueError as exc:
            raise SpecError(str(exc)) from exc
        shape = (*spec.shape[:-2], self.w, self.h)
        return map_leaf(spec, shape, lambda t: t[..., top : top + self.w, left : left + self.h])

    def extra_repr(self) -> str:
        return f"w={self.w}, h={self.h}, top={self.top}, left={self.left}, {super().extra_repr()}"


class CenterCrop(Crop):
    """Crops the center of an image ``(..., C, H, W)`` to height ``h`` and width ``w``.

    Args:
        w: output size of dim -2 (TorchRL's convention).
        h: output size of the last dim (default ``w``).
        in_keys: image entries (default ``["pixels"]``); out_keys: where to write (in place).

    Example:
        >>> env = TransformedEnv(PixelEnv(), Compose(ToTensorImage(), CenterCrop(8)))
        >>> (await env.reset())["pixels"].shape[-2:]
        torch.Size([8, 8])
    """

    def __init__(
        self, w: int, h: int | None = None, in_keys: Keys = None, out_keys: Keys = None
    ) -> None:
        super().__init__(w, h, 0, 0, in_keys, out_keys)

    def _origin(self, height: int, width: int) -> tuple[int, int]:
        # with an odd margin, the extra row/column is dropped at the bottom/right
        return (height - self.w) // 2, (width - self.h) // 2

    def extra_repr(self) -> str:
        return f"w={self.w}, h={self.h}, {Transform.extra_repr(self)}"
