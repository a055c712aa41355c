"""Which Ray cluster a pool's actors go to, and leaving it as it was found.

A pool either uses the cluster this process is already connected to (``ray.init`` was
called by the user), attaches to one at ``address=``, or starts a local one. The pools of
a process share one connection: the pools that made it count their users, and the last to
close ends it (``ray.shutdown()``: a cluster this process started stops; one it attached
to is only disconnected from, never stopped). A connection the user made is never ended.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Mapping
from typing import Any

from aenv.exceptions import BackendUnavailableError

__all__ = ["connect", "import_ray", "kill_actors", "release"]

logger = logging.getLogger("aenv.pool.ray")

_lock = threading.Lock()
#: pools using the connection a pool made (0: none made, or the user's own)
_users = 0


def import_ray() -> Any:
    """The ``ray`` module, or :class:`~aenv.exceptions.BackendUnavailableError`."""
    try:
        import ray
    except ImportError as exc:
        raise BackendUnavailableError(
            "the 'ray' pool backend needs Ray, which is not installed: "
            "pip install 'aenv[ray]' (or pip install ray)"
        ) from exc
    return ray


def connect(address: str | None, init_options: Mapping[str, Any]) -> bool:
    """Connect this process to a cluster, as the pool asks; log which. Returns True when
    the pool shares a connection pools made (it must :func:`release` it when closing)."""
    global _users
    ray = import_ray()
    with _lock:
        if ray.is_initialized():
            where = _describe(ray)
            if _users:
                _users += 1
                logger.info("ray backend: using the Ray cluster at %s (an earlier pool's)", where)
                return True
            if address is not None:
                logger.warning(
                    "ray backend: address=%r ignored: this process is already connected to the "
                    "Ray cluster at %s",
                    address,
                    where,
                )
            logger.info(
                "ray backend: using the Ray cluster at %s, to which this process is connected",
                where,
            )
            return False
        options = dict(init_options)
        # ray.init() attaches to RAY_ADDRESS when it is set: say so
        address = address or os.environ.get("RAY_ADDRESS") or None
        if address is None or address == "local":
            # the dashboard costs seconds at start and is not needed to host envs
            options.setdefault("include_dashboard", False)
            ray.init(address=address, **options)
            logger.info("ray backend: started a local Ray cluster at %s", _describe(ray))
        else:
            ray.init(address=address, **options)
            logger.info("ray backend: attached to the Ray cluster at %s", _describe(ray))
        _users = 1
        return True


def release() -> None:
    """One pool sharing a pool-made connection is done with it; the last ends it."""
    global _users
    ray = import_ray()
    with _lock:
        if _users == 0:
            return
        _users -= 1
        if _users == 0 and ray.is_initialized():
            ray.shutdown()
            logger.info("ray backend: disconnected from the Ray cluster (the last pool closed)")


def _describe(ray: Any) -> str:
    try:
        context = ray.get_runtime_context()
        address = context.gcs_address
        cpus = ray.cluster_resources().get("CPU", 0)
    except Exception:  # a description only: never fail the connection for it
        return "an unknown address"
    return f"{address}, {cpus:g} CPUs"


def kill_actors(ray: Any, handles: list[Any]) -> None:
    """Kill the actors ``handles`` (clearing the list), where this process is connected."""
    if not ray.is_initialized():
        # disconnected: this driver's actors went with the connection (and any Ray call now
        # would start a new local cluster, Ray's auto-init)
        handles.clear()
        return
    for handle in handles:
        with contextlib.suppress(Exception):  # already dead, or Ray already shut down
            ray.kill(handle, no_restart=True)
    handles.clear()
