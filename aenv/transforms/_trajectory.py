"""Transforms of collected trajectories (replay-buffer style, not env steps): BurnInTransform,
RandomCropTensorDict and Reward2GoTransform.

Each works on a tensordict whose last batch dim is time (a rollout, a collector batch);
appended to an env they refuse to run, since an env step has no time dim to work along.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from tensordict import TensorDictBase

from aenv._mdp import NestedKey, unravel
from aenv.transforms._base import Transform, _norm_keys

__all__ = ["BurnInTransform", "RandomCropTensorDict", "Reward2GoTransform"]


class _TrajectoryTransform(Transform):
    """Refuses env hooks: these transforms need the time dim of whole trajectories."""

    def _not_on_env(self) -> None:
        raise RuntimeError(
            f"{type(self).__name__} works on trajectories (call it on a rollout or a "
            "collector batch, e.g. as a replay buffer transform), not inside an env"
        )

    def transform_output_spec(self, output_spec: Any) -> Any:
        # only an env asks for specs: refuse it when the transform is appended
        self._not_on_env()

    def _step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> Any:
        self._not_on_env()

    def _reset(self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase) -> Any:
        self._not_on_env()


class Reward2GoTransform(_TrajectoryTransform):
    """Writes the discounted reward-to-go of each step of a trajectory batch.

    ``out[t] = reward[t] + gamma * out[t + 1]``, restarting after each step whose
    ``done_key`` is set (time is the last batch dim). Called forward (``t(data)``) or as an
    inverse (``t.inv(data)``, what a replay buffer applies on ``extend``).

    Args:
        gamma: discount factor.
        in_keys: rewards (default ``[("next", "reward")]``).
        out_keys: reward-to-go entries (default ``[("next", "reward_to_go")]``).
        done_key: the episode-end flag (default ``("next", "done")``).

    Example:
        >>> t = Reward2GoTransform(gamma=0.5)
        >>> data = await CountingEnv(max_steps=3).rollout(3)
        >>> t(data)["next", "reward_to_go"].squeeze(-1)
        tensor([1.7500, 1.5000, 1.0000])
    """

    def __init__(
        self,
        gamma: float = 1.0,
        in_keys: Sequence[NestedKey] | NestedKey | None = None,
        out_keys: Sequence[NestedKey] | NestedKey | None = None,
        done_key: NestedKey = ("next", "done"),
    ) -> None:
        in_keys = in_keys if in_keys is not None else [("next", "reward")]
        if out_keys is None:
            out_keys = [(*unravel(k)[:-1], "reward_to_go") for k in _norm_keys(in_keys)]
        super().__init__(in_keys=in_keys, out_keys=out_keys)
        self.gamma = float(gamma)
        self.done_key = done_key

    def _call(self, tensordict: TensorDictBase) -> TensorDictBase:
        done = tensordict.get(self.done_key, None)
        for in_key, out_key in zip(self.in_keys, self.out_keys):
            reward = tensordict.get(in_key, None)
            if reward is None:
                raise KeyError(f"Reward2GoTransform: {in_key!r} is missing from the data")
            tensordict.set(out_key, self._reward_to_go(reward, done, tensordict.batch_dims))
        return tensordict

    def _reward_to_go(
        self, reward: torch.Tensor, done: torch.Tensor | None, batch_dims: int
    ) -> torch.Tensor:
        if batch_dims < 1:
            raise ValueError("Reward2GoTransform needs data with a time dim (the last batch dim)")
        time = batch_dims - 1
        r = reward.movedim(time, 0)
        cont = torch.ones_like(r, dtype=torch.bool)
        if done is not None:
            cont = ~done.movedim(time, 0).to(torch.bool).expand_as(r)
        out = torch.empty_like(r)
        running = torch.zeros_like(r[0])
        for t in range(r.shape[0] - 1, -1, -1):
            running = r[t] + self.gamma * running * cont[t]
            out[t] = running
        return out.movedim(0, time)

    # the same both ways, in place (a replay buffer's extend applies the inverse)
    _inv_call = _call

    def inv(self, tensordict: TensorDictBase) -> TensorDictBase:
        return self._call(tensordict)


class RandomCropTensorDict(_TrajectoryTransform):
    """Crops a random window of ``sub_seq_len`` steps from each trajectory of a batch.

    Along ``sample_dim`` (default: the last batch dim, time), each element of the other batch
    dims gets its own random start. With ``mask_key`` (a bool entry marking the valid steps
    of padded trajectories), windows are drawn inside the valid steps.

    Args:
        sub_seq_len: the window's length.
        sample_dim: the time dim (a batch dim).
        mask_key: optional validity mask, shape of the batch.

    Example:
        >>> data = TensorDict({"t": torch.arange(10).expand(4, 10)}, [4, 10])
        >>> out = RandomCropTensorDict(3)(data)
        >>> out.batch_size, bool((out["t"][:, 1:] - out["t"][:, :-1] == 1).all())
        (torch.Size([4, 3]), True)
    """

    def __init__(
        self, sub_seq_len: int, sample_dim: int = -1, mask_key: NestedKey | None = None
    ) -> None:
        super().__init__()
        if sub_seq_len < 1:
            raise ValueError(f"sub_seq_len must be >= 1, got {sub_seq_len}")
        self.sub_seq_len = sub_seq_len
        self.sample_dim = sample_dim
        self.mask_key = mask_key

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        dim = self.sample_dim % tensordict.batch_dims if tensordict.batch_dims else 0
        if not tensordict.batch_dims:
            raise ValueError("RandomCropTensorDict needs data with batch dims")
        data = tensordict.transpose(dim, -1) if dim != tensordict.batch_dims - 1 else tensordict
        length = data.batch_size[-1]
        outer = data.batch_size[:-1]
        if self.mask_key is not None:
            mask = data.get(self.mask_key).reshape(*outer, length).to(torch.bool)
            valid = mask.sum(-1)
            first = mask.to(torch.int8).argmax(-1)
        else:
            valid = torch.full(outer, length, dtype=torch.int64)
            first = torch.zeros(outer, dtype=torch.int64)
        if bool((valid < self.sub_seq_len).any()):
            raise ValueError(
                f"RandomCropTensorDict: a trajectory has {int(valid.min())} (valid) steps, "
                f"fewer than sub_seq_len={self.sub_seq_len}"
            )
        span = (valid - self.sub_seq_len + 1).to(torch.float32)
        start = first + (torch.rand(outer) * span).floor().to(torch.int64)
        index = start.unsqueeze(-1) + torch.arange(self.sub_seq_len)
        flat = data.reshape(-1, length)
        rows = torch.arange(flat.batch_size[0]).unsqueeze(-1)
        out = flat[rows, index.reshape(-1, self.sub_seq_len)]
        out = out.reshape(*outer, self.sub_seq_len)
        return out.transpose(dim, -1) if dim != tensordict.batch_dims - 1 else out

    def _call(self, tensordict: TensorDictBase) -> TensorDictBase:
        return self.forward(tensordict)


class BurnInTransform(_TrajectoryTransform):
    """Burns in the recurrent state of sequences: runs ``modules`` over the first ``burn_in``
    steps (without gradients) and returns the remaining steps, whose first step carries the
    state those steps produced.

    Each module is a TensorDict module (e.g. ``TensorDictModule`` around a GRU cell) that
    reads a step and writes its next recurrent state under ``("next", key)``; ``out_keys``
    (default: the modules' ``("next", ...)`` out keys) are the states carried: the state a
    burn-in step writes at ``("next", key)`` is fed to the next step at ``key``, and the last
    one is written at ``key`` in the first kept step.

    Args:
        modules: a module or a sequence of modules, run in order on every burn-in step.
        burn_in: how many leading steps to burn in (time is the last batch dim).
        out_keys: the carried recurrent-state keys (root names, without ``"next"``).

    Example:
        >>> t = BurnInTransform(gru_module, burn_in=5)
        >>> batch = t(sequences)  # [B, T] -> [B, T - 5], hidden state burnt in
    """

    def __init__(
        self,
        modules: Callable[..., Any] | Sequence[Callable[..., Any]],
        burn_in: int,
        out_keys: Sequence[NestedKey] | None = None,
    ) -> None:
        mods = list(modules) if isinstance(modules, Sequence) else [modules]
        if not mods:
            raise ValueError("BurnInTransform needs at least one module")
        if burn_in < 1:
            raise ValueError(f"burn_in must be >= 1, got {burn_in}")
        if out_keys is None:
            found: list[NestedKey] = []
            for m in mods:
                for key in getattr(m, "out_keys", []):
                    k = unravel(key)
                    if k[0] == "next" and len(k) > 1:
                        found.append(k[1:] if len(k) > 2 else k[1])
            if not found:
                raise ValueError(
                    "BurnInTransform: pass out_keys (no module writes a ('next', ...) state)"
                )
            out_keys = found
        super().__init__(in_keys=[], out_keys=[])
        self.out_keys = _norm_keys(out_keys)
        self.modules_list = torch.nn.ModuleList([m for m in mods if isinstance(m, torch.nn.Module)])
        self._modules_seq = mods
        self.burn_in = burn_in

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        if tensordict.batch_dims < 1:
            raise ValueError("BurnInTransform needs data with a time dim (the last batch dim)")
        time = tensordict.batch_dims - 1
        steps = tensordict.batch_size[time]
        if steps <= self.burn_in:
            raise ValueError(
                f"BurnInTransform: {steps} steps leave nothing after burn_in={self.burn_in}"
            )
        burn = tensordict[..., : self.burn_in]
        carry: dict[Any, torch.Tensor] = {}
        with torch.no_grad():
            for t in range(self.burn_in):
                step = burn[..., t].clone()
                for key, value in carry.items():
                    step.set(key, value)
                for module in self._modules_seq:
                    out = module(step)
                    step = out if isinstance(out, TensorDictBase) else step
                for key in self.out_keys:
                    value = step.get(("next", *unravel(key)), None)
                    if value is None:
                        raise KeyError(
                            f"BurnInTransform: the modules wrote no ('next', {key!r}) state"
                        )
                    carry[key] = value
        rest = tensordict[..., self.burn_in :].clone()
        for key, value in carry.items():
            column = rest.get(key, None)
            if column is None:
                column = value.unsqueeze(time).expand(
                    *value.shape[:time], rest.batch_size[time], *value.shape[time:]
                )
                column = torch.zeros_like(column)
            else:
                column = column.clone()
            column.select(time, 0).copy_(value)
            rest.set(key, column)
        return rest

    def _call(self, tensordict: TensorDictBase) -> TensorDictBase:
        return self.forward(tensordict)
