"""Runs peer workloads (TorchRL, Gymnasium) in their own venv and returns their numbers.

TorchRL 0.14.1 pins ``tensordict<0.15`` while aenv needs tensordict 0.15, so the peers live
in a separate venv, ``benchmarks/_venvs/<name>`` (gitignored), created on first use from
pinned versions. Each workload is a script ``benchmarks/peers/<script>.py`` that takes its
params as one JSON object in ``argv[1]`` and prints one JSON line; :func:`run_peer` runs it
in a subprocess and returns that line as a dict.

Example:
    >>> from benchmarks._peers import run_peer
    >>> result = run_peer("torchrl_rollout", quick=True)  # doctest: +SKIP
    >>> result["counting_steps_per_s"] > 0  # doctest: +SKIP
    True

Command line: ``python benchmarks/_peers.py [--quick] [script ...]`` runs the given peer
scripts (all by default) and prints a table of their results.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "PEER_SCRIPTS",
    "PEER_VENVS",
    "PeerRunError",
    "PeerVenv",
    "ensure_peer_venv",
    "peer_venv_problem",
    "peer_versions",
    "run_peer",
]

BENCH_DIR = Path(__file__).resolve().parent
PEERS_DIR = BENCH_DIR / "peers"
VENVS_DIR = BENCH_DIR / "_venvs"

# Every peer workload, with the venv it runs in (None: the current interpreter also works,
# but the peer venv is used by default so all peers report the same library versions).
PEER_SCRIPTS: dict[str, str] = {
    "torchrl_rollout": "torchrl",
    "torchrl_serial": "torchrl",
    "torchrl_async_pool": "torchrl",
    "torchrl_parallel_cartpole": "torchrl",
    "gym_vector_cartpole": "torchrl",
    "torchrl_gymenv_cartpole": "torchrl",
    "torchrl_collector_latency": "torchrl",
    "torchrl_agents": "torchrl",
    "envpool_cartpole": "envpool",
}


class PeerRunError(RuntimeError):
    """Raised when a peer venv cannot be built or a peer script fails or prints no result."""


@dataclass(frozen=True)
class PeerVenv:
    """A pinned venv for peers: what to install and what must import afterwards."""

    name: str
    requirements: tuple[str, ...]
    check: str

    @property
    def path(self) -> Path:
        return VENVS_DIR / self.name

    @property
    def python(self) -> Path:
        return self.path / "bin" / "python"

    @property
    def stamp(self) -> Path:
        return self.path / "aenv-peer-requirements.txt"


# torchrl 0.14.1 is the newest release; it requires tensordict>=0.14.3,<0.15 and any
# torch>=2.1. torch is pinned to the CPU 2.13.0 wheel aenv uses (an unpinned torch pulls a
# multi-GB CUDA build). torchrl's C++ extension (prioritized replay samplers only) does not
# load against torch 2.13.0; nothing measured here uses it.
PEER_VENVS: dict[str, PeerVenv] = {
    "torchrl": PeerVenv(
        name="torchrl",
        requirements=(
            "torch==2.13.0",
            "torchrl==0.14.1",
            "tensordict==0.14.3",
            "gymnasium==1.4.0",
            "numpy>=2",
        ),
        check="import torch, torchrl, tensordict, gymnasium, numpy; from torchrl.envs import AsyncEnvPool",
    ),
    # verifiers 0.3.1: the last release with a ``ToolEnv`` (0.4.0 dropped it); bench_llm
    # drives it against its loopback model and tool servers. No torch; openai, httpx and
    # datasets pinned at the versions the measured run used.
    "verifiers031": PeerVenv(
        name="verifiers031",
        requirements=(
            "verifiers==0.3.1",
            "openai==3.57.0",
            "httpx==0.28.1",
            "datasets==5.2.0",
        ),
        check="import verifiers as vf, openai, httpx, datasets; vf.ToolEnv",
    ),
    # EnvPool ships C++ envs in a manylinux wheel (cp311 here); no torch needed.
    "envpool": PeerVenv(
        name="envpool",
        requirements=("envpool==1.2.5", "gymnasium==1.4.0", "numpy>=2"),
        check="import envpool, gymnasium, numpy",
    ),
}


# Venvs already checked by this process: the import probe costs seconds, so it runs once.
_READY: dict[str, Path] = {}


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Holds an exclusive file lock, so two processes never build one venv at once."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        try:
            import fcntl
        except ImportError:  # pragma: no cover - not POSIX
            yield
            return
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def peer_venv_problem(name: str) -> str | None:
    """Says why the peer venv ``name`` cannot be used as it is, or None when it can.

    Builds nothing: for runs that use a peer venv only where one is already there (quick
    mode in CI). Ready means: its python exists, it was built from the pinned requirements
    (its stamp matches) and its check imports work.

    Raises:
        KeyError: ``name`` is not a known peer venv.
    """
    venv = PEER_VENVS[name]
    if not venv.python.exists():
        return f"no venv at {venv.path}"
    if not venv.stamp.exists() or venv.stamp.read_text().split() != list(venv.requirements):
        return f"{venv.path} was not built from the pins ({', '.join(venv.requirements)})"
    probe = subprocess.run(
        [str(venv.python), "-c", venv.check], capture_output=True, text=True, timeout=300
    )
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["?"])[-1]
        return f"imports fail in {venv.path}: {last[:200]}"
    return None


def _venv_ok(venv: PeerVenv) -> bool:
    return peer_venv_problem(venv.name) is None


def _run_step(cmd: list[str], quiet: bool, what: str) -> None:
    out = subprocess.run(
        cmd,
        stdout=subprocess.PIPE if quiet else None,
        stderr=subprocess.STDOUT if quiet else None,
        text=True,
    )
    if out.returncode != 0:
        tail = (out.stdout or "")[-4000:]
        raise PeerRunError(f"{what} failed (exit {out.returncode}): {' '.join(cmd)}\n{tail}")


def ensure_peer_venv(name: str = "torchrl", quiet: bool = True) -> Path:
    """Returns the python of the peer venv ``name``, creating it first if needed.

    Idempotent: a venv already there whose pinned requirements match and whose imports work
    is re-used as is (checked once per process); otherwise it is (re)built with ``python -m venv`` and ``pip install``.

    Args:
        name: a key of :data:`PEER_VENVS`.
        quiet: hide pip's output (shown in the error if the install fails).

    Raises:
        KeyError: ``name`` is not a known peer venv.
        PeerRunError: the venv could not be built or its imports fail after the install.
    """
    venv = PEER_VENVS[name]
    if name in _READY and venv.python.exists():
        return _READY[name]
    with _locked(VENVS_DIR / f".{name}.lock"):
        if _venv_ok(venv):
            _READY[name] = venv.python
            return venv.python
        if not venv.python.exists():
            _run_step([sys.executable, "-m", "venv", str(venv.path)], quiet, "venv creation")
        pip = [str(venv.python), "-m", "pip", "install", "--disable-pip-version-check"]
        if quiet:
            pip.append("--quiet")
        _run_step([*pip, *venv.requirements], quiet, f"pip install into {venv.path}")
        probe = subprocess.run(
            [str(venv.python), "-c", venv.check], capture_output=True, text=True, timeout=300
        )
        if probe.returncode != 0:
            raise PeerRunError(
                f"peer venv {name!r} built but its imports fail:\n{probe.stderr[-4000:]}"
            )
        venv.stamp.write_text("\n".join(venv.requirements) + "\n")
        _READY[name] = venv.python
        return venv.python


def _parse_result(stdout: str) -> dict[str, Any] | None:
    for line in reversed(stdout.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                value = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(value, dict):
                return value
    return None


def run_peer(
    script: str,
    *,
    venv: str | None = "torchrl",
    timeout: float = 900.0,
    **params: Any,
) -> dict[str, Any]:
    """Runs ``benchmarks/peers/<script>.py`` in a peer venv and returns its JSON result.

    Args:
        script: the workload's file name without ``.py`` (see :data:`PEER_SCRIPTS`).
        venv: the peer venv to run in (built on first use), or None for this interpreter.
        timeout: seconds before the subprocess is killed.
        **params: the workload's params (``quick=True`` selects its quick-mode set).

    Returns:
        The dict the script printed, with its ``"params"`` and ``"versions"``.

    Raises:
        PeerRunError: the script exited non-zero, timed out, or printed no JSON object;
            the message holds the tail of its stderr.
    """
    path = PEERS_DIR / f"{script}.py"
    if not path.is_file():
        raise PeerRunError(f"no peer script {path}")
    python = ensure_peer_venv(venv) if venv is not None else Path(sys.executable)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env["PYTHONUNBUFFERED"] = "1"
    cmd = [str(python), str(path), json.dumps(params)]
    try:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=str(BENCH_DIR)
        )
    except subprocess.TimeoutExpired as exc:
        err = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else exc.stderr
        raise PeerRunError(
            f"peer {script} timed out after {timeout}s\n--- stderr tail ---\n{(err or '')[-4000:]}"
        ) from exc
    result = _parse_result(proc.stdout)
    if proc.returncode != 0 or result is None:
        raise PeerRunError(
            f"peer {script} failed (exit {proc.returncode}, "
            f"{'no JSON result' if result is None else 'result printed'})\n"
            f"--- stderr tail ---\n{proc.stderr[-4000:]}"
        )
    return result


def peer_versions(name: str = "torchrl") -> dict[str, str]:
    """Returns the library versions installed in the peer venv ``name`` (built if needed)."""
    python = ensure_peer_venv(name)
    code = (
        "import json; from importlib import metadata as m; "
        f"print(json.dumps({{d: m.version(d) for d in {list(_dists(name))!r}}}))"
    )
    proc = subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        raise PeerRunError(f"cannot read versions of peer venv {name!r}:\n{proc.stderr[-2000:]}")
    return dict(json.loads(proc.stdout))


def _dists(name: str) -> list[str]:
    reqs = PEER_VENVS[name].requirements
    return [r.split("=")[0].split(">")[0].split("<")[0].strip() for r in reqs]


def _flatten(prefix: str, value: Any, out: dict[str, Any]) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            _flatten(f"{prefix}.{k}" if prefix else str(k), v, out)
    else:
        out[prefix] = value


def main(argv: list[str] | None = None) -> int:
    """Command-line entry: run peers and print one row per reported number."""
    sys.path.insert(0, str(BENCH_DIR))
    from _common import print_table

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("scripts", nargs="*", default=list(PEER_SCRIPTS))
    parser.add_argument("--quick", action="store_true", help="small sizes, seconds each")
    args = parser.parse_args(argv)
    for script in args.scripts:
        result = run_peer(script, venv=PEER_SCRIPTS.get(script, "torchrl"), quick=args.quick)
        versions = result.pop("versions", {})
        params = result.pop("params", {})
        flat: dict[str, Any] = {}
        _flatten("", result, flat)
        rows = [{"metric": k, "value": v} for k, v in flat.items()]
        print_table(f"{script} (params {json.dumps(params)}; {json.dumps(versions)})", rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
