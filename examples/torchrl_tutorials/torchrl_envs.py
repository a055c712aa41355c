"""TorchRL's "TorchRL envs" tutorial, env parts (Gym envs, specs, seeding, steps,
transforms, batched envs and their indexing, transforms on the main process, VecNorm) on
aenv, with Pendulum / CartPole in place of the MuJoCo, Atari and DMControl envs. TorchRL
code where only the import block differs (the TorchRL twin: drop the ``from aenv...``
line, uncomment the ``# torchrl:`` lines).

As in TorchRL's tutorial, the start method is set to ``fork`` for the whole program and
the script has no ``if __name__ == "__main__":`` guard: batched envs honour it.
``TUTORIAL_QUICK=1`` is accepted for symmetry with the other tutorials.
"""

import numpy as np
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule
from torch import multiprocessing

from aenv.torchrl import (
    CatTensors,
    EnvCreator,
    GymEnv,
    ParallelEnv,
    StepCounter,
    TransformedEnv,
    UnsqueezeTransform,
    VecNorm,
    step_mdp,
)

# torchrl: from torchrl.envs import CatTensors, EnvCreator, ParallelEnv, StepCounter, TransformedEnv, UnsqueezeTransform, VecNorm, step_mdp
# torchrl: from torchrl.envs.libs.gym import GymEnv

# (TorchRL's tutorial sets fork only when no method is set; TorchRL's import sets one)
multiprocessing.set_start_method("fork", force=True)
mp_context = multiprocessing.get_start_method()

# ---- a Gym env, its specs, seeding and steps
env = GymEnv("Pendulum-v1")
assert "CartPole-v1" in list(GymEnv.available_envs)
action = torch.ones(1) * 3
print("result in bounds:", bool(env.action_spec.is_in(action)))
print("result projected:", env.action_spec.project(action).tolist())
assert env.action_spec.is_in(env.action_spec.rand())

torch.manual_seed(0)
env.set_seed(0)
reset_data = env.reset()
policy = TensorDictModule(env.action_spec.rand, in_keys=[], out_keys=["action"])
policy(reset_data)
out = env.step(reset_data)
assert out is reset_data  # step writes "next" into its input
out.set("some other key", torch.randn(1))
nxt = step_mdp(out)
assert (nxt["observation"] == out["next", "observation"]).all()
assert "some other key" in nxt.keys()  # other root entries are kept
data = TensorDict()
assert env.reset(data) is data  # reset fills the tensordict it is given
rollout = env.rollout(max_steps=20, policy=policy)
print("result rollout:", tuple(rollout.batch_size))
assert (rollout["observation"][1:] == rollout["next", "observation"][:-1]).all()
env.close()

env = GymEnv("Pendulum-v1", frame_skip=4)
env.reset()
env.close()

# ---- transforms (TorchRL's tutorial renders pixels here; the TorchRL install this was
# checked against has no pygame, so the transforms below work on state observations)
env = TransformedEnv(GymEnv("CartPole-v1"))
env.append_transform(UnsqueezeTransform(dim=-2, in_keys=["observation"], out_keys=["obs_u"]))
env.append_transform(CatTensors(in_keys=["obs_u"], out_key="obs_and_done", dim=-2))
env.append_transform(StepCounter())
print("result keys:", sorted(env.reset().keys()))
print("result parent of transform 1:", type(env.transform[1].parent).__name__)
print("result base obs spec:", tuple(env.base_env.observation_spec["observation"].shape))
print("result obs spec:", tuple(env.observation_spec["obs_and_done"].shape))
print("result steps:", env.rollout(3)["next", "step_count"].flatten().tolist())
env.close()


# ---- batched envs
def env_make():
    return GymEnv("Pendulum-v1")


parallel_env = ParallelEnv(3, env_make, mp_start_method=mp_context)
parallel_env = ParallelEnv(3, [env_make, env_make, env_make], mp_start_method=mp_context)
parallel_env.reset()
print("result parallel rollout:", tuple(parallel_env.rollout(max_steps=20).batch_size))
selected_envs = parallel_env[1:]
single_env = parallel_env[0]
numpy_selected_envs = parallel_env[np.array([0, 2])]
tensor_selected_envs = parallel_env[torch.tensor([0, 2])]
assert selected_envs.batch_size == torch.Size([2])
assert single_env.batch_size == torch.Size([1])
assert numpy_selected_envs.batch_size == torch.Size([2])
assert tensor_selected_envs.batch_size == torch.Size([2])
print("result subset step:", tuple(selected_envs.rand_step()["next", "reward"].shape))
selected_envs.close(raise_if_closed=False)
parallel_env.rand_step()  # the subset's close left the workers running
parallel_env.close()
out_seed = parallel_env.set_seed(10)  # a closed batched env starts again
print("result started again:", not parallel_env.is_closed)
parallel_env.close()
del parallel_env

# transforms in the workers, and one on the main process
parallel_env = ParallelEnv(
    2,
    [lambda: TransformedEnv(GymEnv("CartPole-v1"), StepCounter(5))] * 2,
    mp_start_method=mp_context,
)
parallel_env = TransformedEnv(
    parallel_env, UnsqueezeTransform(dim=-1, in_keys=["step_count"], out_keys=["count"])
)
data = parallel_env.rollout(10, break_when_any_done=False)
print("result counts:", data["next", "count"][0].flatten().tolist())
parallel_env.close()
del parallel_env

# ---- VecNorm
torch.manual_seed(0)
env = TransformedEnv(GymEnv("Pendulum-v1"), VecNorm())
env.set_seed(0)
data = env.rollout(max_steps=100)
obs = data["observation"]
print("result vecnorm mean ~ 0, std ~ 1:", bool(obs.mean(0).abs().max() < 1),
      bool((obs.std(0) - 1).abs().max() < 0.5))  # fmt: skip
env.close()

make_env = EnvCreator(lambda: TransformedEnv(GymEnv("CartPole-v1"), VecNorm(decay=1.0)))
env = ParallelEnv(3, make_env, mp_start_method=mp_context)
data = env.rollout(max_steps=5)
print("result vecnorm parallel:", tuple(data["observation"].shape))
env.close()
del env
