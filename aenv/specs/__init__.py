"""Specs: descriptions of the shape, dtype, device and domain of env inputs and outputs.

Shapes always include batch dims. ``Composite`` nests specs under (nested) keys; the leaves
are ``Unbounded``, ``Bounded``, ``Categorical``, ``OneHot``, ``Binary``, ``MultiCategorical``,
``MultiOneHot`` and ``NonTensor``; ``torch.stack`` on specs gives a plain spec, a ``Stacked``
leaf stack or a ``StackedComposite``. TorchRL's legacy names are kept as aliases.
"""

from __future__ import annotations

from ._base import TensorSpec
from ._composite import Composite, CompositeSpec, SpecKeys
from ._discrete import Categorical, DiscreteTensorSpec, OneHot, OneHotDiscreteTensorSpec
from ._gym import from_gym_space, to_gym_space
from ._leaves import (
    Binary,
    BinaryDiscreteTensorSpec,
    Bounded,
    BoundedTensorSpec,
    NonTensor,
    NonTensorSpec,
    Unbounded,
    UnboundedContinuousTensorSpec,
    UnboundedDiscreteTensorSpec,
)
from ._multi import (
    MultiCategorical,
    MultiDiscreteTensorSpec,
    MultiOneHot,
    MultiOneHotDiscreteTensorSpec,
)
from ._stacked import Stacked, StackedComposite
from ._stacking import stack_specs
from ._utils import make_composite_from_td

__all__ = [
    "Binary",
    "BinaryDiscreteTensorSpec",
    "Bounded",
    "BoundedTensorSpec",
    "Categorical",
    "Composite",
    "CompositeSpec",
    "DiscreteTensorSpec",
    "MultiCategorical",
    "MultiDiscreteTensorSpec",
    "MultiOneHot",
    "MultiOneHotDiscreteTensorSpec",
    "NonTensor",
    "NonTensorSpec",
    "OneHot",
    "OneHotDiscreteTensorSpec",
    "SpecKeys",
    "Stacked",
    "StackedComposite",
    "TensorSpec",
    "Unbounded",
    "UnboundedContinuousTensorSpec",
    "UnboundedDiscreteTensorSpec",
    "from_gym_space",
    "make_composite_from_td",
    "stack_specs",
    "to_gym_space",
]
