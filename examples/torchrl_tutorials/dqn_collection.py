"""TorchRL's DQN tutorial ("TorchRL trainer: a DQN example"), env and collection parts,
on aenv: ``make_env`` over a batched env (``serial_for_single``, ``EnvCreator``,
``mp_start_method``), observation statistics computed once with ``init_stats`` and passed
on through ``ObservationNorm``'s ``state_dict``, a greedy Q-value policy and a collector.
CartPole's state observations in place of its rendered pixels (the TorchRL install this
was checked against has no pygame); the Q-value module is written with tensordict's
modules (TorchRL's ``QValueActor`` is TorchRL's own module, not env code). TorchRL code
where only the import block differs (the TorchRL twin: drop the ``from aenv...`` line,
uncomment the ``# torchrl:`` lines).

``TUTORIAL_QUICK=1`` collects 2 batches instead of 10.
"""

import os

import torch
from tensordict.nn import TensorDictModule, TensorDictSequential
from torch import multiprocessing, nn

from aenv.torchrl import (
    Collector,
    Compose,
    EnvCreator,
    GymEnv,
    ObservationNorm,
    ParallelEnv,
    RewardScaling,
    SerialEnv,
    StepCounter,
    TransformedEnv,
)

# torchrl: from torchrl.collectors import Collector
# torchrl: from torchrl.envs import Compose, EnvCreator, ObservationNorm, ParallelEnv, RewardScaling, SerialEnv, StepCounter, TransformedEnv
# torchrl: from torchrl.envs.libs.gym import GymEnv

QUICK = os.environ.get("TUTORIAL_QUICK") == "1"
multiprocessing.set_start_method("fork", force=True)
mp_context = multiprocessing.get_start_method()


def maker():
    return GymEnv("CartPole-v1")


def make_env(parallel=False, obs_norm_sd=None, num_workers=1):
    if obs_norm_sd is None:
        obs_norm_sd = {"standard_normal": True}
    if parallel:
        base_env = ParallelEnv(
            num_workers, EnvCreator(maker), serial_for_single=True, mp_start_method=mp_context
        )
    else:
        base_env = maker()
    return TransformedEnv(
        base_env,
        Compose(
            StepCounter(),
            RewardScaling(loc=0.0, scale=0.1),
            ObservationNorm(in_keys=["observation"], **obs_norm_sd),
        ),
    )


def get_norm_stats():
    test_env = make_env()
    test_env.set_seed(0)
    test_env.transform[-1].init_stats(num_iter=500, cat_dim=0, reduce_dim=0)
    obs_norm_sd = test_env.transform[-1].state_dict()
    test_env.close()
    return obs_norm_sd


torch.manual_seed(0)
stats = get_norm_stats()
print("result state dict keys:", sorted(stats))
assert bool(stats["standard_normal"])  # kept, so the rebuilt norm normalises

single = make_env(parallel=True, obs_norm_sd=stats, num_workers=1)
print("result serial for one worker:", isinstance(single.base_env, SerialEnv))
single.set_seed(0)
obs = single.rollout(500, break_when_any_done=False)["observation"]
print("result normalised:", bool(obs.mean().abs() < 1), bool(obs.std() < 3))
single.close()

env = make_env(parallel=True, obs_norm_sd=stats, num_workers=2)
n_actions = env.action_spec.shape[-1]
qnet = TensorDictModule(
    nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, n_actions)),
    in_keys=["observation"], out_keys=["action_value"],
)  # fmt: skip
greedy = TensorDictModule(
    lambda q: nn.functional.one_hot(q.argmax(-1), n_actions).to(torch.int64),
    in_keys=["action_value"], out_keys=["action"],
)  # fmt: skip
policy = TensorDictSequential(qnet, greedy)

frames_per_batch = 100
collector = Collector(
    env, policy, frames_per_batch=frames_per_batch,
    total_frames=frames_per_batch * (2 if QUICK else 10),
)  # fmt: skip
optim = torch.optim.Adam(qnet.parameters(), 1e-3)
for i, data in enumerate(collector):
    assert not data["action_value"].requires_grad  # collected without a graph
    q = qnet(data.clone())["action_value"]
    q_taken = (q * data["action"]).sum(-1, keepdim=True)
    with torch.no_grad():
        q_next = qnet(data["next"].clone())["action_value"].max(-1, keepdim=True).values
    target = data["next", "reward"] + 0.99 * q_next * (~data["next", "done"])
    loss = (q_taken - target).pow(2).mean()
    loss.backward()
    optim.step()
    optim.zero_grad()
    print(f"result batch {i}:", tuple(data.batch_size))
collector.shutdown()
