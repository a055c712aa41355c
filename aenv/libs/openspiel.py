"""OpenSpiel as aenv multi-agent envs (``pip install 'aenv[openspiel]'``): :class:`OpenSpielWrapper`
(a ``pyspiel.Game`` or ``State``) and :class:`OpenSpielEnv` (a game by name), with
:func:`sample_chance`, the chance sampler both use. pyspiel is imported only when an env is
built."""

from __future__ import annotations

from aenv.libs._openspiel import OpenSpielEnv, OpenSpielWrapper, sample_chance

__all__ = ["OpenSpielEnv", "OpenSpielWrapper", "sample_chance"]
