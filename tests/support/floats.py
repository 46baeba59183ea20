"""Hypothesis strategies for binary32 bit patterns, edge-biased (signed zeros, subnormals, infinities,
NaNs, largest finite, ulps around every power of two), shared by the softfloat twin's tests."""

from __future__ import annotations

from hypothesis import strategies as st

from verde_chain.repops.edges import EDGE_BITS


def s32(x: int) -> int:
    """A uint32 bit pattern read as a signed int32."""
    return x - (1 << 32) if x >> 31 else x


sign_st = st.integers(0, 1)


@st.composite
def near_power_of_two(draw: st.DrawFn) -> int:
    """±2**k ± a few ulps (k over the whole exponent range, including subnormal neighbours)."""
    exp = draw(st.integers(0, 254))
    frac = draw(st.sampled_from([0, 1, 2, 0x7FFFFF, 0x7FFFFE, 0x400000]))
    return (draw(sign_st) << 31) | (exp << 23) | frac


@st.composite
def subnormal(draw: st.DrawFn) -> int:
    return (draw(sign_st) << 31) | draw(st.integers(1, 0x7FFFFF))


@st.composite
def moderate(draw: st.DrawFn) -> int:
    """Normal numbers with exponents near 1.0, where cancellation and carries are frequent."""
    return (draw(sign_st) << 31) | (draw(st.integers(110, 145)) << 23) | draw(st.integers(0, 0x7FFFFF))


f32_st = st.one_of(
    st.sampled_from(EDGE_BITS),
    st.integers(0, 0xFFFFFFFF),
    near_power_of_two(),
    subnormal(),
    moderate(),
)
