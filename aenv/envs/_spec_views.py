"""The shape views of an env's specs: ``env.shape`` and the ``*_spec_unbatched`` family."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from aenv.specs import Composite, TensorSpec

__all__ = ["UnbatchedViewsMixin"]


class UnbatchedViewsMixin:
    """``env.shape`` and each spec without the env's batch dims (TorchRL's ``*_unbatched``
    views), for :class:`~aenv.envs._specs.EnvSpecsMixin`."""

    batch_size: torch.Size
    if TYPE_CHECKING:
        input_spec: Composite
        output_spec: Composite
        full_action_spec: Composite
        action_spec: TensorSpec
        full_observation_spec: Composite
        observation_spec: Composite
        full_reward_spec: Composite
        reward_spec: TensorSpec
        full_done_spec: Composite
        done_spec: TensorSpec
        full_state_spec: Composite

    @property
    def shape(self) -> torch.Size:
        """The env's batch size (the seeds' ``env.shape``)."""
        return self.batch_size

    def _unbatched(self, spec: TensorSpec) -> TensorSpec:
        """``spec`` for one batch element: its first element along every batch dim."""
        n = len(self.batch_size)
        return spec[(0,) * n] if n else spec.clone()

    @property
    def input_spec_unbatched(self) -> Composite:
        """``input_spec`` without the batch dims."""
        return self._unbatched(self.input_spec)  # type: ignore[return-value]

    @property
    def output_spec_unbatched(self) -> Composite:
        """``output_spec`` without the batch dims."""
        return self._unbatched(self.output_spec)  # type: ignore[return-value]

    @property
    def full_action_spec_unbatched(self) -> Composite:
        """``full_action_spec`` without the batch dims."""
        return self._unbatched(self.full_action_spec)  # type: ignore[return-value]

    @property
    def action_spec_unbatched(self) -> TensorSpec:
        """``action_spec`` without the batch dims."""
        return self._unbatched(self.action_spec)

    @property
    def full_observation_spec_unbatched(self) -> Composite:
        """``full_observation_spec`` without the batch dims."""
        return self._unbatched(self.full_observation_spec)  # type: ignore[return-value]

    @property
    def observation_spec_unbatched(self) -> Composite:
        """``observation_spec`` without the batch dims."""
        return self._unbatched(self.observation_spec)  # type: ignore[return-value]

    @property
    def full_reward_spec_unbatched(self) -> Composite:
        """``full_reward_spec`` without the batch dims."""
        return self._unbatched(self.full_reward_spec)  # type: ignore[return-value]

    @property
    def reward_spec_unbatched(self) -> TensorSpec:
        """``reward_spec`` without the batch dims."""
        return self._unbatched(self.reward_spec)

    @property
    def full_done_spec_unbatched(self) -> Composite:
        """``full_done_spec`` without the batch dims."""
        return self._unbatched(self.full_done_spec)  # type: ignore[return-value]

    @property
    def done_spec_unbatched(self) -> TensorSpec:
        """``done_spec`` without the batch dims."""
        return self._unbatched(self.done_spec)

    @property
    def full_state_spec_unbatched(self) -> Composite:
        """``full_state_spec`` without the batch dims."""
        return self._unbatched(self.full_state_spec)  # type: ignore[return-value]
