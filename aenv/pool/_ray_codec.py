"""How the Ray backend packs operations' payloads and results (see :mod:`aenv.pool._ray`).

A streamed step carries one env's TensorDict each way: a handful of small tensors
(observation, action, reward, done flags) at the top level. :mod:`aenv.pool._codec` packs
any TensorDict (nested ones, non-tensor entries, big arrays apart), at ~30 us to encode
and ~30 us to decode one of six leaves here, checking each tensor's properties and
building an object per level. Such a flat TensorDict of CPU tensors goes instead as
:class:`_Flat`: its keys, dtypes and shapes and all its leaves' bytes joined in one
``bytes`` (one copy out, one copy back into a buffer the rebuilt tensors share), with no
pickle of its own: the frame that carries it pickles it with the rest (a third of the
cost both ways). Everything else takes :mod:`aenv.pool._codec`'s path, or goes as it is.
"""

from __future__ import annotations

import operator
import pickle
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from aenv.pool._codec import BIG_BYTES, decode, encode

__all__ = ["FlatRows", "pack", "unpack"]

#: torch dtypes by a short code (and back): what numpy can view, without bfloat16 and the
#: like (``Tensor.numpy`` refuses those, and they take the general path)
_DTYPES: tuple[torch.dtype, ...] = (
    torch.float32,
    torch.float64,
    torch.float16,
    torch.int64,
    torch.int32,
    torch.int16,
    torch.int8,
    torch.uint8,
    torch.bool,
    torch.complex64,
    torch.complex128,
)
_CODE_OF = {dtype: code for code, dtype in enumerate(_DTYPES)}
_NUMPY = tuple(torch.empty(0, dtype=dtype).numpy().dtype for dtype in _DTYPES)
#: TensorDicts a ``views`` cache of :func:`_flat` keeps (an actor's rows: next and reset)
_VIEWS_KEPT = 4


class _Flat:
    """A flat TensorDict of CPU tensors: batch size, device, keys, dtype codes, shapes and
    the leaves' bytes, joined in order."""

    __slots__ = ("batch_size", "blob", "codes", "device", "keys", "shapes")

    def __init__(
        self,
        batch_size: tuple[int, ...],
        device: str | None,
        keys: tuple[str, ...],
        codes: tuple[int, ...],
        shapes: tuple[tuple[int, ...], ...],
        blob: bytes,
    ) -> None:
        self.batch_size = batch_size
        self.device = device
        self.keys = keys
        self.codes = codes
        self.shapes = shapes
        self.blob = blob

    def __reduce__(self) -> tuple[Any, ...]:
        return _Flat, (
            self.batch_size,
            self.device,
            self.keys,
            self.codes,
            self.shapes,
            self.blob,
        )


def _flat(td: TensorDict, views: dict[int, Any] | None = None) -> _Flat | None:
    """``td`` as a :class:`_Flat`, or None where it is not one (a nested or non-tensor
    entry, a tensor numpy cannot view, a big leaf).

    ``views``: the caller's cache for TensorDicts it packs again and again (an actor's
    rows): what was read of ``td`` (its leaves' numpy views, codes and shapes) is kept
    there, by identity, and taken again while ``td`` holds the same tensors under the same
    keys, so that only the bytes are read."""
    leaves = td._tensordict
    seen = None if views is None else views.get(id(td))
    if (
        seen is not None  # (held there, ``td`` keeps its id)
        and len(seen[1]) == len(leaves)
        and all(map(operator.is_, leaves.values(), seen[1]))
        and seen[2] == tuple(leaves)
    ):
        _, _, keys, batch, device_name, codes_t, shapes_t, arrays = seen
    else:
        device = td.device
        if device is not None and device.type != "cpu":
            return None
        codes: list[int] = []
        shapes: list[tuple[int, ...]] = []
        arrays = []  # (numpy arrays: buffers bytes.join takes)
        for value in leaves.values():
            if type(value) is not torch.Tensor:
                return None
            code = _CODE_OF.get(value.dtype)
            if code is None:
                return None
            try:
                # (refuses a tensor that requires grad, lives elsewhere, or has a lazy conj
                # or neg bit: those take the general path)
                array = value.numpy()
            except (RuntimeError, TypeError):
                return None
            codes.append(code)
            shapes.append(array.shape)
            arrays.append(array)
        keys, batch = tuple(leaves), tuple(td.batch_size)
        device_name = None if device is None else "cpu"
        codes_t, shapes_t = tuple(codes), tuple(shapes)
        if views is not None:
            if len(views) >= _VIEWS_KEPT:
                del views[next(iter(views))]  # (the oldest)
            views[id(td)] = (
                td,
                tuple(leaves.values()),
                keys,
                batch,
                device_name,
                codes_t,
                shapes_t,
                arrays,
            )
    try:
        blob = b"".join(arrays)
    except TypeError:  # a strided view (not a contiguous buffer): one contiguous copy each
        blob = b"".join([np.ascontiguousarray(a) for a in arrays])  # type: ignore[misc]
    if len(blob) >= BIG_BYTES:
        return None  # (the general path sends big arrays apart, through Ray's store)
    return _Flat(batch, device_name, keys, codes_t, shapes_t, blob)


def _unflat(flat: _Flat, rows: tuple[int, int] | None = None) -> TensorDict:
    """The TensorDict ``flat`` holds, or with ``rows=(lo, n)`` its rows ``lo:lo+n`` along
    the first dim (views of them: no TensorDict of the whole, no indexing of one)."""
    buffer = bytearray(flat.blob)  # (writable memory the tensors own)
    source: dict[str, torch.Tensor] = {}
    offset = 0
    for key, code, shape in zip(flat.keys, flat.codes, flat.shapes):
        dtype = _NUMPY[code]
        # (numpy's view then torch.from_numpy: a third of torch.frombuffer's cost here;
        # a 1-D leaf, most of a step's, is the view as it comes: a reshape cost ~0.5 us)
        if len(shape) == 1:
            count = shape[0]
            array = np.frombuffer(buffer, dtype, count, offset)
        else:
            count = 1
            for size in shape:
                count *= size
            array = np.frombuffer(buffer, dtype, count, offset).reshape(shape)
        if rows is not None:
            array = array[rows[0] : rows[0] + rows[1]]
        source[key] = torch.from_numpy(array)
        offset += count * dtype.itemsize
    device = None if flat.device is None else torch.device(flat.device)
    batch = flat.batch_size if rows is None else (rows[1], *flat.batch_size[1:])
    # fresh tensors of the shapes they were packed with: nothing for the checking
    # constructor to check
    return TensorDict._new_unsafe(source, batch, device, nested=False)  # type: ignore[arg-type]


_PLAIN = frozenset((type(None), bool, int, float, str))


def _plain(item: Any) -> bool:
    """A value with no TensorDict in it: a scalar, or a list of flags."""
    kind = type(item)
    return kind in _PLAIN or (kind is list and all(type(x) is bool for x in item))


class FlatRows:
    """Preallocated stacked rows that flat parts (:class:`_Flat` s, as :func:`pack` made
    them: the actors' answers to a whole-batch step) land in, one after the other along the
    first dim, each leaf copied once from the part's bytes (no TensorDict, no array made per
    part or step). The Ray driver keeps one per bank and kind of rows and hands :attr:`td`
    out as the backend's own rows (``Stacked.owned`` False).

    Build it with :meth:`plan`; :meth:`land` writes parts in (None where they do not fit).
    """

    __slots__ = ("codes", "device", "flat", "keys", "rest", "td", "trailing", "widths")

    def __init__(self, first: _Flat, total: int) -> None:
        self.keys, self.codes, self.device = first.keys, first.codes, first.device
        self.rest = first.batch_size[1:]
        self.trailing = tuple(shape[1:] for shape in first.shapes)
        source: dict[str, torch.Tensor] = {}
        flat: list[np.ndarray] = []
        for key, code, trailing in zip(self.keys, self.codes, self.trailing):
            array = np.zeros((total, *trailing), dtype=_NUMPY[code])
            source[key] = torch.from_numpy(array)
            flat.append(array.reshape(-1))
        self.flat = flat
        self.widths = tuple(array.size // total if total else 0 for array in flat)
        device = None if self.device is None else torch.device(self.device)
        self.td = TensorDict._new_unsafe(source, (total, *self.rest), device, nested=False)  # type: ignore[arg-type]

    @classmethod
    def plan(cls, parts: Sequence[Any], total: int) -> FlatRows | None:
        """Rows for ``total`` envs shaped as the flat parts ``parts`` (None ones left
        out), or None where some part is not a flat TensorDict with a first dim."""
        first = next((p for p in parts if p is not None), None)
        if type(first) is not _Flat or not first.batch_size:
            return None
        return cls(first, total)

    def land(self, parts: Sequence[Any], sizes: Sequence[int]) -> TensorDict | None:
        """Copy ``parts`` in: part ``j`` fills the next ``sizes[j]`` rows (a None part
        leaves its rows as they were). Returns :attr:`td`, or None, with nothing written,
        when some part is not of these rows' structure."""
        keys, codes, device, rest, trailing = (
            self.keys,
            self.codes,
            self.device,
            self.rest,
            self.trailing,
        )
        for part, size in zip(parts, sizes):
            if part is None:
                continue
            if (
                type(part) is not _Flat
                or part.keys != keys
                or part.codes != codes
                or part.device != device
                or part.batch_size != (size, *rest)
                or any(shape[1:] != t for shape, t in zip(part.shapes, trailing))
            ):
                return None
        lo = 0
        for part, size in zip(parts, sizes):
            if part is not None:
                blob, offset = part.blob, 0
                for dst, width in zip(self.flat, self.widths):  # (width: elements per env)
                    count = size * width
                    dst[lo * width : lo * width + count] = np.frombuffer(
                        blob, dst.dtype, count, offset
                    )
                    offset += count * dst.itemsize
            lo += size
        return self.td


def pack(obj: Any, views: dict[int, Any] | None = None) -> tuple[Any, ...]:
    """An operation's payload or result, ready for the wire or a Ray call.

    A flat TensorDict of CPU tensors, alone or in a tuple or list, as ``("f", obj)`` with
    each such TensorDict a :class:`_Flat`; other TensorDicts (also inside tuples and lists)
    as plain data (:mod:`aenv.pool._codec`) in one pickle, ``("p", bytes, big arrays)``,
    the arrays of :data:`~aenv.pool._codec.BIG_BYTES` or more apart (Ray serialises them
    out of band, through its shared-memory object store); anything else as it is
    (``("o", obj)``: pickled with the frame or by Ray, with cloudpickle where it must).

    ``views``: a cache for TensorDicts packed again and again (see :func:`_flat`)."""
    kind = type(obj)
    if kind is TensorDict:
        flat: Any = _flat(obj, views)
        if flat is not None:
            return "f", flat
    elif (kind is tuple or kind is list) and obj:
        # (a step-and-maybe-reset's two TensorDicts, a reset's optional one, a whole-batch
        # answer's tag, rows and reset flags): flat where every TensorDict in it is and the
        # rest is plain
        items = []
        for item in obj:
            if type(item) is TensorDict:
                item = _flat(item, views)
                if item is None:
                    break
            elif not _plain(item):
                break
            items.append(item)
        else:
            if any(type(item) is _Flat for item in items):
                return "f", items if kind is list else tuple(items)
    big: list[np.ndarray] = []
    try:
        return "p", pickle.dumps(encode(obj, big), protocol=5), big
    except Exception:  # (Unpackable, or something plain pickle cannot take)
        return "o", obj


def unpack(packed: tuple[Any, ...], rows: tuple[int, int] | None = None) -> Any:
    """The object :func:`pack` packed; with ``rows=(lo, n)``, of a packed TensorDict with
    a first dim, only its rows ``lo:lo+n`` (as ``unpack(packed)[lo:lo+n]``, without the
    whole TensorDict and its indexing)."""
    tag = packed[0]
    if tag == "f":
        obj = packed[1]
        if type(obj) is _Flat:
            if rows is not None and not obj.batch_size:
                raise ValueError("rows of a TensorDict without a batch dim")
            return _unflat(obj, rows)
        items = [_unflat(item) if type(item) is _Flat else item for item in obj]
        out = items if type(obj) is list else tuple(items)
    elif tag == "p":
        out = decode(pickle.loads(packed[1]), packed[2])
    else:
        out = packed[1]
    if rows is not None:
        if not isinstance(out, TensorDictBase):
            raise ValueError(f"rows of a packed {type(out).__name__}: only a TensorDict has rows")
        return out[rows[0] : rows[0] + rows[1]]
    return out
