"""Fixes for the older dependency versions aenv accepts; imported first by :mod:`aenv`.

tensordict 0.14 (the series TorchRL 0.14 pins) writes ``LAZY_LEGACY_OP="None"`` into
``os.environ`` whenever one of its ``set_lazy_legacy`` blocks exits (heterogeneous stacks
enter one). A child process inheriting that value (a process pool's workers, a script run
from the parent) fails on every ``torch.stack`` of TensorDicts ("invalid truth value
'none'"). The value means "unset", so it is dropped here, before tensordict is imported.
"""

from __future__ import annotations

import os

if os.environ.get("LAZY_LEGACY_OP") == "None":
    del os.environ["LAZY_LEGACY_OP"]
