"""TorchRL's PPO tutorial ("Reinforcement Learning (PPO) with TorchRL"), env and collection
parts, on aenv: a transformed Gym env (observation norm with ``init_stats``, float cast,
step counter), its specs checked, a stochastic policy whose bounds come from
``action_spec_unbatched.space``, and a collector feeding a PPO-style update. Pendulum in
place of MuJoCo's InvertedDoublePendulum; the policy is built from tensordict's modules
(TorchRL's ``ProbabilisticActor`` / ``TanhNormal`` are TorchRL's own modules, not env
code). TorchRL code where only the import block differs (the TorchRL twin: drop the
``from aenv...`` line, uncomment the ``# torchrl:`` lines).

``TUTORIAL_QUICK=1`` collects 2 batches instead of 10.
"""

import os

import torch
from tensordict.nn import NormalParamExtractor, ProbabilisticTensorDictModule, TensorDictModule
from tensordict.nn import ProbabilisticTensorDictSequential as Seq
from tensordict.nn.distributions import TruncatedNormal
from torch import nn

from aenv.torchrl import (
    Collector,
    Compose,
    DoubleToFloat,
    ExplorationType,
    GymEnv,
    ObservationNorm,
    StepCounter,
    TransformedEnv,
    check_env_specs,
    set_exploration_type,
)

# torchrl: from torchrl.collectors import Collector
# torchrl: from torchrl.envs import Compose, DoubleToFloat, ObservationNorm, StepCounter, TransformedEnv
# torchrl: from torchrl.envs.libs.gym import GymEnv
# torchrl: from torchrl.envs.utils import ExplorationType, check_env_specs, set_exploration_type

QUICK = os.environ.get("TUTORIAL_QUICK") == "1"
frames_per_batch, total_frames = 200, (400 if QUICK else 2000)

torch.manual_seed(0)
base_env = GymEnv("Pendulum-v1")
env = TransformedEnv(
    base_env, Compose(ObservationNorm(in_keys=["observation"]), DoubleToFloat(), StepCounter())
)
env.set_seed(0)
env.transform[0].init_stats(num_iter=200, reduce_dim=0, cat_dim=0)  # sync, as in TorchRL
print("result norm shape:", tuple(env.transform[0].loc.shape))
check_env_specs(env)
rollout = env.rollout(3)
print("result rollout:", tuple(rollout.batch_size))

n_act = env.action_spec.shape[-1]
actor_net = nn.Sequential(
    nn.Linear(3, 32), nn.Tanh(), nn.Linear(32, 2 * n_act), NormalParamExtractor()
)
space = env.action_spec_unbatched.space
policy = Seq(
    TensorDictModule(actor_net, in_keys=["observation"], out_keys=["loc", "scale"]),
    ProbabilisticTensorDictModule(
        in_keys=["loc", "scale"], out_keys=["action"], distribution_class=TruncatedNormal,
        distribution_kwargs={"a": space.low, "b": space.high}, return_log_prob=True,
    ),
)  # fmt: skip
value_net = TensorDictModule(
    nn.Sequential(nn.Linear(3, 32), nn.Tanh(), nn.Linear(32, 1)),
    in_keys=["observation"], out_keys=["state_value"],
)  # fmt: skip
policy(env.reset())

collector = Collector(env, policy, frames_per_batch=frames_per_batch, total_frames=total_frames)
optim = torch.optim.Adam([*actor_net.parameters(), *value_net.parameters()], 3e-4)
for i, data in enumerate(collector):
    # collected under no_grad, as in TorchRL: the stored log-probs carry no graph
    assert not data["action_log_prob"].requires_grad
    value_net(data)
    value_net(data["next"])
    ret = data["next", "reward"] + 0.99 * data["next", "state_value"].detach()
    adv = (ret - data["state_value"]).detach()
    dist = policy.get_dist(data)
    ratio = (dist.log_prob(data["action"]) - data["action_log_prob"]).exp()
    loss = -(ratio * adv.squeeze(-1)).mean() + (ret - data["state_value"]).pow(2).mean()
    loss.backward()
    optim.step()
    optim.zero_grad()
    print(f"result batch {i}:", tuple(data.batch_size), "max steps", int(data["step_count"].max()))

with set_exploration_type(ExplorationType.DETERMINISTIC), torch.no_grad():
    eval_rollout = env.rollout(50, policy)
print("result eval:", tuple(eval_rollout.batch_size))
collector.shutdown()
