"""DreamerDecoder: Dreamer's latents decoded into observations (for :class:`~aenv.DreamerEnv`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from tensordict import TensorDictBase

from aenv._mdp import NestedKey
from aenv.specs import Composite, Unbounded
from aenv.transforms._base import Transform

__all__ = ["DreamerDecoder"]


class DreamerDecoder(Transform):
    """Decodes Dreamer's latents into observations after each reset and step:
    ``out_keys[0] = obs_decoder(state, belief)`` (default ``"reco_pixels"``), so imagined
    rollouts can be looked at (or logged with a video recorder).

    Args:
        obs_decoder: a module (or callable) taking the ``in_keys`` tensors; default: the
            base :class:`~aenv.DreamerEnv`'s ``obs_decoder``.
        in_keys: the latents (default ``["state", "belief"]``).
        out_keys: the decoded entry (default ``["reco_pixels"]``).
        shape: shape of the decoded observation (its spec).

    Example:
        >>> env = TransformedEnv(DreamerEnv(wm, (30,), (200,), obs_decoder=dec),
        ...                      DreamerDecoder(shape=(3, 64, 64)))
    """

    def __init__(
        self,
        obs_decoder: Callable[..., Any] | None = None,
        in_keys: Sequence[NestedKey] | None = None,
        out_keys: Sequence[NestedKey] | None = None,
        shape: Sequence[int] | None = None,
    ) -> None:
        in_keys = list(in_keys) if in_keys is not None else ["state", "belief"]
        super().__init__()
        self.in_keys = in_keys
        self.out_keys = list(out_keys) if out_keys is not None else ["reco_pixels"]
        self._decoder = obs_decoder
        self.shape = torch.Size(shape) if shape is not None else None

    def _decoder_fn(self) -> Callable[..., Any]:
        if self._decoder is not None:
            return self._decoder
        env = self.container
        decoder = getattr(env.base_env, "obs_decoder", None) if env is not None else None
        if decoder is None:
            raise RuntimeError("DreamerDecoder has no obs_decoder (pass one, or set the env's)")
        return decoder  # type: ignore[no-any-return]

    def _decode(self, td: TensorDictBase) -> TensorDictBase:
        value = self._decoder_fn()(*(td.get(k) for k in self.in_keys))
        td.set(self.out_keys[0], value)
        return td

    def transform_output_spec(self, output_spec: Composite) -> Composite:
        if self.shape is None:
            raise ValueError("DreamerDecoder needs the decoded observation's shape (shape=)")
        batch = tuple(output_spec.shape)
        output_spec["full_observation_spec"][self.out_keys[0]] = Unbounded((*batch, *self.shape))
        return output_spec

    def _reset(
        self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase
    ) -> TensorDictBase:
        return self._decode(tensordict_reset)

    def _step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
        return self._decode(next_tensordict)
