"""Policies for rollouts and collectors: what a policy is, and wrapping plain callables.

A rollout or a collector takes a ``TensorDictModule``, any callable on a tensordict, an
``async`` callable, or a plain callable on observation tensors (an ``nn.Sequential`` on the
observation, say), which :func:`make_policy` wraps to read the observations and write the
actions, as TorchRL does.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModule, TensorDictModuleBase

from aenv._mdp import NestedKey, unravel

if TYPE_CHECKING:
    from aenv.envs._common import EnvBase

__all__ = ["is_async_policy", "make_policy"]

_TD_PARAM_NAMES = frozenset(("tensordict", "td"))


def is_async_policy(policy: Any) -> bool:
    """Whether calling ``policy`` returns an awaitable (``async def`` function or method)."""
    if inspect.iscoroutinefunction(policy):
        return True
    call = getattr(policy, "__call__", None)  # noqa: B004 - any object with an async __call__
    if call is not None and inspect.iscoroutinefunction(call):
        return True
    forward = getattr(policy, "forward", None)
    return isinstance(policy, torch.nn.Module) and inspect.iscoroutinefunction(forward)


def _signature_target(policy: Any) -> Any:
    if isinstance(policy, torch.nn.Module):
        return policy.forward
    return policy


def _takes_tensordict(params: list[inspect.Parameter]) -> bool:
    if len(params) != 1:
        return False
    param = params[0]
    if param.name in _TD_PARAM_NAMES:
        return True
    ann = param.annotation
    if isinstance(ann, str):
        return "TensorDict" in ann
    return isinstance(ann, type) and issubclass(ann, TensorDictBase)


def make_policy(
    policy: Callable[..., Any] | None, env: EnvBase, *, trust_policy: bool = False
) -> Callable[..., Any] | None:
    """The callable a collector runs for ``policy`` (None stays None: random actions).

    ``TensorDictModuleBase`` instances, ``async`` policies, trusted policies and callables
    whose signature takes one tensordict (a parameter named ``tensordict`` or ``td``, or
    typed as a TensorDict) are used as they are. Other callables are wrapped in a
    ``TensorDictModule`` reading observations and writing ``env.action_keys``: the
    observations named by the parameters when they all are observation keys, else every
    observation key, in spec order, when their number matches.

    Raises:
        TypeError: ``policy`` is not callable, or its parameters match no observations.
    """
    if policy is None:
        return None
    if not callable(policy):
        raise TypeError(f"the policy must be callable, got {type(policy).__name__}")
    if trust_policy or isinstance(policy, TensorDictModuleBase) or is_async_policy(policy):
        return policy
    try:
        sig = inspect.signature(_signature_target(policy))
    except (TypeError, ValueError):
        return policy  # builtins and C callables: nothing to inspect, trust them
    params = [
        p
        for p in sig.parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty
    ]
    if _takes_tensordict(params):
        return policy
    obs_keys: list[NestedKey] = list(env.observation_keys)
    by_leaf = {unravel(k)[-1]: k for k in obs_keys}
    names = [p.name for p in params]
    if names and all(n in by_leaf for n in names):
        in_keys = [by_leaf[n] for n in names]
    elif len(params) == len(obs_keys) and obs_keys:
        in_keys = obs_keys
    else:
        raise TypeError(
            f"cannot tell how to call the policy {policy!r}: its parameters {names} are not "
            f"observation keys {obs_keys} nor as many as them. Pass a "
            "tensordict.nn.TensorDictModule, a callable taking a tensordict "
            "(`def policy(tensordict)`), or trust_policy=True."
        )
    return TensorDictModule(policy, in_keys=in_keys, out_keys=list(env.action_keys))  # type: ignore[arg-type]
