"""Reading a dispute back: its state after every move, the interval at each level, a picture.

Each move is its own transaction, so replaying ``getGame`` at every block from the game's
creation to its resolution gives the exact state after every move (no event bookkeeping).

Intervals, per level (what "narrowing" means in the live view and the picture)::

    L1  steps       [lo, hi] of [0, T]                     k-ary bisection over C_s
    L2  nodes       leaves [cursor << depth, +1 << depth)  descent in the step's node tree
    L3  elements    leaves x 128 elements of the output    descent in the output tensor tree
    L4  micro-steps [lo, hi] of [0, N]                     bisection over the element's trace
"""

from __future__ import annotations

from dataclasses import dataclass

from verde_chain.chain.dispute_client import DisputeGameClient
from verde_chain.commit.tensor import LEAF_ELEMS
from verde_chain.dispute.types import GameView, Phase


@dataclass(frozen=True)
class Interval:
    level: int
    unit: str
    lo: int
    hi: int
    total: int

    def __str__(self) -> str:
        return f"L{self.level} {self.unit:<11} [{self.lo}, {self.hi}] of [0, {self.total}]"


def interval(v: GameView) -> Interval | None:
    ph = v.phase
    if ph in (Phase.NONE, Phase.RESOLVED):
        return None
    if ph.level == 1:
        return Interval(1, "steps", v.lo, v.hi, v.num_steps)
    if ph.level == 2:
        if ph == Phase.L2_REVEAL:
            return Interval(2, "nodes", v.cursor, v.cursor, v.num_nodes - 1)
        width = 1 << v.depth_left
        return Interval(2, "nodes", v.cursor * width, min(v.num_nodes, (v.cursor + 1) * width) - 1, v.num_nodes - 1)
    if ph.level == 3:
        n = max(1, v.output_numel)
        if ph == Phase.L3_ELEMENT or ph == Phase.L3_CHUNK:
            lo = v.cursor * LEAF_ELEMS
            return Interval(3, "elements", lo, min(n, lo + LEAF_ELEMS) - 1, n - 1)
        width = (1 << v.depth_left) * LEAF_ELEMS
        return Interval(3, "elements", v.cursor * width, min(n, (v.cursor + 1) * width) - 1, n - 1)
    if ph == Phase.L4_START:
        return Interval(4, "micro-steps", 0, v.micro_steps, v.micro_steps)
    return Interval(4, "micro-steps", v.lo, v.hi, v.micro_steps)


def game_trace(client: DisputeGameClient, game_id: int, from_block: int, to_block: int | None = None) -> list[
        tuple[int, GameView]]:
    """(block, state) after every block in which the game's state changed."""
    end = client.w3.eth.block_number if to_block is None else to_block
    out: list[tuple[int, GameView]] = []
    last = None
    for b in range(from_block, end + 1):
        raw = client.contract.functions.getGame(game_id).call(block_identifier=b)
        v = GameView.from_tuple(raw)
        if v.phase == Phase.NONE:
            continue
        key = (v.phase, v.lo, v.hi, v.cursor, v.depth_left, v.defender_left, v.challenger_left)
        if key != last:
            out.append((b, v))
            last = key
        if v.phase == Phase.RESOLVED:
            break
    return out


def settled(prev: GameView, v: GameView) -> Interval | None:
    """The point a level settled on, read from the first state of the next level."""
    lp, lv = prev.phase.level, v.phase.level
    if v.phase == Phase.RESOLVED or lv == lp:
        return None
    if lp == 1:
        return Interval(1, "steps", v.step - 1, v.step, v.num_steps)
    if lp == 2:
        return Interval(2, "nodes", v.node_index, v.node_index, v.num_nodes - 1)
    return Interval(3, "elements", v.element, v.element, max(1, v.output_numel) - 1)


def narrowing(trace: list[tuple[int, GameView]]) -> dict[int, list[Interval]]:
    """Per level, the successive disputed intervals, ending with the point it settled on."""
    per_level: dict[int, list[Interval]] = {1: [], 2: [], 3: [], 4: []}
    prev: GameView | None = None
    for _, v in trace:
        for iv in (settled(prev, v) if prev is not None else None, interval(v)):
            if iv is not None and (not per_level[iv.level] or per_level[iv.level][-1] != iv):
                per_level[iv.level].append(iv)
        prev = v
    return per_level


def plot_bisection(trace: list[tuple[int, GameView]], path: str, title: str) -> None:
    """One panel per level: the disputed interval (as a fraction of the level's range) per move."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    per_level = narrowing(trace)
    fig, axes = plt.subplots(1, 4, figsize=(14, 3.6))
    names = {1: "L1 training steps", 2: "L2 graph nodes", 3: "L3 output elements", 4: "L4 micro-steps"}
    for lvl, ax in zip((1, 2, 3, 4), axes):
        ivs = per_level[lvl]
        ax.set_title(names[lvl], fontsize=10)
        ax.set_xlabel("move")
        if not ivs:
            ax.text(0.5, 0.5, "not reached", ha="center", va="center", transform=ax.transAxes)
            ax.set_xticks([])
            continue
        total = max(1, ivs[0].total)
        for i, iv in enumerate(ivs):
            ax.bar(i, max(iv.hi - iv.lo, total * 0.01), bottom=iv.lo, width=0.6,
                   color="tab:red" if i == len(ivs) - 1 else "tab:blue")
            ax.text(i, iv.hi + total * 0.02, f"[{iv.lo},{iv.hi}]", ha="center", fontsize=7, rotation=90)
        ax.set_ylim(0, total * 1.35)
        ax.set_xticks(range(len(ivs)))
        ax.set_ylabel(ivs[0].unit)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
