"""split_inputs: per-env inputs of a batch, non-tensor entries included."""

from __future__ import annotations

import torch
from tensordict import NonTensorStack, TensorDict

from aenv.pool._stacking import split_inputs


def test_non_tensor_entry_keeps_every_key():
    td = TensorDict({"obs": torch.arange(2.0).unsqueeze(-1)}, [2])
    td.set("action", NonTensorStack("a", "b"))
    td.set("history", NonTensorStack("h0", "h1"))
    td.set("state", torch.ones(2, 3))
    out = split_inputs(td, [1, 0], ["obs", "action", "history", "state", "absent"], torch.Size())
    assert [o["action"] for o in out] == ["b", "a"]
    assert [o["history"] for o in out] == ["h1", "h0"]
    assert out[0]["obs"].tolist() == [1.0] and out[0]["state"].shape == (3,)
