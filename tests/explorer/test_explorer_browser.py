"""The explorer in a real browser: Debian's Chromium, headless, driven by Playwright.

The bots play a real dispute on Anvil one round at a time while the page follows it over
server-sent events; after every round the test waits until the page shows the interval the
contract holds, so the narrowing is watched level by level as it happens. Then the end (node,
element, the one instruction, the winner), the job page, and an RPC that dies and comes back.
Screenshots land in build/explorer/*.png.

The browser is the system one (``make test`` installs it: see the Makefile's ``browser`` step);
Playwright's own browser download cannot work on these machines.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

from tests.support.bots import TERMS, World, finished, node_of, reveal_time
from verde_chain.agents.system import deploy_full_system
from verde_chain.agents.trace import interval
from verde_chain.chain import anvil as anvil_mod
from verde_chain.dispute.types import Phase, Side
from verde_chain.explorer.cli import start_explorer
from verde_chain.ports import free_port
from verde_chain.repops.program import instruction_at

pytestmark = [pytest.mark.chain, pytest.mark.browser]
REPO = Path(__file__).resolve().parents[2]
SHOTS = REPO / "build" / "explorer"
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
WAIT_MS = 30_000


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    if not CHROMIUM.exists():
        pytest.fail(f"no browser at {CHROMIUM}: run `make browser` (installs Debian's chromium) or `make test`")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    SHOTS.mkdir(parents=True, exist_ok=True)
    ctx = browser.new_context(viewport={"width": 1400, "height": 1000})
    pg = ctx.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    pg.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    try:
        yield pg
    finally:
        ctx.close()
    assert errors == [], errors  # no script error and no failed load, on any page


def _clock_seconds(text: str) -> int:
    m = re.fullmatch(r"(?:(\d+)d )?(\d\d):(\d\d):(\d\d)", text.strip())
    assert m is not None, text
    d, hh, mm, ss = (int(x or 0) for x in m.groups())
    return ((d * 24 + hh) * 60 + mm) * 60 + ss


def _shows(page: Any, selector: str) -> None:
    page.wait_for_selector(selector, state="attached", timeout=WAIT_MS)


def test_page_follows_a_dispute_as_it_resolves(world: World, anvil: Any, page: Any) -> None:
    client = world.client()
    honest, cheat = world.trainer(2), world.trainer(3, f"bitflip:2:{node_of(world.job, 'matmul')}:1:3")
    ch = world.challenger()
    with start_explorer(anvil.rpc_url, world.market.address, world.artifacts, world.bundles, poll=0.1) as site:
        page.goto(site.url + "#/")
        _shows(page, '#status[data-status="ok"]')
        job_id = client.post(TERMS, world.job)
        _shows(page, f'tr[data-job="{job_id}"]')
        assert world.job.spec.name in page.inner_text(f'tr[data-job="{job_id}"]')

        for _ in range(100):  # round by round until a dispute is open
            if ch.games.game_count():
                break
            for b in world.bots:
                b.tick()
            reveal_time(world, job_id)
        gid = ch.games.game_count()
        assert gid == 1 and ch.games.game(gid).phase == Phase.L1_POST
        _shows(page, f'tr[data-game="{gid}"]')
        page.click(f'tr[data-game="{gid}"] a[href="#/dispute/{gid}"]')
        _shows(page, "#clock-defender")

        # the chess clocks: the side to move runs, and chain time passing shows on it
        v = ch.games.game(gid)
        mover = "defender" if v.phase.mover == Side.DEFENDER else "challenger"
        idle = "challenger" if mover == "defender" else "defender"
        _shows(page, f'#clock-{mover}[data-running="yes"]')
        _shows(page, f'#clock-{idle}[data-running="no"]')
        before = _clock_seconds(page.inner_text(f"#clock-{mover} .left"))
        assert before <= TERMS.clock_seconds
        anvil_mod.increase_time(world.w3, 200)  # a block 200 s later: the mover's clock shows it
        page.wait_for_function(f"""() => {{
            const t = document.querySelector('#clock-{mover} .left').textContent.split(':').map(Number);
            return t.length === 3 && t[0] * 3600 + t[1] * 60 + t[2] <= {before - 200}; }}""", timeout=WAIT_MS)
        assert page.inner_text(f"#clock-{idle} .left") == "00:10:00"  # the other clock stands still

        # move by move: the page shows each interval the contract holds, level by level
        seen: dict[int, list[tuple[int, int]]] = {1: [], 2: [], 3: [], 4: []}
        shots = set()
        for _ in range(200):
            v = ch.games.game(gid)
            if v.phase == Phase.RESOLVED:
                break
            iv = interval(v)
            assert iv is not None
            _shows(page, f'.level[data-level="{iv.level}"][data-state="active"]'
                         f'[data-lo="{iv.lo}"][data-hi="{iv.hi}"]')
            for lower in range(1, iv.level):
                _shows(page, f'.level[data-level="{lower}"][data-state="settled"]')
            if not seen[iv.level] or seen[iv.level][-1] != (iv.lo, iv.hi):
                seen[iv.level].append((iv.lo, iv.hi))
            if iv.level not in shots:
                shots.add(iv.level)
                page.screenshot(path=str(SHOTS / f"dispute-level{iv.level}.png"), full_page=True)
            for b in world.bots:
                b.tick()
                if ch.games.game(gid) != v:
                    break  # one move at a time
        for lvl, ivs in seen.items():  # every level was watched while it narrowed
            assert ivs, lvl
            assert all(lo <= lo2 and hi2 <= hi for (lo, hi), (lo2, hi2) in pairwise(ivs)), (lvl, ivs)
        assert len(seen[2]) >= 2 and len(seen[3]) >= 2 and len(seen[4]) >= 2

        # the end: winner, the disputed site, the one instruction, decoded
        world.run(finished(client, job_id, world.bots))
        v = ch.games.game(gid)
        _shows(page, f'#end[data-resolution="STEP"][data-winner="{ch.address}"][data-winner-role="challenger"]')
        assert "the challenger wins" in page.inner_text("#end .verdict")
        f = cheat.plan(job_id).fault
        assert f is not None
        site_text = page.inner_text("#site")
        assert f"graph node\t{f.node} (matmul)" in site_text and f"output element\t{f.element}" in site_text
        desc = world.job.program.graph.nodes[v.node_index].desc
        op = instruction_at(desc, v.lo)[0].op.name
        _shows(page, f'#instruction[data-op="{op}"][data-micro-step="{v.lo}"]')
        asm = page.inner_text("#instruction pre.asm")
        assert op in asm and f"r{instruction_at(desc, v.lo)[0].dst} = " in asm
        assert re.search(r"result r\d+\t\S+\t0x[0-9a-f]{8}\t[01] [01]{8} [01]{23}", page.inner_text("#instruction"))
        assert page.inner_text("#claim-verdict") == "different: the defender's claim is false"
        last = v.lo
        _shows(page, f'.level[data-level="4"][data-state="ended"][data-lo="{last}"][data-hi="{last + 1}"]')
        _shows(page, '#clock-defender[data-running="no"]')
        page.screenshot(path=str(SHOTS / "dispute-end.png"), full_page=True)

        # the job page: slots and their outcome, the dispute, the market's events, the deadlines
        page.click(f'a[href="#/job/{job_id}"]')
        _shows(page, f'tr[data-slot="{world.market.slot_of(job_id, honest.address)}"][data-status="SETTLED"]')
        _shows(page, f'tr[data-slot="{world.market.slot_of(job_id, cheat.address)}"][data-status="REJECTED"]')
        assert "digits" in page.inner_text("body") and "JobFinalized" in page.inner_text("body")
        assert re.search(r"passed \d\d:\d\d:\d\d ago", page.inner_text("#deadlines"))
        page.screenshot(path=str(SHOTS / "job.png"), full_page=True)
        page.goto(site.url + "#/")
        _shows(page, f'tr[data-game="{gid}"]')
        page.screenshot(path=str(SHOTS / "home.png"), full_page=True)
        page.goto("about:blank")  # leave before the server stops (its stream would be cut off)


def test_page_survives_an_rpc_restart(artifacts: Any, page: Any) -> None:
    port = free_port()
    node = anvil_mod.Anvil(port=port)
    try:
        record, _ = deploy_full_system(node.web3(), artifacts, node.rpc_url)
        market = record.contracts["JobMarket"]
        with start_explorer(node.rpc_url, market, artifacts, None, poll=0.1) as site:
            page.goto(site.url + "#/")
            _shows(page, '#status[data-status="ok"]')
            node.stop()
            _shows(page, '#status[data-status="unreachable"]')
            assert page.inner_text("#status").startswith(f"RPC unreachable at {node.rpc_url}, retrying (since ")
            assert page.get_attribute("body", "data-stale") == "yes"  # the last data stays, greyed
            page.screenshot(path=str(SHOTS / "rpc-unreachable.png"))
            node = anvil_mod.Anvil(port=port)  # the node comes back, empty
            _shows(page, '#status[data-status="no_contracts"]')
            assert page.inner_text("#status").startswith(f"no contracts deployed at {market} on chain 31337")
            page.screenshot(path=str(SHOTS / "rpc-no-contracts.png"))
            again, _ = deploy_full_system(node.web3(), artifacts, node.rpc_url)  # same deployer: same addresses
            assert again.contracts["JobMarket"] == market
            _shows(page, '#status[data-status="ok"]')
            assert page.inner_text("#status").startswith(f"following {node.rpc_url}")
            page.goto("about:blank")
    finally:
        node.stop()
