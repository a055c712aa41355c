"""``aenv._mdp_tree.non_tensor``: a NonTensorData assembled without the tensorclass
constructor is the constructor's, field for field, wherever a NonTensorData goes."""

from __future__ import annotations

import pickle

import pytest
import torch
from tensordict import NonTensorData, NonTensorStack, TensorDict

from aenv._mdp_tree import _ASSEMBLES, non_tensor, non_tensor_value


class _History:  # an arbitrary python object, as a chat history is
    def __init__(self, turns: list[str]) -> None:
        self.turns = turns


@pytest.mark.parametrize(
    "value, batch",
    [("text", ()), ((1, 2, 3), ()), ({"a": 1}, ()), (["x", "y"], (2,)), ("shared", (3, 2))],
)
def test_matches_the_constructor(value, batch):
    assert _ASSEMBLES  # (this tensordict lays instances out as non_tensor does)
    made, ref = non_tensor(value, batch), NonTensorData(value, batch_size=batch)
    assert type(made) is NonTensorData
    assert vars(made).keys() == vars(ref).keys()
    assert made._non_tensordict == ref._non_tensordict
    assert made.batch_size == ref.batch_size == torch.Size(batch)
    assert made.device is None and made.data == ref.data == value
    assert made.tolist() == ref.tolist()
    # its TensorDict is its own (not shared between instances), laid out field for field
    # as the constructor's
    assert non_tensor(value, batch)._tensordict is not made._tensordict
    assert type(made._tensordict) is TensorDict
    assert vars(made._tensordict) == vars(ref._tensordict)


def test_a_tensordict_laid_out_otherwise_gets_the_constructor(monkeypatch):
    # a tensordict whose TensorDicts carry a field more than non_tensor writes: the check
    # made at import refuses the assembly, and non_tensor's instances are the constructor's
    import aenv._mdp_tree as tree

    made = TensorDict._new_unsafe.__func__

    def with_a_field_more(cls, *args, **kwargs):
        td = made(cls, *args, **kwargs)
        td.__dict__["_field_more"] = True
        return td

    monkeypatch.setattr(TensorDict, "_new_unsafe", classmethod(with_a_field_more))
    monkeypatch.setattr(tree, "_ASSEMBLES", tree._assembles())
    assert not tree._ASSEMBLES
    inner = tree.non_tensor("text")._tensordict
    assert vars(inner) == vars(NonTensorData("text")._tensordict)
    assert inner.__dict__["_field_more"] is True


def test_goes_wherever_a_non_tensor_data_goes():
    history = _History(["hi"])
    made = non_tensor(history)
    td = TensorDict({"history": made, "text": non_tensor("a")}, batch_size=())
    assert td["text"] == "a" and td.get("history").data is history
    back = pickle.loads(pickle.dumps(made))
    assert type(back) is NonTensorData and back.data.turns == ["hi"]
    # (a clone copies the data, as the constructor's instance's clone does)
    assert made.clone().data.turns == NonTensorData(history).clone().data.turns == ["hi"]
    stacked = torch.stack([non_tensor("a"), non_tensor("b")])
    assert isinstance(stacked, NonTensorStack) and stacked.tolist() == ["a", "b"]
    rows = torch.stack([td, td.clone()])
    assert rows["text"] == ["a", "a"] or rows.get("text").tolist() == ["a", "a"]
    # equal to the constructor's instance as tensordict compares them
    assert bool(non_tensor("q") == NonTensorData("q"))


def test_tensors_tensordicts_and_tensorclasses_take_the_constructor():
    t = torch.arange(3)
    assert torch.equal(non_tensor(t).data, NonTensorData(t).data)
    inner = NonTensorData("inner")
    assert non_tensor(inner).data == NonTensorData(inner).data == "inner"


def test_value_reads_the_data_field():
    assert non_tensor_value(non_tensor("x")) == "x"
    assert non_tensor_value(NonTensorData(["a"], batch_size=[1])) == ["a"]
    assert non_tensor_value("plain") == "plain"
    assert non_tensor_value(None) is None
