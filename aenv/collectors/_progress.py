"""Progress bars for collectors: frames collected and frames/s, with tqdm or rich.

``progress=True`` picks tqdm when installed, else rich; ``"tqdm"`` / ``"rich"`` ask for
one (and say how to install it when missing). Both are optional dependencies.
"""

from __future__ import annotations

import importlib.util
import time

from aenv.exceptions import BackendUnavailableError

__all__ = ["Progress", "make_progress"]


class Progress:
    """The interface collectors use: ``update(frames)`` after each batch, ``close()``."""

    def update(self, frames: int) -> None:  # pragma: no cover - interface
        raise NotImplementedError

    def close(self) -> None:  # pragma: no cover - interface
        raise NotImplementedError


class _TqdmProgress(Progress):
    def __init__(self, total: int | None, desc: str) -> None:
        from tqdm.auto import tqdm

        self._bar = tqdm(total=total, desc=desc, unit="frames", unit_scale=True, dynamic_ncols=True)

    def update(self, frames: int) -> None:
        self._bar.update(frames)

    def close(self) -> None:
        self._bar.close()


class _RichProgress(Progress):
    def __init__(self, total: int | None, desc: str) -> None:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            TextColumn,
            TimeElapsedColumn,
        )
        from rich.progress import Progress as RichBar

        self._start = time.perf_counter()
        self._frames = 0
        self._bar = RichBar(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[rate]} frames/s"),
            TimeElapsedColumn(),
        )
        self._bar.start()
        self._task = self._bar.add_task(desc, total=total, rate="-")

    def update(self, frames: int) -> None:
        self._frames += frames
        elapsed = max(time.perf_counter() - self._start, 1e-9)
        self._bar.update(self._task, advance=frames, rate=f"{self._frames / elapsed:,.0f}")

    def close(self) -> None:
        self._bar.stop()


def make_progress(kind: bool | str, total: int | None, desc: str = "collecting") -> Progress | None:
    """A progress bar for ``kind`` (``False``: none; ``True``: tqdm, else rich).

    Raises:
        BackendUnavailableError: the requested library (or, for ``True``, both) is missing.
        ValueError: ``kind`` is not a bool, ``"tqdm"`` or ``"rich"``.
    """
    if kind is False or kind is None:
        return None
    total = total if total is not None and total > 0 else None
    have_tqdm = importlib.util.find_spec("tqdm") is not None
    have_rich = importlib.util.find_spec("rich") is not None
    if kind is True:
        if have_tqdm:
            return _TqdmProgress(total, desc)
        if have_rich:
            return _RichProgress(total, desc)
        raise BackendUnavailableError("progress=True needs tqdm or rich: pip install tqdm")
    if kind == "tqdm":
        if not have_tqdm:
            raise BackendUnavailableError("progress='tqdm' needs tqdm: pip install tqdm")
        return _TqdmProgress(total, desc)
    if kind == "rich":
        if not have_rich:
            raise BackendUnavailableError("progress='rich' needs rich: pip install rich")
        return _RichProgress(total, desc)
    raise ValueError(f"progress must be a bool, 'tqdm' or 'rich', got {kind!r}")
