"""SyncDataCollector: the seeds' collector for plain scripts, over the async Collector."""

from __future__ import annotations

import threading
import warnings
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any

from tensordict import TensorDictBase

from aenv.collectors._collector import Collector
from aenv.collectors._progress import make_progress
from aenv.collectors._trajs import OutOfFrames
from aenv.sync._runner import Runner, get_runner

__all__ = ["SyncDataCollector"]


class SyncDataCollector:
    """The seeds' ``SyncDataCollector``: iterate batches from sync code.

    A facade over :class:`~aenv.collectors.Collector` (same arguments, same meaning, plus
    ``runner``: the loop runner to use; the keyword arguments go to the collector as they
    are); every batch is one call through aenv's loop runner. It collects in lockstep
    unless ``streaming=True`` is passed (with a pool), so batches are ``[*env.batch_size,
    T]`` as in the seeds.

    Example:
        >>> from aenv import GymEnv
        >>> from tensordict.nn import TensorDictModule
        >>> from torch import nn
        >>> policy = TensorDictModule(nn.Linear(3, 1), in_keys=["observation"],
        ...                           out_keys=["action"])
        >>> collector = SyncDataCollector(lambda: GymEnv("Pendulum-v1"), policy,
        ...                               frames_per_batch=200, total_frames=2000,
        ...                               max_frames_per_traj=50)
        >>> for data in collector:
        ...     assert data.names[-1] == "time"
        >>> collector.shutdown()
    """

    def __init__(
        self,
        create_env_fn: Any,
        policy: Callable[..., Any] | None = None,
        *,
        runner: Runner | None = None,
        **kwargs: Any,
    ) -> None:
        # Collector's keyword arguments, as they are, but lockstep unless asked
        kwargs.setdefault("streaming", False)
        self.__dict__["_runner"] = runner
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            collector = Collector(create_env_fn, policy, **kwargs)
        for w in caught:  # re-issued so that they point at the caller's line
            warnings.warn(w.message, w.category, stacklevel=2)
        self.__dict__["collector"] = collector

    @property
    def collector(self) -> Collector:
        """The async collector doing the work."""
        return self.__dict__["collector"]  # type: ignore[no-any-return]

    def _run(self, fn: Callable[..., Any], *args: Any) -> Any:
        runner = self.__dict__["_runner"] or get_runner()
        return runner.run(fn, *args)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.collector, name)

    def __repr__(self) -> str:
        return repr(self.collector).replace("Collector(", "SyncDataCollector(", 1)

    # ------------------------------------------------------------------ collecting
    def iterator(self) -> Iterator[TensorDictBase | None]:
        """Yield batches until ``total_frames`` were collected (forever if -1)."""
        c = self.collector
        progress = make_progress(c._progress_kind, c.total_frames)
        try:
            while c._more():
                try:
                    out = self._run(c._next_batch)
                except OutOfFrames:
                    break
                if progress is not None:
                    progress.update(c._last_numel)
                yield out
            self._run(c._engine.drain)
        finally:
            if progress is not None:
                progress.close()

    def __iter__(self) -> Iterator[TensorDictBase | None]:
        return self.iterator()

    def __len__(self) -> int:
        return len(self.collector)

    def rollout(self) -> TensorDictBase:
        """Collect one batch (before ``split_trajs`` and ``postproc``)."""
        return self._run(self.collector.rollout)  # type: ignore[no-any-return]

    # ------------------------------------------------------------------ control
    def reset(self, index: Any = None, **kwargs: Any) -> None:
        """Reset the envs (all, or those at ``index``)."""
        if kwargs:
            raise TypeError(f"unexpected arguments to reset: {sorted(kwargs)}")
        self._run(self.collector.reset, index)

    def set_seed(self, seed: int, static_seed: bool = False) -> int:
        """Seed the envs; returns the last env's seed (6 envs, seed 1 -> 6)."""
        return self._run(self.collector.set_seed, seed, static_seed)  # type: ignore[no-any-return]

    def state_dict(self) -> OrderedDict[str, Any]:
        """The policy's and env's state, and the collector's counters."""
        return self.collector.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any], **kwargs: Any) -> None:
        """Restore what :meth:`state_dict` returned."""
        self.collector.load_state_dict(state_dict, **kwargs)

    def update_policy_weights_(self, policy_weights: TensorDictBase | None = None) -> None:
        """Copy new weights into the policy the collector runs."""
        self.collector.update_policy_weights_(policy_weights)

    def start(self) -> None:
        """Collect into the ``replay_buffer`` in a background thread until ``total_frames``
        or :meth:`async_shutdown` (TorchRL's ``start()``)."""
        if self.collector.replay_buffer is None:
            raise RuntimeError("start() collects into a replay buffer: pass replay_buffer=...")
        if self.__dict__.get("_thread") is not None:
            raise RuntimeError("the collector was started already")
        stop = threading.Event()

        def collect() -> None:
            try:
                for _ in self:
                    if stop.is_set():
                        break
            except Exception as exc:  # kept for async_shutdown to raise
                self.__dict__["_thread_error"] = exc

        thread = threading.Thread(target=collect, name="aenv-collector", daemon=True)
        self.__dict__.update(_thread=thread, _stop=stop, _thread_error=None)
        thread.start()

    def async_shutdown(self, timeout: float | None = None) -> None:
        """Stop what :meth:`start` began (after the batch in progress), then shut down;
        re-raises an error the background collection met."""
        thread = self.__dict__.get("_thread")
        if thread is not None:
            self.__dict__["_stop"].set()
            thread.join(timeout)
            if thread.is_alive():
                raise TimeoutError(f"the collector thread did not stop within {timeout} s")
            self.__dict__["_thread"] = None
        self.shutdown()
        error = self.__dict__.pop("_thread_error", None)
        if error is not None:
            raise error

    def shutdown(self) -> None:
        """Close the env and stop collecting; idempotent."""
        if not self.collector._closed:
            self._run(self.collector.ashutdown)

    def __enter__(self) -> SyncDataCollector:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
