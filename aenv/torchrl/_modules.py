"""TorchRL's modules and losses that look an action spec up by its class, taking aenv specs.

TorchRL's ``QValueModule`` / ``QValueActor`` / ``DQNLoss`` (and the distributional and
discrete-SAC ones) decide the action space from the spec's class, which must be one of
TorchRL's own (an aenv ``OneHot`` gives ``TypeError: unhashable type: 'OneHot'``). The
classes here are TorchRL's, subclassed only to convert an aenv spec given as ``spec=`` or
``action_space=`` with the TorchRL bridge's converter
(:func:`~aenv.libs.torchrl.to_torchrl_spec`) before TorchRL sees it; everything else is
TorchRL's. They exist where torchrl is installed (``pip install 'aenv[torchrl]'``) and are
built on first use, so importing :mod:`aenv.torchrl` never imports torchrl.

Example:
    >>> from aenv.torchrl import DQNLoss, GymEnv, QValueActor
    >>> env = GymEnv("CartPole-v1")
    >>> actor = QValueActor(net, in_keys=["observation"], spec=env.action_spec)
    >>> loss = DQNLoss(actor, action_space=env.action_spec)
"""

from __future__ import annotations

import functools
import importlib
from typing import Any

from aenv.specs import TensorSpec

__all__ = ["ADAPTED", "adapted_class"]

#: name -> (TorchRL module, the keyword arguments that may hold a spec)
ADAPTED: dict[str, tuple[str, tuple[str, ...]]] = {
    "QValueModule": ("torchrl.modules", ("spec",)),
    "QValueActor": ("torchrl.modules", ("spec", "action_space")),
    "DistributionalQValueModule": ("torchrl.modules", ("spec",)),
    "DistributionalQValueActor": ("torchrl.modules", ("spec", "action_space")),
    "DQNLoss": ("torchrl.objectives", ("action_space",)),
    "DistributionalDQNLoss": ("torchrl.objectives", ("action_space",)),
    "DiscreteSACLoss": ("torchrl.objectives", ("action_space",)),
}


def _torchrl_spec(value: Any) -> Any:
    if isinstance(value, TensorSpec):
        from aenv.libs._torchrl_specs import to_torchrl_spec

        return to_torchrl_spec(value)
    return value


@functools.cache
def adapted_class(name: str) -> type:
    """TorchRL's class ``name`` (a key of :data:`ADAPTED`), taking aenv specs."""
    from aenv.libs._torchrl_specs import torchrl_module

    torchrl_module()  # (a missing torchrl says how to install it)
    module, keys = ADAPTED[name]
    base: type = getattr(importlib.import_module(module), name)

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        for key in keys:
            if key in kwargs:
                kwargs[key] = _torchrl_spec(kwargs[key])
        base.__init__(self, *args, **kwargs)  # type: ignore[misc]

    doc = (
        f"TorchRL's ``{module}.{name}``, taking an aenv spec as "
        + " or ".join(f"``{k}=``" for k in keys)
        + " (converted with :func:`~aenv.libs.torchrl.to_torchrl_spec`)."
    )
    namespace = {"__init__": __init__, "__doc__": doc, "__module__": __name__}
    return type(base)(name, (base,), namespace)  # type: ignore[no-any-return]


def __getattr__(name: str) -> Any:
    # (pickle finds the classes here by their module and name)
    if name in ADAPTED:
        return adapted_class(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
