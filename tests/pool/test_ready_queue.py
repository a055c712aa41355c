"""The streaming receive queue (``_Ready``): arrival order, receives by env, put-backs.

Checked against a plain list doing the same operations by scanning (what the queue did
before it was indexed by env), over random operation sequences."""

from __future__ import annotations

import random

import pytest

from aenv.pool._dispatch import _Ready


def _item(env: int, tag: int) -> tuple[int, int, None]:
    return (env, tag, None)  # type: ignore[return-value]


@pytest.mark.parametrize("seed", range(20))
def test_ready_queue_matches_a_scanned_list(seed: int) -> None:
    rng = random.Random(seed)
    ready, model = _Ready(), []
    tag = 0
    for _ in range(400):
        op = rng.random()
        if op < 0.45 or not model:
            tag += 1
            item = _item(rng.randrange(6), tag)
            ready.append(item)  # type: ignore[arg-type]
            model.append(item)
        elif op < 0.7:
            env = rng.randrange(6)
            assert ready.has(env) == any(it[0] == env for it in model)
            if ready.has(env):
                want = next(it for it in model if it[0] == env)
                model.remove(want)
                assert ready.take(env) == want
        elif op < 0.9:
            take = rng.randint(1, len(model))
            got = ready.pop_oldest(take)
            assert got == model[:take]
            del model[:take]
            if rng.random() < 0.3:  # a failed one among them: the others go back in front
                drop = rng.randrange(take)
                back = got[:drop] + got[drop + 1 :]
                ready.put_back(back)  # type: ignore[arg-type]
                model[:0] = back
        assert len(ready) == len(model)
        assert bool(ready) == bool(model)
        assert ready.waiting() == model
    while model:
        assert ready.pop_oldest(1) == [model.pop(0)]
    assert not ready


def test_taking_by_env_leaves_the_others_in_arrival_order() -> None:
    ready = _Ready()
    for tag, env in enumerate([3, 1, 3, 2, 1]):
        ready.append(_item(env, tag))  # type: ignore[arg-type]
    assert ready.take(3) == _item(3, 0)  # (env 3's oldest)
    assert ready.take(1) == _item(1, 1)
    assert ready.pop_oldest(len(ready)) == [
        _item(3, 2),
        _item(2, 3),
        _item(1, 4),
    ]
    assert not ready.has(1) and not ready.has(3)


def test_the_index_by_env_is_made_on_demand_and_dropped_once_empty() -> None:
    # results nobody receives by env are queued as they are; the first receive by env
    # indexes what waits (an env with several among it too), and once the queue is empty
    # the index goes
    ready = _Ready()
    for tag, env in enumerate([2, 5, 2, 7]):
        ready.append(_item(env, tag))  # type: ignore[arg-type]
    assert ready._by_env is None
    assert ready.pop_oldest(1) == [_item(2, 0)]
    assert ready.has(2) and ready._by_env is not None
    ready.append(_item(5, 4))  # type: ignore[arg-type]
    assert ready.take(5) == _item(5, 1)
    assert ready.pop_oldest(3) == [_item(2, 2), _item(7, 3), _item(5, 4)]
    assert not ready and ready._by_env is None and not ready.has(5)
    ready.append(_item(1, 5))  # type: ignore[arg-type]
    ready.put_back([_item(3, 6)])  # type: ignore[list-item]
    assert ready._by_env is None
    assert ready.take(1) == _item(1, 5)
    assert ready.pop_oldest(1) == [_item(3, 6)]
    assert ready._by_env is None
