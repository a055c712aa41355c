"""TorchRL's "collector trajectory assembly" tutorial on aenv: fixed-size batches that mix
trajectories, ``split_trajectories`` (padded and nested), whole trajectories with
``trajs_per_batch`` (padded and concatenated), and background collection into a buffer
with ``start()`` / ``async_shutdown()``. TorchRL code where only the import block differs
(the TorchRL twin: drop the ``from aenv...`` line, uncomment the ``# torchrl:`` lines).

TorchRL's replay buffers are not part of aenv: the buffer here is a small list with
``extend``, the interface a collector writes to. ``TUTORIAL_QUICK=1`` is accepted for
symmetry with the other tutorials.
"""

import time

import torch

from aenv.torchrl import Collector, GymEnv, RandomPolicy, split_trajectories

# torchrl: from torchrl.collectors import Collector
# torchrl: from torchrl.collectors.utils import split_trajectories
# torchrl: from torchrl.envs import GymEnv
# torchrl: from torchrl.modules import RandomPolicy


class ListBuffer:
    """What a collector with ``replay_buffer=`` needs: ``extend``."""

    def __init__(self):
        self.batches = []

    def extend(self, data):
        self.batches.append(data)

    def __len__(self):
        return sum(b.numel() for b in self.batches)


def make_env():
    env = GymEnv("CartPole-v1")
    env.set_seed(0)
    return env


torch.manual_seed(0)
env = make_env()
policy = RandomPolicy(env.action_spec)
collector = Collector(env, policy, frames_per_batch=200, total_frames=-1)
data = next(iter(collector))
done = data["next", "done"].squeeze(-1)
ids = data["collector", "traj_ids"]
assert torch.equal(ids[1:] != ids[:-1], done[:-1])  # a new id after every done frame

split = split_trajectories(data)
n_traj = ids.unique().numel()
print(
    "result split:", tuple(split.shape) == (n_traj, int(split["collector", "mask"].sum(-1).max()))
)
assert int(split["collector", "mask"].sum()) == 200
assert split["next", "done"].shape == (*split.shape, 1)
nested = split_trajectories(data, as_nested=True)
print("result nested:", nested.batch_size[0] == n_traj, nested["next", "done"].is_nested)
padded_again = nested["next", "observation"].to_padded_tensor(0.0)
assert torch.equal(padded_again, split["next", "observation"])
collector.shutdown()

collector_trajs = Collector(
    make_env(), policy, frames_per_batch=200, total_frames=-1, trajs_per_batch=5,
    traj_format="padded",
)  # fmt: skip
traj_data = next(iter(collector_trajs))
mask = traj_data["collector", "mask"]
print("result padded trajs:", traj_data.shape[0])
lengths = mask.sum(-1)
last = traj_data["next", "done"].squeeze(-1)[torch.arange(5), lengths - 1]
print("result every trajectory ends on done:", bool(last.all()))
collector_trajs.shutdown()

collector_cat = Collector(
    make_env(), policy, frames_per_batch=200, total_frames=-1, trajs_per_batch=5,
    traj_format="cat",
)  # fmt: skip
traj_data_cat = next(iter(collector_cat))
print("result cat dones:", int(traj_data_cat["next", "done"].sum()), traj_data_cat.ndim)
assert bool(traj_data_cat["next", "done"][-1])
collector_cat.shutdown()

buffer = ListBuffer()
collector_async = Collector(
    make_env(), policy, replay_buffer=buffer, frames_per_batch=200, total_frames=-1
)
collector_async.start()
for _ in range(600):  # up to a minute on a loaded machine
    if len(buffer) > 0:
        break
    time.sleep(0.1)
collector_async.async_shutdown()
print("result background collection:", len(buffer) >= 200)
