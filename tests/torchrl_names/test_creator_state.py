"""EnvCreator.state_dict / load_state_dict (TorchRL's): the state (transform buffers) every
env a creator builds starts from, in this process and in worker processes; and the envs'
own ``state_dict`` / ``load_state_dict``."""

from __future__ import annotations

import pickle

import pytest
import torch

from aenv.torchrl import EnvCreator, GymEnv, ObservationNorm, ParallelEnv, SerialEnv, TransformedEnv

pytestmark = pytest.mark.timeout(120)

LOC = torch.tensor([0.5, -0.25, 1.0])
SCALE = torch.tensor([2.0, 4.0, 0.5])


def _normed(loc=None, scale=None) -> TransformedEnv:
    norm = ObservationNorm(loc=loc, scale=scale, in_keys=["observation"], standard_normal=True)
    return TransformedEnv(GymEnv("Pendulum-v1"), norm)


def _raw_first_obs(seed: int) -> torch.Tensor:
    env = GymEnv("Pendulum-v1")
    env.set_seed(seed)
    obs = env.reset()["observation"]
    env.close()
    return obs


def test_state_dict_holds_the_transform_buffers():
    creator = EnvCreator(lambda: _normed(torch.zeros(3), torch.ones(3)))
    sd = creator.state_dict()
    keys = [k for k in sd if k.endswith(("loc", "scale"))]
    assert len(keys) == 2 and all(k.startswith("transform.") for k in keys)
    assert all(v.is_shared() for v in sd.values())
    assert creator.meta_data.batch_size == torch.Size([])  # (read by the same probe env)


def test_loaded_state_reaches_every_env_built():
    creator = EnvCreator(lambda: _normed(torch.zeros(3), torch.ones(3)))
    env = _normed(LOC, SCALE)
    creator.load_state_dict(env.state_dict())
    built = creator()
    built.set_seed(3)
    obs = built.reset()["observation"]
    assert torch.allclose(obs, (_raw_first_obs(3) - LOC) / SCALE)
    # the creator's tensors are the state: changing one in place changes later envs
    key = next(k for k in creator.state_dict() if k.endswith("loc"))
    creator.state_dict()[key].zero_()
    again = creator()
    again.set_seed(3)
    assert torch.allclose(again.reset()["observation"], _raw_first_obs(3) / SCALE)
    for e in (env, built, again):
        e.close()


def test_uninitialized_norm_takes_the_stats():
    """A factory whose ObservationNorm has no loc / scale yet (stats computed elsewhere,
    TorchRL's init_stats flow): the creator's envs get them, and their specs follow."""
    creator = EnvCreator(_normed)
    assert not any(k.endswith("loc") for k in creator.state_dict())
    source = _normed(LOC, SCALE)
    creator.load_state_dict(source.state_dict())
    env = creator()
    assert env.transform.initialized
    env.set_seed(0)
    r = env.rollout(5)
    assert torch.allclose(r[0]["observation"], (_raw_first_obs(0) - LOC) / SCALE)
    env.close()
    source.close()


def test_worker_processes_start_from_the_state():
    creator = EnvCreator(lambda: _normed(torch.zeros(3), torch.ones(3)))
    creator.load_state_dict(_normed(LOC, SCALE).state_dict())
    penv = ParallelEnv(2, creator)
    try:
        penv.set_seed(11)
        obs = penv.reset()["observation"]
    finally:
        penv.close()
    serial = SerialEnv(2, lambda: GymEnv("Pendulum-v1"))
    serial.set_seed(11)
    raw = serial.reset()["observation"]
    serial.close()
    assert torch.allclose(obs, (raw - LOC) / SCALE)


def test_pickled_creator_keeps_the_values():
    creator = EnvCreator(lambda: _normed(torch.zeros(3), torch.ones(3)))
    creator.load_state_dict(_normed(LOC, SCALE).state_dict())
    copy = pickle.loads(pickle.dumps(creator))
    assert all(torch.equal(copy.state_dict()[k], v) for k, v in creator.state_dict().items())


def test_bad_state_is_refused_whole():
    creator = EnvCreator(lambda: _normed(torch.zeros(3), torch.ones(3)))
    before = {k: v.clone() for k, v in creator.state_dict().items()}
    loc_key = next(k for k in before if k.endswith("loc"))
    scale_key = next(k for k in before if k.endswith("scale"))
    with pytest.raises(ValueError, match="shape"):
        creator.load_state_dict({scale_key: torch.ones(3) * 7, loc_key: torch.zeros(4)})
    with pytest.raises(TypeError, match="tensor"):
        creator.load_state_dict({loc_key: [1.0, 2.0, 3.0]})
    assert all(torch.equal(creator.state_dict()[k], v) for k, v in before.items())


def test_env_load_state_dict_strict():
    env = _normed(torch.zeros(3), torch.ones(3))
    sd = _normed(LOC, SCALE).state_dict()
    with pytest.raises(RuntimeError, match="unexpected keys"):
        env.load_state_dict({**sd, "transform.nope": torch.zeros(1)})
    env.load_state_dict(sd)
    assert torch.equal(env.transform.loc, LOC) and torch.equal(env.transform.scale, SCALE)
    env.close()
