"""Bisection.sol (contracts/dispute/) against its Python twin verde_chain/dispute/bisection.py:
split points, narrowing, descent levels, subtree folding and the errors both raise (name and
fields), plus the pure properties the game's move bounds rely on."""

from __future__ import annotations

import random
from collections.abc import Callable
from itertools import pairwise
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.dispute import revert
from verde_chain.chain.deploy import deploy_contract
from verde_chain.chain.tx import call
from verde_chain.commit.merkle import keccak256
from verde_chain.dispute import bisection
from verde_chain.errors import CustomError


@given(lo=st.integers(0, 1000), length=st.integers(1, 5000), logk=st.integers(1, 8))
@settings(max_examples=200, deadline=None)
def test_split_points_cover_the_interval(lo: int, length: int, logk: int) -> None:
    k = 1 << logk
    hi = lo + length
    if length == 1:
        assert bisection.bisection_rounds(length, k) == 0
        return
    p = bisection.split_points(lo, hi, k)
    assert p[0] == lo and p[-1] == hi and len(p) == min(k, length) + 1
    assert all(a < b for a, b in pairwise(p))  # strictly increasing: no empty sub-interval
    assert max(b - a for a, b in pairwise(p)) == -(-length // min(k, length))


@given(lo=st.integers(0, 1000), length=st.integers(2, 5000), logk=st.integers(1, 8), ckpt=st.integers(1, 400))
@settings(max_examples=300, deadline=None)
def test_checkpoint_split_points(lo: int, length: int, logk: int, ckpt: int) -> None:
    """While (lo, hi) holds a multiple of N, every inner split point is one (evenly chosen among
    them); inside one checkpoint span the split is the plain even one. N = 1 is the even split."""
    k, hi = 1 << logk, lo + length
    p = bisection.split_points(lo, hi, k, ckpt)
    inner = [m for m in range(lo + 1, hi) if m % ckpt == 0]
    assert p[0] == lo and p[-1] == hi and all(a < b for a, b in pairwise(p))
    if inner:
        assert all(x % ckpt == 0 for x in p[1:-1]) and len(p) == min(k, len(inner) + 1) + 1
        grid = [lo, *inner, hi]  # the chosen points are spread evenly over the checkpoint grid
        q = [grid.index(x) for x in p]
        assert max(b - a for a, b in pairwise(q)) - min(b - a for a, b in pairwise(q)) <= 1
    else:
        assert p == bisection.split_points(lo, hi, k)
    assert bisection.split_points(lo, hi, k, 1) == bisection.split_points(lo, hi, k)


@given(length=st.integers(1, 3000), logk=st.integers(1, 5), seed=st.integers(0, 2**32), ckpt=st.integers(1, 300))
@settings(max_examples=150, deadline=None)
def test_bisection_rounds_is_the_worst_case(length: int, logk: int, seed: int, ckpt: int) -> None:
    k, rng = 1 << logk, random.Random(seed)
    for grid in (1, ckpt):
        lo, hi, rounds = 0, length, 0
        while hi - lo > 1:
            lo, hi = bisection.narrow(lo, hi, k, rng.randrange(bisection.parts(lo, hi, k, grid)), grid)
            rounds += 1
        assert rounds <= bisection.step_rounds(length, k, grid)
    assert bisection.step_rounds(length, k, 1) == bisection.bisection_rounds(length, k)


@pytest.fixture(scope="module")
def harness(_session_w3: Any, artifacts: Any) -> Any:
    return deploy_contract(_session_w3, artifacts, "BisectionHarness")


def both_refuse(twin: Callable[[], Any], sol: Callable[[], Any]) -> CustomError:
    """The twin raises exactly the custom error (name and fields) the contract reverts with."""
    with pytest.raises(CustomError) as py:
        twin()
    onchain = revert(sol)
    assert py.value.decoded == onchain.decoded, (py.value, onchain)
    return onchain


@pytest.mark.chain
@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data(), lo=st.integers(0, 2**40), length=st.integers(2, 10**6), logk=st.integers(1, 8),
       ckpt=st.one_of(st.just(1), st.integers(1, 10**5)))
def test_bisection_twin(harness: Any, artifacts: Any, data: st.DataObject, lo: int, length: int, logk: int,
                        ckpt: int) -> None:
    k, hi = 1 << logk, lo + length
    f = harness.functions
    points = bisection.split_points(lo, hi, k, ckpt)
    assert call(f.splitPoints(lo, hi, k, ckpt), artifacts) == points
    claims = [keccak256(p.to_bytes(32, "big")) for p in points[1:-1]]
    c_lo, c_hi = b"\x0a" * 32, b"\x0b" * 32
    choice = data.draw(st.integers(0, len(points) - 2))
    new_lo, new_hi = bisection.narrow(lo, hi, k, choice, ckpt)
    ends = [c_lo, *claims, c_hi]
    assert call(f.narrow(lo, hi, k, ckpt, c_lo, c_hi, claims, choice), artifacts) == [
        new_lo, new_hi, ends[choice], ends[choice + 1]]
    bisection.check_claim_count(lo, hi, k, len(claims), ckpt)
    e = both_refuse(lambda: bisection.narrow(lo, hi, k, len(points) - 1, ckpt),
                    lambda: call(f.narrow(lo, hi, k, ckpt, c_lo, c_hi, claims, len(points) - 1), artifacts))
    assert e.name == "ChoiceOutOfRange"
    e = both_refuse(lambda: bisection.check_claim_count(lo, hi, k, len(claims) + 1, ckpt),
                    lambda: call(f.narrow(lo, hi, k, ckpt, c_lo, c_hi, claims + [c_lo], 0), artifacts))
    assert e.decoded == ("WrongClaimCount", {"actual": len(claims) + 1, "expected": len(claims)})
    depth = data.draw(st.integers(0, 20))
    m = bisection.descent_levels(k, depth)
    assert call(f.descentLevels(k, depth), artifacts) == m
    m = min(m, 4)
    children = [keccak256(bytes([i])) for i in range(1 << m)]
    node = bisection.fold(children)
    bisection.check_subtree(node, children, m)
    assert call(f.checkSubtree(node, children, m), artifacts) is True
    if m:
        e = both_refuse(lambda: bisection.check_subtree(node, children[::-1], m),
                        lambda: call(f.checkSubtree(node, children[::-1], m), artifacts))
        assert e.name == "SubtreeMismatch" and e.fields["expected"] == node
    both_refuse(lambda: bisection.check_subtree(node, children + [node], m),
                lambda: call(f.checkSubtree(node, children + [node], m), artifacts))
