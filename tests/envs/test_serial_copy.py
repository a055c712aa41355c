"""A rollout's buffer copies stay in the calling thread (aenv/envs/_rowplan.py serial_copy):
torch copies big tensors on its intra-op threads, which then spin beside a process pool's
workers. The copies equal torch's, and a long rollout starts no thread."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

from aenv.envs._rollout_steps import _DRAW_ELEMENTS, _Draws
from aenv.envs._rowplan import STEP_GROUPS, plan_rows, serial_copy
from aenv.specs import Bounded
from aenv.testing import CountingEnv

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool, torch.bfloat16])
def test_serial_copy_equals_a_contiguous_clone(dtype: torch.dtype) -> None:
    base = (torch.arange(2 * 3 * 4) % 5).reshape(2, 3, 4).to(dtype)
    for value in (base, base.movedim(0, 1), base[:1].expand(6, 3, 4), base[:, ::2]):
        out = serial_copy(value)
        assert out.is_contiguous() and out.dtype == dtype and out.shape == value.shape
        assert torch.equal(out, value)
        assert out.untyped_storage().data_ptr() != value.untyped_storage().data_ptr()
    out = serial_copy(base)
    out.fill_(1)
    assert not torch.equal(base, out)  # (a copy, not a view)


def test_serial_copy_keeps_the_gradient_through_torch() -> None:
    value = torch.ones(3, requires_grad=True)
    out = serial_copy(value * 2)
    assert out.requires_grad
    out.sum().backward()
    assert value.grad is not None and value.grad.tolist() == [2.0, 2.0, 2.0]


def test_plan_rows_are_zeroed_separate_rows() -> None:
    env = CountingEnv(batch_size=(4,))
    rows = plan_rows(env, STEP_GROUPS, 5)
    assert rows is not None and rows.batch_size == (5, 4)
    for key, leaf in rows.items():
        assert leaf.is_contiguous() and not leaf.any(), key
        leaf[0] = 1
        assert not leaf[1:].any(), key  # (each row its own memory, not an expanded row)


def test_draw_chunks_stay_under_torch_grain() -> None:
    env = CountingEnv(batch_size=(8,))
    env.action_spec = Bounded(-1.0, 1.0, shape=(8, 512))
    draws = _Draws(env, 5000)
    t = 0
    while draws.left:
        chunk = draws.chunk(t)
        (leaf,) = chunk.values()
        assert leaf.shape[1:] == (8, 512)
        assert 1 <= leaf.numel() <= max(_DRAW_ELEMENTS, 8 * 512)
        t = draws.end
    assert t == 5000


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/task")
def test_a_long_rollout_starts_no_intra_op_thread() -> None:
    # (a fresh process: torch's OpenMP threads, once started, stay)
    code = textwrap.dedent(
        """
        import os, torch
        from aenv.pool import AsyncEnvPool
        from aenv.sync import SyncEnv
        from aenv.testing import CountingEnv
        if torch.get_num_threads() < 2:
            print("skip")
            raise SystemExit
        env = SyncEnv(AsyncEnvPool([lambda: CountingEnv(max_steps=7)] * 8, backend="coroutine"))
        env.rollout(10, break_when_any_done=False)
        before = len(os.listdir("/proc/self/task"))
        td = env.rollout(6000, break_when_any_done=False)
        assert td.batch_size == (8, 6000), td.batch_size
        print(before, len(os.listdir("/proc/self/task")))
        env.close()
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=100, check=True
    ).stdout.split()
    if out == ["skip"]:
        pytest.skip("torch runs one intra-op thread here")
    before, after = map(int, out)
    assert after == before
