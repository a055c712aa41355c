"""TorchRL in both directions (``pip install 'aenv[torchrl]'``).

* :class:`TorchRLWrapper`: any TorchRL env (``TransformedEnv``, ``ParallelEnv``, its library
  wrappers) as an aenv env whose calls run off the event loop.
* :func:`to_torchrl` / :class:`AenvTorchRLEnv`: any aenv env, a pool included, as a TorchRL
  ``EnvBase`` for TorchRL's collectors, replay buffers and losses.
* :func:`from_torchrl_spec` / :func:`to_torchrl_spec`: the spec conversions both use.

Both libraries share ``tensordict``: aenv accepts tensordict 0.14.3 and later, so it installs
beside TorchRL 0.14 (which pins tensordict 0.14.x) in one venv. torchrl is imported only when
something here is used; a missing torchrl raises
:class:`~aenv.exceptions.BackendUnavailableError` saying how to install it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from aenv.libs._from_torchrl import TorchRLWrapper
from aenv.libs._torchrl_specs import from_torchrl_spec, to_torchrl_spec, torchrl_module

if TYPE_CHECKING:
    from aenv.libs._to_torchrl import AenvTorchRLEnv, to_torchrl

__all__ = [
    "AenvTorchRLEnv",
    "TorchRLWrapper",
    "from_torchrl_spec",
    "to_torchrl",
    "to_torchrl_spec",
]


def __getattr__(name: str) -> Any:
    # the TorchRL-side class subclasses torchrl's EnvBase: import torchrl only when asked
    if name in ("AenvTorchRLEnv", "to_torchrl"):
        torchrl_module()
        from aenv.libs import _to_torchrl

        return getattr(_to_torchrl, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
