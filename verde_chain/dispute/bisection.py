"""Python twin of ``contracts/dispute/Bisection.sol``, plus the move bounds of a game (used by
players to build moves and by tests to check the bounds). The clock's twin is ``clock.py``.

Interval bisection (L1 over training steps, L4 over micro-states) splits on a grid of [lo, hi]
fixed by the checkpoint interval N (L1: the job's, L4: 1). While a multiple of N lies strictly
inside (lo, hi), the grid is lo, those multiples, hi (S segments); inside one checkpoint span it
is every step (S = hi - lo). N = 1 is the plain even split::

    p_0 = lo    p_1        p_2   ...   p_{n-1}     p_n = hi        n = min(k, S)
     |----------|----------|------ ... --|-----------|           p_i = grid[S * i // n]
   claimLo   claims[0]  claims[1]    claims[n-2]  claimHi

So level 1 narrows to one checkpoint span with claims the trainer has stored, then bisects
inside it: a full bisection re-executes about N steps (plus the O(log) inner rounds' sweeps).

Merkle descent (L2 over a step's node tree, L3 over an output tensor tree): from the node at
``cursor`` with ``depth_left`` levels below it, the defender reveals the ``2**m`` nodes ``m =
min(log2 k, depth_left)`` levels down; the challenger picks child ``i``; the cursor becomes
``cursor * 2**m + i``.
"""

from __future__ import annotations

from dataclasses import dataclass

from verde_chain.commit.merkle import keccak256
from verde_chain.errors import CustomError


def grid(lo: int, hi: int, ckpt: int = 1) -> tuple[int, int]:
    """Twin of Bisection.grid: (segments S, index a of the first interior multiple of `ckpt`, or 0
    when no multiple lies strictly inside (lo, hi) and the grid is every step)."""
    a, b = lo // ckpt + 1, (hi - 1) // ckpt
    return (b - a + 2, a) if b >= a else (hi - lo, 0)


def parts(lo: int, hi: int, k: int, ckpt: int = 1) -> int:
    return min(k, grid(lo, hi, ckpt)[0])


def split_points(lo: int, hi: int, k: int, ckpt: int = 1) -> list[int]:
    """All n + 1 split points p_0 = lo .. p_n = hi of one bisection round."""
    segs, first = grid(lo, hi, ckpt)
    n = min(k, segs)

    def point(q: int) -> int:
        if q == 0:
            return lo
        if q == segs:
            return hi
        return lo + q if first == 0 else (first + q - 1) * ckpt

    return [point(segs * i // n) for i in range(n + 1)]


def check_claim_count(lo: int, hi: int, k: int, count: int, ckpt: int = 1) -> None:
    """Bisection.checkClaimCount: a round of n parts takes n - 1 claims."""
    n = parts(lo, hi, k, ckpt)
    if count != n - 1:
        raise CustomError("WrongClaimCount", actual=count, expected=n - 1)


def narrow(lo: int, hi: int, k: int, choice: int, ckpt: int = 1) -> tuple[int, int]:
    """Bisection.narrow's new interval: sub-interval ``choice`` of [lo, hi]."""
    p = split_points(lo, hi, k, ckpt)
    if not 0 <= choice < len(p) - 1:
        raise CustomError("ChoiceOutOfRange", choice=choice, count=len(p) - 1)
    return p[choice], p[choice + 1]


def log2_floor(x: int) -> int:
    return x.bit_length() - 1


def descent_levels(k: int, depth_left: int) -> int:
    return min(log2_floor(k), depth_left)


def fold(nodes: list[bytes]) -> bytes:
    """Root of a full layer of 2**m nodes (Bisection.checkSubtree)."""
    level = list(nodes)
    while len(level) > 1:
        level = [keccak256(level[i] + level[i + 1]) for i in range(0, len(level), 2)]
    return level[0]


def check_subtree(node: bytes, children: list[bytes], m: int) -> None:
    """Bisection.checkSubtree: the 2**m ``children`` fold back to ``node``."""
    if len(children) != 1 << m:
        raise CustomError("WrongClaimCount", actual=len(children), expected=1 << m)
    got = fold(children)
    if got != node:
        raise CustomError("SubtreeMismatch", computed=got, expected=node)


def bisection_rounds(length: int, k: int) -> int:
    """Worst-case number of rounds to narrow an interval of `length` to length 1."""
    rounds = 0
    while length > 1:
        n = min(k, length)
        length = -(-length // n)  # the longest sub-interval: ceil(length / n)
        rounds += 1
    return rounds


def step_rounds(num_steps: int, k: int, ckpt: int = 1) -> int:
    """Most rounds of a level-1 bisection over [0, T] on the checkpoint grid: the rounds that
    narrow the checkpoint segments to one, then the rounds inside one span (at most N steps)."""
    segs, first = grid(0, num_steps, ckpt)
    if first == 0:
        return bisection_rounds(num_steps, k)
    return bisection_rounds(segs, k) + bisection_rounds(ckpt, k)


def descent_rounds(depth: int, k: int) -> int:
    return -(-depth // log2_floor(k)) if depth else 0


def tree_depth(size: int) -> int:
    return (size - 1).bit_length()


@dataclass(frozen=True)
class MoveBound:
    """Most moves each party makes in a game (the step may be made by either; counted for both)."""

    defender: int
    challenger: int


def move_bound(num_steps: int, num_nodes: int, output_leaves: int, micro_steps: int, k: int,
               ckpt: int = 1) -> MoveBound:
    """Moves of a game that goes all the way to the one-step proof, given the sizes it meets.

    defender:   L1 posts + L2 posts + revealNode + L3 posts + revealChunk + revealFinalState
                + L4 posts + step
    challenger: L1 choices + L2 choices + L3 choices + chooseElement + L4 choices + step
    """
    r1 = step_rounds(num_steps, k, ckpt)
    r2 = descent_rounds(tree_depth(num_nodes), k)
    r3 = descent_rounds(tree_depth(output_leaves), k)
    r4 = bisection_rounds(micro_steps, k)
    return MoveBound(defender=r1 + r2 + 1 + r3 + 1 + 1 + r4 + 1, challenger=r1 + r2 + r3 + 1 + r4 + 1)
