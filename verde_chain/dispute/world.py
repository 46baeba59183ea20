"""What a player believes: the "truth" it computes its claims and choices from.

A World answers every question the game can ask about one job's execution. An honest trainer's
World is its own (correct) execution; a dishonest one is an execution with a fault somewhere. The
players in ``players.py`` only talk to a World, so the same players drive the toy world of the
tests (``tests/support/toy.py``), the real-VM world (``kernel_world.py``), the training job's
world (``verde_chain.graph.world.TrainingWorld``) and the cheats built on it (``cheats.py``).
"""

from __future__ import annotations

from typing import Generic, Protocol, TypeVar

from verde_chain.dispute.types import NodeReveal


class World(Protocol):
    num_steps: int
    num_nodes: int

    def step_commitment(self, s: int) -> bytes:
        """C_s for 0 <= s <= T (C_0 is the job's)."""

    def node_levels(self, s: int) -> list[list[bytes]]:
        """Merkle levels of C_s's node tree: [padded leaves, ..., [C_s]]."""

    def node_reveal(self, s: int, d: int) -> NodeReveal:
        """Everything revealNode needs for node d of step s (preimage, graph proof, justifications)."""

    def desc(self, s: int, d: int) -> bytes:
        """Kernel descriptor of node d of step s."""

    def output_levels(self, s: int, d: int) -> list[list[bytes]]:
        """Merkle levels of node d's output tensor tree: [padded leaf hashes, ..., [root]]."""

    def output_chunk(self, s: int, d: int, leaf: int) -> bytes:
        """The 512-byte leaf chunk `leaf` of node d's output tensor."""

    def micro_steps(self, s: int, d: int) -> int:
        """N: micro-steps of one element's program of node d."""

    def micro_state(self, s: int, d: int, e: int, j: int) -> bytes:
        """Preimage of state j (0 <= j <= N) of element e's program of node d."""

    def step_proof(self, s: int, d: int, e: int, j: int) -> bytes:
        """The proof the stepper needs to execute micro-step j of element e."""


StepT = TypeVar("StepT")


class LazySteps(Generic[StepT]):
    """Steps of an execution computed on demand, in order (step s reads step s - 1), and kept.

    Subclasses implement ``_compute(s)``, which may read ``self._steps[s - 1]``.
    """

    def __init__(self) -> None:
        self._steps: dict[int, StepT] = {}

    def _compute(self, s: int) -> StepT:
        raise NotImplementedError

    def _get(self, s: int) -> StepT:
        for t in range(max(self._steps, default=-1) + 1, s + 1):
            self._steps[t] = self._compute(t)
        return self._steps[s]
