"""TorchRL's getting-started tutorials 0 (envs, transforms) and 3 (collectors), env and
collection parts, on aenv: TorchRL code where only the import block differs (the TorchRL
twin: drop the ``from aenv...`` line, uncomment the ``# torchrl:`` lines).

``TUTORIAL_QUICK=1`` is accepted for symmetry with the other tutorials (this one is short).
"""

import torch

from aenv.torchrl import Collector, GymEnv, RandomPolicy, StepCounter, TransformedEnv, step_mdp

# torchrl: from torchrl.collectors import Collector
# torchrl: from torchrl.envs import GymEnv, StepCounter, TransformedEnv, step_mdp
# torchrl: from torchrl.modules import RandomPolicy


def envs_part():
    env = GymEnv("Pendulum-v1")
    env.set_seed(0)
    reset = env.reset()
    with_action = env.rand_action(reset)
    stepped = env.step(with_action)
    assert stepped is with_action and "next" in stepped.keys()
    nxt = step_mdp(stepped)
    assert torch.equal(nxt["observation"], stepped["next", "observation"])
    rollout = env.rollout(max_steps=10)
    print("result rollout:", tuple(rollout.batch_size), sorted(rollout.keys()))
    transition = rollout[3]
    assert transition.batch_size == torch.Size([])

    counted = TransformedEnv(env, StepCounter(max_steps=10))
    rollout = counted.rollout(max_steps=100)
    truncated = rollout["next", "truncated"].squeeze(-1)
    print("result truncated at:", truncated.nonzero().squeeze(-1).tolist(), len(truncated))
    counted.close()


def collectors_part():
    torch.manual_seed(0)
    env = GymEnv("CartPole-v1")
    env.set_seed(0)
    policy = RandomPolicy(env.action_spec)
    collector = Collector(env, policy, frames_per_batch=200, total_frames=-1)
    data = next(iter(collector))
    ids = data["collector", "traj_ids"]
    done = data["next", "done"].squeeze(-1)
    print("result batch:", tuple(data.batch_size))
    # (the episode count differs from TorchRL's run: its GymEnv.set_seed resets the env
    # at once, aenv's seeds the next reset, so the two runs see different episodes)
    print("episodes ended:", int(done.sum()))
    # a trajectory id changes exactly after each done frame
    assert torch.equal((ids[1:] != ids[:-1]), done[:-1])
    collector.shutdown()


if __name__ == "__main__":
    envs_part()
    collectors_part()
