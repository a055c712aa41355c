"""Building a pool's envs in this process: what keeps a build of thousands of envs cheap.

* :func:`paused_gc`: the cyclic garbage collector paused while the envs are built. A build
  allocates tens of container objects per env and keeps all of them, so every collection
  run during it walks everything built so far for nothing; at 8,192 latency envs that was
  about half of the build's time.
* :func:`share_specs`: envs whose specs are equal hold one copy of them
  (:meth:`~aenv.EnvBase._share_specs`), which leaves a few objects per env instead of
  dozens, for memory and for every later collection.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator, Sequence
from typing import Any

from aenv.envs._common import EnvBase
from aenv.envs._utils import EnvMetaData

__all__ = ["env_metadata", "paused_gc", "share_specs"]

# distinct spec sets tried per env: a pool mixes few kinds of envs; beyond that, an env
# keeps its own specs rather than paying a comparison per kind
_MAX_KINDS = 4


@contextlib.contextmanager
def paused_gc() -> Iterator[None]:
    """Pause the cyclic garbage collector for the block (if it was on); garbage made in
    it is collected by the next collection after."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()


def share_specs(envs: Sequence[EnvBase]) -> None:
    """Let envs with equal, locked specs share one copy of them."""
    kinds: list[EnvBase] = []
    for env in envs:
        if not any(env._share_specs(kind) for kind in kinds) and len(kinds) < _MAX_KINDS:
            kinds.append(env)


def env_metadata(envs: Sequence[EnvBase]) -> list[EnvMetaData]:
    """Each env's :class:`~aenv.envs._utils.EnvMetaData`, one object for the envs that
    would give equal ones: the same class and ``repr``, batch size, device and batch lock,
    holding the same shared spec objects (locked, so never changed in place)."""
    metas: list[EnvMetaData] = []
    kinds: dict[tuple[Any, ...], EnvMetaData] = {}
    for env in envs:
        if env._spec_share is None:
            metas.append(EnvMetaData.metadata_from_env(env))
            continue
        d = env.__dict__
        key = (
            type(env),
            repr(env),
            id(d["output_spec"]),
            id(d["input_spec"]),
            env.batch_size,
            env.device,
            env.batch_locked,
        )
        meta = kinds.get(key)
        if meta is None:
            meta = EnvMetaData.metadata_from_env(env)
            if len(kinds) < _MAX_KINDS:
                kinds[key] = meta
        metas.append(meta)
    return metas
