"""Property tests: rand() is always in its spec, project() always lands inside."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from aenv.specs import (
    Binary,
    Bounded,
    Categorical,
    Composite,
    MultiCategorical,
    MultiOneHot,
    OneHot,
    TensorSpec,
    Unbounded,
)

batch_shapes = st.lists(st.integers(1, 3), min_size=0, max_size=2).map(tuple)


@st.composite
def leaf_specs(draw) -> TensorSpec:
    batch = draw(batch_shapes)
    kind = draw(st.sampled_from(["unb", "bnd", "ibnd", "cat", "oh", "bin", "mcat", "moh"]))
    if kind == "unb":
        dtype = draw(st.sampled_from([torch.float32, torch.float64, torch.int64, torch.bool]))
        return Unbounded((*batch, draw(st.integers(1, 3))), dtype=dtype)
    if kind in ("bnd", "ibnd"):
        n = draw(st.integers(1, 3))
        lows = draw(st.lists(st.integers(-100, 100), min_size=n, max_size=n))
        widths = draw(st.lists(st.integers(0, 50), min_size=n, max_size=n))
        low = torch.tensor(lows, dtype=torch.float64)
        high = low + torch.tensor(widths, dtype=torch.float64)
        dtype = (
            torch.int32 if kind == "ibnd" else draw(st.sampled_from([torch.float32, torch.float64]))
        )
        return Bounded(low, high, (*batch, n), dtype=dtype)
    if kind == "cat":
        n = draw(st.integers(1, 6))
        spec = Categorical(n, batch)
        if draw(st.booleans()):
            mask = torch.tensor(draw(st.lists(st.booleans(), min_size=n, max_size=n)))
            mask[draw(st.integers(0, n - 1))] = True
            spec.update_mask(mask)
        return spec
    if kind == "oh":
        n = draw(st.integers(1, 6))
        dtype = draw(st.sampled_from([torch.bool, torch.int64, torch.float32]))
        spec = OneHot(n, (*batch, n), dtype=dtype)
        if draw(st.booleans()):
            mask = torch.tensor(draw(st.lists(st.booleans(), min_size=n, max_size=n)))
            mask[draw(st.integers(0, n - 1))] = True
            spec.update_mask(mask)
        return spec
    if kind == "bin":
        n = draw(st.integers(1, 4))
        return Binary(n, (*batch, n), dtype=draw(st.sampled_from([torch.int8, torch.bool])))
    nvec = draw(st.lists(st.integers(1, 4), min_size=1, max_size=3))
    if kind == "mcat":
        return MultiCategorical(nvec, (*batch, len(nvec)))
    return MultiOneHot(nvec, (*batch, sum(nvec)))


@settings(max_examples=150, deadline=None)
@given(spec=leaf_specs(), extra=batch_shapes)
def test_rand_is_in(spec, extra):
    val = spec.rand(extra)
    assert val.shape == torch.Size([*extra, *spec.shape])
    assert spec.expand(*extra, *spec.shape).is_in(val)
    assert spec.is_in(spec.rand())


@settings(max_examples=150, deadline=None)
@given(spec=leaf_specs(), seed=st.integers(0, 2**16), scale=st.floats(0.1, 1000))
def test_project_lands_inside(spec, seed, scale):
    gen = torch.Generator().manual_seed(seed)
    noise = torch.randn(spec.shape, generator=gen, dtype=torch.float64) * scale
    out = spec.project(noise)
    assert spec.is_in(out), (spec, noise, out)
    # projecting a value already inside changes nothing
    val = spec.rand()
    assert torch.equal(spec.project(val), val)


@settings(max_examples=60, deadline=None)
@given(spec=leaf_specs())
def test_numpy_round_trip(spec):
    val = spec.rand()
    back = spec.encode(spec.to_numpy(val))
    assert torch.equal(back, val)
    assert back.dtype == spec.dtype


@settings(max_examples=60, deadline=None)
@given(spec=leaf_specs())
def test_enumerate_discrete(spec):
    try:
        vals = spec.enumerate()
    except ValueError:
        return
    assert vals.shape[0] == spec.cardinality()
    if getattr(spec, "mask", None) is not None:
        vals = spec.enumerate(use_mask=True)
        assert 0 < vals.shape[0] <= spec.cardinality()
    assert all(spec.is_in(v) for v in vals)


@settings(max_examples=40, deadline=None)
@given(children=st.lists(leaf_specs(), min_size=1, max_size=4), extra=batch_shapes)
def test_composite_rand_is_in(children, extra):
    spec = Composite({f"k{i}": c for i, c in enumerate(children)})
    spec["nested", "x"] = children[0].clone()
    td = spec.rand(extra)
    assert td.batch_size == torch.Size(extra)
    big = spec.expand(*extra)
    assert big.is_in(td)
    projected = big.project(td)
    assert big.is_in(projected)
