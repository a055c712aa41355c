"""TorchRL's "Pendulum: writing your environment and transforms" tutorial, on aenv.

The env code of TorchRL's tutorial (a stateless pendulum whose physical parameters travel
in the tensordict, sin/cos transforms written with ``_apply_to_composite``, a policy
trained by backpropagating through 100-step rollouts), written for this project. It is
TorchRL code: only the import block differs. Its TorchRL twin is this file with the
``from aenv...`` line removed and the ``# torchrl:`` lines uncommented
(``tests/examples/test_torchrl_tutorials.py`` makes it and, where a TorchRL install is
found, runs both and compares the training numbers).

``TUTORIAL_QUICK=1`` runs a few training iterations instead of the tutorial's 31.
"""

import os
from collections import defaultdict

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import TensorDictModule
from torch import nn

from aenv.torchrl import (
    Bounded,
    CatTensors,
    Composite,
    EnvBase,
    Transform,
    TransformedEnv,
    Unbounded,
    UnsqueezeTransform,
    _apply_to_composite,
    check_env_specs,
    step_mdp,
)

# torchrl: from torchrl.data import Bounded, Composite, Unbounded
# torchrl: from torchrl.envs import CatTensors, EnvBase, Transform, TransformedEnv, UnsqueezeTransform
# torchrl: from torchrl.envs.transforms.transforms import _apply_to_composite
# torchrl: from torchrl.envs.utils import check_env_specs, step_mdp

QUICK = os.environ.get("TUTORIAL_QUICK") == "1"
MAX_THETA, MAX_THETA_DOT = torch.pi, 1.0


def wrap_angle(x):
    return ((x + torch.pi) % (2 * torch.pi)) - torch.pi


def physics(g=10.0, batch_size=None):
    """The pendulum's constants, as a tensordict (expanded to ``batch_size`` if given)."""
    consts = dict(max_speed=8.0, max_torque=2.0, dt=0.05, g=g, m=1.0, l=1.0)
    td = TensorDict({"params": TensorDict(consts, [])}, [])
    return td.expand(batch_size).contiguous() if batch_size else td


def specs_from(td):
    """Unbounded specs shaped like the entries of ``td`` (nested tensordicts nest)."""
    return Composite(
        {
            k: specs_from(v)
            if isinstance(v, TensorDictBase)
            else Unbounded(shape=v.shape, dtype=v.dtype, device=v.device)
            for k, v in td.items()
        },
        shape=td.shape,
    )


class Pendulum(EnvBase):
    """A stateless pendulum: everything a step needs is in its input tensordict."""

    batch_locked = False  # any leading batch the parameters come with

    def __init__(self, params=None, seed=None, device="cpu"):
        params = physics() if params is None else params
        super().__init__(device=device, batch_size=[])
        speed, torque = params["params", "max_speed"], params["params", "max_torque"]
        self.observation_spec = Composite(
            th=Bounded(low=-torch.pi, high=torch.pi, shape=(), dtype=torch.float32),
            thdot=Bounded(low=-speed, high=speed, shape=(), dtype=torch.float32),
            params=specs_from(params["params"]),
            shape=(),
        )
        self.state_spec = self.observation_spec.clone()  # the state comes back as input
        self.action_spec = Bounded(low=-torque, high=torque, shape=(1,), dtype=torch.float32)
        self.reward_spec = Unbounded(shape=(*params.shape, 1))
        if seed is None:
            seed = torch.empty((), dtype=torch.int64).random_().item()
        self.set_seed(seed)

    gen_params = staticmethod(physics)

    def _set_seed(self, seed):
        self.rng = torch.Generator()
        if seed is not None:
            self.rng.manual_seed(seed)

    def _reset(self, td):
        if td is None or td.is_empty():
            td = self.gen_params(batch_size=self.batch_size)
        shape = td.shape
        th = (torch.rand(shape, generator=self.rng) * 2 - 1) * MAX_THETA
        thdot = (torch.rand(shape, generator=self.rng) * 2 - 1) * MAX_THETA_DOT
        return TensorDict({"th": th, "thdot": thdot, "params": td["params"]}, batch_size=shape)

    @staticmethod
    def _step(td):
        p = td["params"]
        th, thdot = td["th"], td["thdot"]
        u = td["action"].squeeze(-1).clamp(-p["max_torque"], p["max_torque"])
        cost = wrap_angle(th) ** 2 + 0.1 * thdot**2 + 0.001 * u**2
        acc = 3 * p["g"] / (2 * p["l"]) * th.sin() + 3.0 / (p["m"] * p["l"] ** 2) * u
        new_thdot = (thdot + acc * p["dt"]).clamp(-p["max_speed"], p["max_speed"])
        reward = -cost.view(*td.shape, 1)
        return TensorDict(
            {
                "th": wrap_angle(th + new_thdot * p["dt"]),
                "thdot": new_thdot,
                "params": p,
                "reward": reward,
                "done": torch.zeros_like(reward, dtype=torch.bool),
            },
            td.shape,
        )


class _UnitRange(Transform):
    """Maps an angle to [-1, 1] (sin or cos), at steps and at resets."""

    def _reset(self, tensordict, tensordict_reset):
        return self._call(tensordict_reset)

    @_apply_to_composite
    def transform_observation_spec(self, spec):
        return Bounded(low=-1, high=1, shape=spec.shape, dtype=spec.dtype, device=spec.device)


class Sin(_UnitRange):
    def _apply_transform(self, obs):
        return obs.sin()


class Cos(_UnitRange):
    def _apply_transform(self, obs):
        return obs.cos()


def make_env(seed=0):
    env = TransformedEnv(
        Pendulum(seed=seed),
        UnsqueezeTransform(dim=-1, in_keys=["th", "thdot"], in_keys_inv=["th", "thdot"]),
    )
    env.append_transform(Sin(in_keys=["th"], out_keys=["sin"]))
    env.append_transform(Cos(in_keys=["th"], out_keys=["cos"]))
    env.append_transform(
        CatTensors(in_keys=["sin", "cos", "thdot"], dim=-1, out_key="observation", del_keys=False)
    )
    return env


def hand_rollout(env, steps):
    """reset, then step / step_mdp by hand into a preallocated tensordict."""
    data = TensorDict(batch_size=[steps])
    td = env.reset()
    for i in range(steps):
        td["action"] = env.action_spec.rand()
        td = env.step(td)
        data[i] = td
        td = step_mdp(td, keep_other=True)
    return data


def main():
    base = Pendulum(seed=0)
    check_env_specs(base)
    td = base.rand_step(base.reset())
    assert td["next", "reward"].shape == (1,)

    env = make_env()
    check_env_specs(env)
    print("hand rollout:", hand_rollout(env, 10).batch_size)

    batch = 10
    td = env.reset(env.gen_params(batch_size=[batch]))  # 10 pendulums in one env
    td = env.rand_step(td)
    r = env.rollout(3, auto_reset=False, tensordict=env.reset(env.gen_params(batch_size=[batch])))
    print("batched rollout:", tuple(r.batch_size))

    torch.manual_seed(0)
    env.set_seed(0)
    net = nn.Sequential(
        nn.LazyLinear(64), nn.Tanh(), nn.LazyLinear(64), nn.Tanh(), nn.LazyLinear(64), nn.Tanh(),
        nn.LazyLinear(1),
    )  # fmt: skip
    policy = TensorDictModule(net, in_keys=["observation"], out_keys=["action"])
    optim = torch.optim.Adam(policy.parameters(), lr=2e-3)
    batch, n_iter = 32, (2 * 32 if QUICK else 1000)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optim, n_iter)
    logs = defaultdict(list)
    for _ in range(n_iter // batch):
        init = env.reset(env.gen_params(batch_size=[batch]))
        rollout = env.rollout(100, policy, tensordict=init, auto_reset=False)
        ret = rollout["next", "reward"].mean()
        (-ret).backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        optim.step()
        optim.zero_grad()
        scheduler.step()
        logs["return"].append(ret.item())
        logs["last_reward"].append(rollout[..., -1]["next", "reward"].mean().item())
    print("returns:", " ".join(f"{x:.6f}" for x in logs["return"]))
    print("last rewards:", " ".join(f"{x:.6f}" for x in logs["last_reward"]))


if __name__ == "__main__":
    main()
