"""ParallelEnv: the seeds' sync API over worker processes (default start method: spawn)."""

from __future__ import annotations

import sys

import cloudpickle
import psutil
import pytest
import torch
from tensordict import TensorDict

from aenv.sync._creator import EnvCreator
from aenv.sync._parallel import ParallelEnv
from aenv.testing import CountingEnv

pytestmark = pytest.mark.timeout(60)
# this module may not be importable by name in a worker: ship its functions by value
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def make_counting(max_steps: int = 3) -> CountingEnv:
    return CountingEnv(max_steps=max_steps)


@pytest.fixture(scope="module")
def env():
    with ParallelEnv(
        4, EnvCreator(make_counting), [{"max_steps": 3 + i} for i in range(4)], num_processes=2
    ) as penv:
        yield penv


def test_batch_size_attributes_and_rollout(env):
    assert env.batch_size == torch.Size([4]) and env.num_workers == 4
    assert len(env.worker_pids) == 2
    a, b, c, d = env.max_steps
    assert (a, b, c, d) == (3, 4, 5, 6)
    td = env.rollout(5, break_when_any_done=False)
    assert td.batch_size == torch.Size([4, 5])
    assert td["next", "observation"].squeeze(-1)[0].tolist() == [1, 2, 3, 1, 2]


def test_partial_reset_as_in_the_seeds(env):
    td = env.reset()
    for _ in range(2):
        td = env.step_mdp(env.rand_step(td))
    data = TensorDict({"_reset": torch.tensor([[True], [False], [True], [True]])}, [4])
    data.update(td.exclude("next"))
    out = env.reset(data)
    assert "_reset" not in out.keys()
    assert out["observation"].squeeze(-1).tolist() == [0, 2, 0, 0]
    assert out["done"].shape == torch.Size([4, 1])


def test_seed_and_start():
    assert ParallelEnv.start is not None
    with pytest.raises(ValueError, match="process backend"):
        ParallelEnv(2, CountingEnv, backend="thread")


def test_close_leaves_no_worker_behind():
    penv = ParallelEnv(2, CountingEnv, num_processes=2).start()
    pids = penv.worker_pids
    assert penv.set_seed(0) == 2
    penv.close()
    penv.close()  # idempotent
    children = {p.pid for p in psutil.Process().children(recursive=True)}
    assert not children & set(pids)
    for pid in pids:
        assert not psutil.pid_exists(pid)


@pytest.mark.timeout(120)
def test_a_dropped_parallel_env_ends_its_workers():
    # a notebook cell re-run: the facade is dropped without close(); the loop's watch on the
    # workers' sockets must not keep the pool alive, so its finalizer ends the workers
    import gc
    import time
    import weakref

    env = ParallelEnv(2, CountingEnv, num_processes=2)
    env.reset()
    backend = env.env._backend
    pids = backend.worker_pids
    ref = weakref.ref(backend)
    del env, backend
    gc.collect()
    assert ref() is None

    def alive() -> list[int]:
        out = []
        for pid in pids:
            try:
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    out.append(pid)
            except psutil.NoSuchProcess:
                pass
        return out

    deadline = time.monotonic() + 30
    while alive() and time.monotonic() < deadline:
        time.sleep(0.05)  # (polling a condition, bounded: the kill is asynchronous)
    assert alive() == []
