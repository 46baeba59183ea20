"""What a player believes: the "truth" it computes its claims and choices from.

A World answers every question the game can ask about one job's execution. An honest trainer's
World is its own (correct) execution; a dishonest one is an execution with a fault somewhere. The
players in ``players.py`` only talk to a World, so the same players drive the toy world of the
tests and, later, the real training executor.
"""

from __future__ import annotations

from typing import Protocol

from verde_chain.chain.game import NodeReveal


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
