"""I/O-free helpers of the collectors: trajectory splitting, policy wrapping, interruption.

Nothing here awaits: both collection modes (lockstep and streaming) and the sync facade call
these plain functions.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase

from aenv._mdp import NestedKey, time_named, unravel
from aenv.envs._policy import is_async_policy, make_policy

__all__ = [
    "Interruptor",
    "TrajCounter",
    "is_async_policy",
    "make_policy",
    "split_trajectories",
]


class Interruptor:
    """Lets other code stop a collector's batch early (the seeds' ``_Interruptor``).

    While stopped, a collector ends the batch it is filling at once and returns the frames
    gathered so far (a shorter batch). Thread-safe: a trainer thread may stop collection.

    Example:
        >>> interruptor = Interruptor()
        >>> collector = Collector(env, policy, frames_per_batch=100, interruptor=interruptor)
        >>> interruptor.stop_collection()   # the next batch stops at once
        >>> interruptor.start_collection()
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stopped = False

    def start_collection(self) -> None:
        """Let collection run to full batches again."""
        with self._lock:
            self._stopped = False

    def stop_collection(self) -> None:
        """Make collectors end their current batch early."""
        with self._lock:
            self._stopped = True

    def collection_stopped(self) -> bool:
        """Whether :meth:`stop_collection` was called (and not undone)."""
        with self._lock:
            return self._stopped


class TrajCounter:
    """Hands out unique trajectory ids (0, 1, 2, ...) across batches and resets."""

    def __init__(self, start: int = 0) -> None:
        self.next_id = start

    def take(self, n: int) -> torch.Tensor:
        """``n`` fresh ids."""
        out = torch.arange(self.next_id, self.next_id + n, dtype=torch.int64)
        self.next_id += n
        return out


def compile_policy_fn(
    policy: Callable[..., Any], compile_policy: bool | dict[str, Any] | None
) -> Callable[..., Any]:
    """``torch.compile`` the policy when asked (``True`` or a dict of compile kwargs)."""
    if not compile_policy:
        return policy
    kwargs = compile_policy if isinstance(compile_policy, dict) else {}
    return torch.compile(policy, **kwargs)  # type: ignore[no-any-return]


def cudagraph_policy_fn(
    policy: Callable[..., Any],
    cudagraph_policy: bool | dict[str, Any] | None,
    device: torch.device | None,
) -> Callable[..., Any]:
    """Wrap the policy in tensordict's ``CudaGraphModule`` where CUDA is there; warn and
    run it eagerly where not (CUDA graphs capture CUDA kernels only)."""
    if not cudagraph_policy:
        return policy
    cuda_ok = torch.cuda.is_available() and (device is None or device.type == "cuda")
    if not cuda_ok:
        where = (
            "no CUDA device is available"
            if not torch.cuda.is_available()
            else (f"the policy runs on {device}")
        )
        warnings.warn(
            f"cudagraph_policy needs a CUDA policy device, but {where}; the policy runs "
            "without CUDA graphs",
            UserWarning,
            stacklevel=3,
        )
        return policy
    from tensordict.nn import CudaGraphModule

    kwargs = cudagraph_policy if isinstance(cudagraph_policy, dict) else {}
    if device is not None:
        kwargs = {"device": device, **kwargs}
    return CudaGraphModule(policy, **kwargs)  # type: ignore[arg-type]


# ---------------------------------------------------------------------- trajectories
def _ids_from_done(td: TensorDictBase, done_key: NestedKey) -> torch.Tensor:
    """Trajectory ids from done flags along the last (time) dim: a new id after each done."""
    done = td.get(("next", *unravel(done_key)))
    done = done.reshape(*td.batch_size, -1).any(-1)
    starts = torch.zeros_like(done)
    starts[..., 1:] = done[..., :-1]
    starts = starts.reshape(-1, td.batch_size[-1])
    starts[:, 0] = True  # every env's (or row's) first frame opens a trajectory
    return starts.reshape(-1).cumsum(0).reshape(td.batch_size) - 1


def split_trajectories(
    tensordict: TensorDictBase,
    prefix: str | None = None,
    *,
    trajectory_key: NestedKey | None = None,
    done_key: NestedKey | None = None,
    as_nested: bool | torch.layout = False,
) -> TensorDictBase:
    """Regroup collected frames into one row per trajectory, padded with zeros.

    Frames are grouped by trajectory id (``(prefix, "traj_ids")``, prefix ``"collector"``
    by default); when ids are missing they are computed from ``("next", done_key)`` along
    the last (time) dim. A ``[*env_dims, time]`` batch is read env by env; a flat streamed
    batch in arrival order (each env's frames stay in order). The output has batch size
    ``[n_trajectories, longest]``, its last dim named ``"time"``, rows sorted by
    trajectory id, and a boolean ``(prefix, "mask")`` entry that is True on real frames.

    With ``as_nested`` (True, or a ``torch.layout`` such as ``torch.jagged``) every entry
    is a nested tensor of the trajectories, unpadded, batch size ``[n_trajectories]``;
    ``out.to_padded_tensor()`` pads it back (the mask then comes back too).

    Example:
        >>> out = split_trajectories(batch)
        >>> out[("collector", "mask")].sum(-1)   # each trajectory's length
        tensor([5, 5, 3])
    """
    prefix = prefix or "collector"
    traj_key: NestedKey = trajectory_key if trajectory_key is not None else (prefix, "traj_ids")
    td = tensordict
    if td.batch_dims == 0:
        raise ValueError("split_trajectories needs at least one batch dim")
    if td._has_names():  # names get in the way of reshaping; the output gets its own
        td = td.copy()
        td.names = None  # type: ignore[assignment]
    ids = td.get(traj_key, None)
    if ids is None:
        ids = _ids_from_done(td, done_key or "done")
        td = td.copy()
        td.set(traj_key, ids)
    ids = ids.reshape(*td.batch_size, -1)[..., 0] if ids.ndim > td.batch_dims else ids
    flat = td.reshape(-1)
    ids = ids.reshape(-1)
    uniq, inverse = torch.unique(ids, return_inverse=True)
    counts = torch.bincount(inverse, minlength=uniq.numel())
    order = torch.argsort(inverse, stable=True)
    rows = inverse[order]
    starts = counts.cumsum(0) - counts
    cols = torch.arange(ids.numel()) - starts[rows]
    n_traj, longest = uniq.numel(), int(counts.max())
    if as_nested is not False:
        layout = torch.strided if as_nested is True else as_nested
        ordered = flat[order]
        ordered.set((prefix, "mask"), torch.ones(ids.numel(), dtype=torch.bool, device=ids.device))
        pieces = ordered.split(counts.tolist(), 0)
        with warnings.catch_warnings():  # torch's "prototype stage" note on strided nesting
            warnings.filterwarnings("ignore", "The PyTorch API of nested tensors")
            return TensorDict.lazy_stack(list(pieces), 0).densify(layout=layout)
    out: TensorDictBase = torch.zeros_like(flat[:1]).expand(n_traj, longest).clone()  # type: ignore[assignment]
    out[rows, cols] = flat[order]
    mask = torch.zeros(n_traj, longest, dtype=torch.bool, device=ids.device)
    mask[rows, cols] = True
    out.set((prefix, "mask"), mask)
    return time_named(out)
