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

from collections.abc import Mapping
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


# Who made an interval: the side that moved, "opening" for the interval a level opens with, and
# "referee" for the one-step proof that ends a game at L4 (anyone may send it; ScalarVM executes)
OPENING, REFEREE = "opening", "referee"


def _mover(prev: GameView, v: GameView) -> str:
    if prev.phase == Phase.L4_STEP and v.phase == Phase.RESOLVED:
        return REFEREE
    return prev.phase.mover.name.lower()


def narrowing_moves(trace: list[tuple[int, GameView]]) -> dict[int, list[tuple[Interval, str]]]:
    """Per level, the disputed interval after every move made at that level, with who made it
    ("defender", "challenger", "referee", or "opening" for the interval a level opens with),
    ending with the point it settled on. A move that posts claims leaves the interval as it is;
    the choice that follows narrows it."""
    per_level: dict[int, list[tuple[Interval, str]]] = {1: [], 2: [], 3: [], 4: []}
    prev: GameView | None = None
    for _, v in trace:
        iv = interval(v)
        if prev is None or prev.phase in (Phase.NONE, Phase.RESOLVED):
            if iv is not None:
                per_level[iv.level].append((iv, OPENING))
            prev = v
            continue
        mover = _mover(prev, v)
        done = settled(prev, v)
        if done is not None:
            per_level[done.level].append((done, mover))
        if iv is not None:
            per_level[iv.level].append((iv, OPENING if done is not None or not per_level[iv.level] else mover))
        elif done is None and (last := interval(prev)) is not None:  # the move that resolved the game
            per_level[last.level].append((last, mover))
        prev = v
    return per_level


def narrowing(trace: list[tuple[int, GameView]]) -> dict[int, list[Interval]]:
    """Per level, the successive disputed intervals, ending with the point it settled on."""
    out: dict[int, list[Interval]] = {}
    for lvl, ivs in narrowing_moves(trace).items():
        out[lvl] = [iv for i, (iv, _) in enumerate(ivs) if i == 0 or ivs[i - 1][0] != iv]
    return out


MOVER_COLOURS = {OPENING: "0.7", "defender": "tab:orange", "challenger": "tab:blue", REFEREE: "tab:green"}


def plot_bisection(trace: list[tuple[int, GameView]], path: str, title: str,
                   names: Mapping[str, str] | None = None, caption: str = "") -> None:
    """One panel per level: the disputed interval (in the level's own units) after every move,
    coloured by who moved, the point the level settled on outlined in red; a legend says which
    colour is whom (``names``: "defender"/"challenger" -> e.g. "cheating trainer"), and
    ``caption`` (what the cheat was, what the referee executed) is written under the panels."""
    import textwrap

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    who = {"defender": "defender", "challenger": "challenger", **(names or {})}
    per_level = narrowing_moves(trace)
    lines = textwrap.wrap(caption, 150) if caption else []
    fig, axes = plt.subplots(1, 4, figsize=(14, 4.2 + 0.22 * len(lines)))
    titles = {1: "L1 training steps", 2: "L2 graph nodes", 3: "L3 output elements", 4: "L4 micro-steps"}
    for lvl, ax in zip((1, 2, 3, 4), axes):
        ivs = per_level[lvl]
        ax.set_title(titles[lvl], fontsize=10)
        ax.set_xlabel("move")
        if not ivs:
            ax.text(0.5, 0.5, "not reached", ha="center", va="center", transform=ax.transAxes)
            ax.set_xticks([])
            continue
        total = max(1, ivs[0][0].total)
        for i, (iv, mover) in enumerate(ivs):
            last = i == len(ivs) - 1
            ax.bar(i, max(iv.hi - iv.lo, total * 0.01), bottom=iv.lo, width=0.6, color=MOVER_COLOURS[mover],
                   edgecolor="tab:red" if last else "none", linewidth=2 if last else 0)
            ax.text(i, iv.hi + total * 0.02, f"[{iv.lo},{iv.hi}]", ha="center", fontsize=7, rotation=90)
        ax.set_ylim(0, total * 1.35)
        ax.set_xticks(range(len(ivs)))
        ax.set_ylabel(ivs[0][0].unit)
    legend = [Patch(color=MOVER_COLOURS[OPENING], label="the interval a level opens with"),
              Patch(color=MOVER_COLOURS["defender"], label=f"after a move of the {who['defender']}"),
              Patch(color=MOVER_COLOURS["challenger"], label=f"after a move of the {who['challenger']}"),
              Patch(color=MOVER_COLOURS[REFEREE], label="the one-step proof (ScalarVM executes one instruction)"),
              Patch(facecolor="white", edgecolor="tab:red", linewidth=2, label="where the level settled")]
    fig.legend(handles=legend, loc="upper center", ncol=5, fontsize=8, frameon=False, bbox_to_anchor=(0.5, 0.93))
    fig.suptitle(title, fontsize=11)
    if lines:
        fig.text(0.01, 0.01, "\n".join(lines), fontsize=8, va="bottom", ha="left")
    bottom = (0.05 + 0.045 * len(lines)) if lines else 0
    fig.tight_layout(rect=(0, bottom, 1, 0.88))
    fig.savefig(path, dpi=110)
    plt.close(fig)
