"""Every attack of issue #13, on the real contracts (DisputeGame + ToyStepper, or ScalarVM) on Anvil
with the project's fixtures: the attacker loses. Balances are checked to the wei (the burned share
from the twin ``split_forfeit``) and the solvency invariant after every step.

  rival-dispute flood     a cheating rival and 20 sybils dispute an honest result at once
  trap jobs               each bound of the market parameters, and bad parameters at deployment
  sybil self-challenge    a cheater's sybil wins a game against it before (or after) an honest one
  move copying, sniping   a party that computes nothing copies the honest challenger's choices
                          and front-runs its final step with the honest transaction's calldata
  copied results          31 sybils paste an honest commitment into their own slots
  bond below the floor    the 20,000 wei bond of the issue; the floor pays a measured defence
  L1 re-execution bound   a whole dispute of a 1,000-step job re-executes <= 12% at N = 100
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest
from eth_utils import keccak, to_checksum_address
from web3 import Web3

from tests.support.market import (
    BOND,
    REWARD,
    STAKE,
    STAKE_BURN,
    STAKE_PAID,
    Env,
    expect,
    join_and_submit,
    make_env,
    twin_error,
)
from tests.support.toy import Fault, ToyJob, ToyWorld, default_graph
from verde_chain.chain.anvil import increase_time
from verde_chain.chain.deploy import deploy_market
from verde_chain.chain.dispute_client import DisputeGameClient
from verde_chain.dispute import players as pl
from verde_chain.dispute import runner
from verde_chain.dispute.types import GameParams, GameView, Phase, Resolution, Side
from verde_chain.errors import ContractRevert
from verde_chain.market.marketparams import (
    DEFENCE_GAS,
    FAST,
    MarketParams,
    bond_floor,
    check,
    check_job,
    required_bond,
    split_forfeit,
)
from verde_chain.market.types import ETH, SlotStatus, commitment

pytestmark = pytest.mark.chain

CLOCK = 600
JOB = ToyJob(num_steps=12, nodes=default_graph(3, numels=[130], micro=[5]))
LIE = Fault("micro", step=7, node=1, element=129, micro=3)


def toy_job(env: Env, **over: Any) -> int:
    """Post the toy job (the honest world's C_0, graph and batches) with `over` changes."""
    fields = {"initial_commitment": ToyWorld(JOB).step_commitment(0), "graph_root": JOB.graph_root,
              "batch_root": JOB.batch_root, "num_steps": JOB.num_steps, "checkpoint_interval": 4,
              "num_nodes": JOB.num_nodes, "arity": 4, "clock_seconds": CLOCK, **over}
    return env.post(**fields)


def sybils(env: Env, n: int) -> list[str]:
    """`n` fresh funded addresses the node signs for (anvil_impersonateAccount): an attacker's sybils."""
    out = []
    for i in range(n):
        addr = to_checksum_address(keccak(b"sybil %d of job market attacks" % i)[:20])
        env.w3.provider.make_request("anvil_setBalance", [addr, hex(10**22)])  # type: ignore[arg-type]
        env.w3.provider.make_request("anvil_impersonateAccount", [addr])  # type: ignore[arg-type]
        if env.token_contract is not None:
            env.w3.eth.wait_for_transaction_receipt(
                env.token_contract.functions.mint(addr, 10**24).transact({"from": env.w3.eth.accounts[0]}))
        out.append(addr)
    env.extra += out
    return out


def games(env: Env) -> DisputeGameClient:
    return DisputeGameClient(env.w3, env.game, env.artifacts)


def forfeit(amount: int) -> tuple[int, int]:
    return split_forfeit(amount, FAST.burn_bps)


# -- rival-dispute flood ---------------------------------------------------------------------------


def test_rival_dispute_flood_honest_defender_wins_every_game(w3: Web3, artifacts: Any, deploy: Callable[..., Any],
                                                             chain: Any) -> None:
    """A cheating trainer disputes the honest trainer's result as a rival (one game: a second is
    refused) and 20 of its sybils dispute it too, each locking its own bond (the price doubles
    once 16 games run against the result). The honest defender plays all 21 games at once, each
    with its own full clock, wins every one, keeps its stake and the reward, and gets every bond
    and the cheater's stake less the burned half."""
    env = make_env(w3, artifacts, deploy, chain, "eth", mock=False)
    honest, liar = ToyWorld(JOB), ToyWorld(JOB, LIE)
    t_true, t_bad = honest.step_commitment(JOB.num_steps), liar.step_commitment(JOB.num_steps)
    job_id = toy_job(env, slots=2)
    good, cheater = env.trainers[0], env.trainers[1]
    join_and_submit(env, job_id, [t_true, t_bad], [good, cheater])
    env.assert_solvent()
    rival = env.rival(job_id, 0, 1)
    expect("DuplicateDispute", lambda: env.rival(job_id, 0, 1), slot=0, challenger=cheater)
    bonds = [BOND]
    flood = sybils(env, 20)
    step = FAST.disputes_per_bond_step
    for i, who in enumerate(flood):
        need = env.market.required_bond(job_id, 0)
        assert need == required_bond(BOND, i + 1, step) == BOND << ((i + 1) // step)  # the rival's game counts
        if need > BOND:
            expect("BondTooSmall", lambda w=who, n=need: env.dispute(job_id, 0, sender=w, bond=n - 1), minimum=need)
        env.dispute(job_id, 0, sender=who, bond=need)
        bonds.append(need)
        env.assert_solvent()
    assert env.market.job(job_id).active_disputes == 21 and bonds.count(2 * BOND) == 5
    client = games(env)
    created = {int(e["args"]["gameId"]): int(e["args"]["clockSeconds"])
               for e in env.game.events.GameCreated().get_logs(from_block=0)}
    assert {g: created[g] for g in env.game_ids} == {g: CLOCK for g in env.game_ids}  # a full clock per game

    # the sybils believe wrong executions (consistently), choose at random, or never move
    def challenger(i: int) -> pl.Challenger:
        if i % 3 == 0:
            return pl.Challenger(ToyWorld(JOB, Fault("micro", 1 + i % 12, i % 3, (7 * i) % 130, 1 + i % 5)))
        return pl.Challenger(honest, "random" if i % 3 == 1 else "stall", seed=i)

    plays = [(rival, pl.Defender(honest), pl.Challenger(liar))]
    plays += [(g, pl.Defender(honest), challenger(i)) for i, g in enumerate(env.game_ids[1:])]
    outs = runner.play_many(client, plays, chain.increase_time, on_resolved=lambda g: env.assert_solvent())
    assert {g: o.winner for g, o in outs.items()} == {g: good for g in env.game_ids}
    assert all(o.reverts == [] for o in outs.values())
    paid = sum(forfeit(b)[1] for b in bonds)
    burnt = sum(forfeit(b)[0] for b in bonds)
    s = env.market.slot(job_id, 1)
    assert (s.status, s.stake_held, s.beaten_by, s.beaten_winner) == (SlotStatus.REJECTED, 0, rival, good)
    assert env.market.balance_of(good) == paid + STAKE_PAID
    assert env.market.burned() == burnt + STAKE_BURN
    assert all(env.market.balance_of(a) == 0 for a in [cheater, *flood])
    env.past_challenge(job_id)
    env.market.finalize(job_id)
    assert env.market.job(job_id).accepted_result == t_true
    assert env.market.balance_of(good) == paid + STAKE_PAID + STAKE + REWARD
    env.assert_solvent()
    env.withdraw_all()
    env.assert_solvent()
    assert env.market.total_owed() == env.market.burned() == burnt + STAKE_BURN


# -- trap jobs -----------------------------------------------------------------------------------------


def test_trap_job_parameters_are_refused(env: Env) -> None:
    """Every bound of the market parameters, each with its named error (field, value, min, max) and
    the Python twin agreeing: the issue's 1 s clock, 2^64-1 clock and deadline, 1 s challenge
    window, and the rest; jobs in a token the market has no floor for are refused too."""
    p = env.market.params()
    assert p == (FAST if env.token == ETH else FAST.with_token(env.token, BOND))
    now = env.chain.timestamp()
    floor = p.floor(env.token)
    top = 2**64 - 1
    for value in (top, now + p.max_deadline_horizon + 10, now):  # deadlines: for ever, too far, already past
        terms = env.terms(submission_deadline=value)
        err = expect("TermsOutOfBounds", lambda t=terms: env.market.post_job(t, sender=env.client),
                     field="submissionDeadline", value=value)
        lo, hi = err.fields["min"], err.fields["max"]  # (now + 1, now + horizon) at the block that refused it
        assert hi - lo == p.max_deadline_horizon - 1 and lo > now
        assert twin_error(lambda t=terms, at=lo - 1: check_job(t, p, at)).decoded == err.decoded  # the twin agrees
    cases = [
        ({"clock_seconds": 1}, ("clockSeconds", 1, p.min_clock_seconds, p.max_clock_seconds)),
        ({"clock_seconds": p.min_clock_seconds - 1}, ("clockSeconds", p.min_clock_seconds - 1, p.min_clock_seconds,
                                                      p.max_clock_seconds)),
        ({"clock_seconds": top}, ("clockSeconds", top, p.min_clock_seconds, p.max_clock_seconds)),
        ({"reveal_window": 1}, ("revealWindow", 1, p.min_reveal_window, p.max_reveal_window)),
        ({"reveal_window": p.max_reveal_window + 1}, ("revealWindow", p.max_reveal_window + 1, p.min_reveal_window,
                                                      p.max_reveal_window)),
        ({"challenge_window": 1}, ("challengeWindow", 1, p.min_challenge_window, p.max_challenge_window)),
        ({"challenge_window": top}, ("challengeWindow", top, p.min_challenge_window, p.max_challenge_window)),
        ({"min_challenge_bond": floor - 1}, ("minChallengeBond", floor - 1, floor, 2**256 - 1)),
    ]
    for over, (fld, value, lo, hi) in cases:
        terms = env.terms(**over)
        err = expect("TermsOutOfBounds", lambda t=terms: env.market.post_job(t, sender=env.client), field=fld,
                     value=value, min=lo, max=hi)
        assert twin_error(lambda t=terms: check_job(t, p, now)).decoded == err.decoded, over  # the twin agrees
    # the bounds themselves are allowed
    for over in ({"clock_seconds": p.min_clock_seconds}, {"clock_seconds": p.max_clock_seconds},
                 {"reveal_window": p.min_reveal_window}, {"challenge_window": p.max_challenge_window},
                 {"min_challenge_bond": floor}):
        check_job(env.terms(**over), p, env.chain.timestamp() + 1)
        env.post(**over)
    other = env.w3.eth.accounts[9]  # any address the market has no floor for
    err = expect("TokenNotAllowed", lambda: env.post(token=other), token=other)
    assert twin_error(lambda: check_job(env.terms(token=other), p, env.chain.timestamp())).decoded == err.decoded
    env.assert_solvent()


def test_priced_bound_and_floor_twins() -> None:
    """The twins of the contract's pure rules at their edges: the dispute price saturates instead of
    wrapping, and a floor's unburned share pays the whole defence at the reference gas price."""
    assert required_bond(5, 15, 16) == 5 and required_bond(5, 16, 16) == 10 and required_bond(5, 47, 16) == 20
    assert required_bond(2**255, 16, 16) == 2**256 - 1 and required_bond(1, 256 * 16, 16) == 2**256 - 1
    assert required_bond(1, 255 * 16, 16) == 2**255
    for price in (1, 10**9, 20 * 10**9, 3 * 10**11):
        floor = bond_floor(price)
        assert split_forfeit(floor, FAST.burn_bps)[1] >= DEFENCE_GAS * price > split_forfeit(floor - 2, FAST.burn_bps)[1]
    assert FAST.floor(ETH) == bond_floor(10**9) and FAST.floor("0x" + "11" * 20) == 0


def test_bad_market_parameters_are_refused_at_deployment(w3: Web3, artifacts: Any, deploy: Callable[..., Any]) -> None:
    game = deploy("DisputeGame", deploy("ToyStepper").address)
    cases: list[tuple[MarketParams, str]] = [
        (replace(FAST, min_clock_seconds=0), "minClockSeconds"),
        (replace(FAST, max_clock_seconds=FAST.min_clock_seconds - 1), "maxClockSeconds"),
        (replace(FAST, min_reveal_window=0), "minRevealWindow"),
        (replace(FAST, max_reveal_window=FAST.min_reveal_window - 1), "maxRevealWindow"),
        (replace(FAST, min_challenge_window=0), "minChallengeWindow"),
        (replace(FAST, max_challenge_window=FAST.min_challenge_window - 1), "maxChallengeWindow"),
        (replace(FAST, max_deadline_horizon=0), "maxDeadlineHorizon"),
        (replace(FAST, burn_bps=10_000), "burnBps"),
        (replace(FAST, disputes_per_bond_step=0), "disputesPerBondStep"),
        (replace(FAST, bond_floors=()), "bondFloors"),
        (replace(FAST, bond_floors=((ETH, 0),)), "bondFloors"),
        (FAST.with_token(ETH, 5), "bondFloors"),  # the same token twice
    ]
    for params, fld in cases:
        with pytest.raises(ContractRevert) as ei:
            deploy_market(w3, artifacts, game.address, params)
        assert ei.value.name == "InvalidMarketParams" and ei.value.fields["field"] == fld, ei.value
        assert twin_error(lambda p=params: check(p)).decoded == ei.value.decoded  # the twin agrees
    check(FAST)


# -- sybil self-challenge ---------------------------------------------------------------------------


@pytest.mark.parametrize("sybil_first", [False, True], ids=["honest-opens-first", "sybil-opens-first"])
def test_sybil_self_challenge_costs_the_cheater(env: Env, sybil_first: bool) -> None:
    """A cheater's sybil disputes the cheater's own result and wins its game before the honest
    challenger's game ends (the old rule: "the first resolved game takes the stake"). Now the
    stake goes to the EARLIEST-OPENED winning game, and half of it is burned: if the honest
    challenger opened first it gets the stake less the burn and the cheater loses all of it; if
    the sybil pre-empts it, the cheater still loses the burned half. No honest party loses."""
    honest, liar = ToyWorld(JOB), ToyWorld(JOB, LIE)
    job_id = toy_job(env, slots=1)
    cheater = env.trainers[0]
    join_and_submit(env, job_id, [liar.step_commitment(JOB.num_steps)])
    (sybil,) = sybils(env, 1)
    order = [sybil, env.challenger] if sybil_first else [env.challenger, sybil]
    gid = {who: env.dispute(job_id, 0, sender=who) for who in order}
    env.assert_solvent()
    client = games(env)
    # the sybil's game is played to the end first (it knows the truth: the cheater tells it) ...
    out_s = runner.play(client, gid[sybil], pl.Defender(liar), pl.Challenger(honest), env.chain.increase_time)
    assert out_s.winner == sybil and out_s.resolution == Resolution.STEP
    assert env.market.slot(job_id, 0).stake_held == STAKE  # the honest game still runs: nothing assigned
    env.assert_solvent()
    # ... then the honest challenger's
    out_h = runner.play(client, gid[env.challenger], pl.Defender(liar), pl.Challenger(honest), env.chain.increase_time)
    assert out_h.winner == env.challenger
    first = order[0]
    assert env.market.slot(job_id, 0).beaten_winner == first
    assert env.market.balance_of(first, env.token) == BOND + STAKE_PAID
    assert env.market.balance_of(order[1], env.token) == BOND
    assert env.market.burned(env.token) == STAKE_BURN
    env.assert_solvent()
    env.past_challenge(job_id)
    env.market.finalize(job_id)
    assert env.market.balance_of(cheater, env.token) == 0 and env.market.balance_of(env.client, env.token) == REWARD
    # what the cheater and its sybil lost together (gas not counted): the whole stake, or the burned half
    net = env.market.balance_of(sybil, env.token) - BOND - STAKE
    assert net == (-STAKE_BURN if sybil_first else -STAKE)
    env.withdraw_all()
    env.assert_solvent()


# -- move copying and step sniping ---------------------------------------------------------------------


class CopyCat(pl.Challenger):
    """Computes nothing: in its own game, replays the choices an honest challenger made in another
    game against the same (consistent) defender."""

    def __init__(self, client: DisputeGameClient, source: int) -> None:
        super().__init__(world=None)  # type: ignore[arg-type]
        self.client, self.source, self.done = client, source, 0

    def move(self, v: GameView, seen: pl.Seen) -> pl.Move | None:
        picks = [(n, a) for n, a in self.client.history(self.source) if n in ("Chosen", "ElementChosen")]
        if self.done >= len(picks):
            return None
        name, args = picks[self.done]
        self.done += 1
        if name == "ElementChosen":
            return pl.ChooseElement(int(args["element"]), seen.chunk)
        return pl.Choose(int(args["choice"]), seen.claims)


def test_move_copying_and_step_sniping_gain_nothing(env: Env) -> None:
    """After an honest challenger disputes a cheater, a copier opens its own dispute, copies every
    choice from the honest game and front-runs the final step with the honest transaction's own
    calldata, in its own game and in the honest one. It wins its game (its bond back) and the
    step it sniped in the honest game still resolves that game for the honest challenger: the
    stake goes to the earliest-opened winner, the honest one. Copying pays nothing."""
    honest, liar = ToyWorld(JOB), ToyWorld(JOB, LIE)
    job_id = toy_job(env, slots=1)
    join_and_submit(env, job_id, [liar.step_commitment(JOB.num_steps)])
    (copier,) = sybils(env, 1)
    g_h = env.dispute(job_id, 0, sender=env.challenger)
    g_c = env.dispute(job_id, 0, sender=copier)
    client = games(env)
    players = {g_h: (pl.Defender(liar), pl.Challenger(honest)), g_c: (pl.Defender(liar), CopyCat(client, g_h))}
    seen = {g: runner.seen_from_history(client, g) for g in players}
    for _ in range(100):  # both games move by move, the honest one first in every round
        views = {g: client.game(g) for g in players}
        if all(v.phase == Phase.L4_STEP for v in views.values()):
            break
        for g, v in views.items():
            if v.phase == Phase.L4_STEP:
                continue
            d, c = players[g]
            move = (d if v.phase.mover == Side.DEFENDER else c).move(v, seen[g])
            assert move is not None, (g, v.phase)
            sender = v.defender if v.phase.mover == Side.DEFENDER else v.challenger
            got = runner.apply(client, g, move, sender, v.phase.level)
            seen[g] = got or seen[g]
    vh, vc = client.game(g_h), client.game(g_c)
    assert (vh.step, vh.node_index, vh.element, vh.lo) == (vc.step, vc.node_index, vc.element, vc.lo)
    honest_step = pl.step_move(honest, vh)  # the honest challenger's transaction, as the mempool shows it
    assert honest_step is not None
    runner.apply(client, g_c, honest_step, copier, 4)  # front-run in its own game ...
    runner.apply(client, g_h, honest_step, copier, 4)  # ... and in the honest one
    with pytest.raises(ContractRevert) as ei:
        runner.apply(client, g_h, honest_step, env.challenger, 4)
    assert ei.value.name == "GameAlreadyResolved"
    stepped = [a for n, a in client.history(g_h) if n == "Stepped"]
    assert stepped[0]["caller"] == copier
    assert client.game(g_h).winner == env.challenger and client.game(g_c).winner == copier
    assert env.market.slot(job_id, 0).beaten_winner == env.challenger
    assert env.market.balance_of(env.challenger, env.token) == BOND + STAKE_PAID
    assert env.market.balance_of(copier, env.token) == BOND  # its own bond back, nothing more
    assert env.market.burned(env.token) == STAKE_BURN
    env.assert_solvent()


# -- copied results --------------------------------------------------------------------------------------


def test_copied_results_31_sybils_forfeit_their_stakes(env: Env) -> None:
    """31 sybils take the other slots of a 32-slot job and commit a copy of the honest trainer's
    commitment. After the deadline the honest trainer reveals; the sybils replay its reveal (result,
    checkpoint root and salt, all public now) and are refused: the commitment binds the trainer's
    address. At finalize each sybil forfeits its stake (half burned, half to the client) and the
    honest trainer takes the whole reward."""
    job_id = env.post(slots=32)
    good = env.trainers[0]
    result, salt, ckpt = keccak(b"the honest C_T"), keccak(b"secret salt"), keccak(b"ckpt")
    env.market.join(job_id, sender=good)
    env.market.commit_result(job_id, result, salt, good, ckpt)
    (posted,) = env.market.logs("ResultCommitted", 0)
    copied = bytes(posted.args["commitment"])
    flood = sybils(env, 31)
    for who in flood:
        env.market.join(job_id, sender=who)
        env.market.commit(job_id, copied, sender=who)
    env.assert_solvent()
    env.past_submission(job_id)
    env.market.reveal(job_id, result, ckpt, salt, sender=good)
    for slot, who in enumerate(flood, start=1):
        expect("CommitmentMismatch", lambda w=who: env.market.reveal(job_id, result, ckpt, salt, sender=w),
               slot=slot, computed=commitment(result, ckpt, salt, who), committed=copied)
    env.past_challenge(job_id)
    receipt = env.market.finalize(job_id)
    forfeits = env.market.events(receipt, "StakeForfeited")
    assert [(e.args["trainer"], e.args["beneficiary"], e.args["paid"], e.args["burnt"]) for e in forfeits] == [
        (who, env.client, STAKE_PAID, STAKE_BURN) for who in flood]
    assert env.market.job(job_id).accepted_result == result
    assert env.market.balance_of(good, env.token) == STAKE + REWARD
    assert env.market.balance_of(env.client, env.token) == 31 * STAKE_PAID
    assert env.market.burned(env.token) == 31 * STAKE_BURN
    assert all(env.market.balance_of(who, env.token) == 0 for who in flood)
    env.assert_solvent()


# -- bond below the defence's gas ---------------------------------------------------------------------


def test_bond_below_the_defence_gas_floor(env: Env) -> None:
    """The issue's 20,000 wei bond is refused. The floor is derived from the defence's gas: a
    lying challenger's forfeited bond, less the burn, pays at least the gas an honest defender
    spends on a whole game (measured here) at the profile's reference gas price (1 gwei)."""
    floor = env.market.params().floor(env.token)
    expect("TermsOutOfBounds", lambda: env.post(min_challenge_bond=20_000), field="minChallengeBond", value=20_000,
           min=floor)
    honest, liar = ToyWorld(JOB), ToyWorld(JOB, LIE)
    job_id = toy_job(env, slots=1, min_challenge_bond=floor)
    join_and_submit(env, job_id, [honest.step_commitment(JOB.num_steps)])
    gid = env.dispute(job_id, 0, bond=floor)
    out = runner.play(games(env), gid, pl.Defender(honest), pl.Challenger(liar), env.chain.increase_time)
    assert out.winner == env.trainers[0]
    _, paid = forfeit(floor)
    assert env.market.balance_of(env.trainers[0], env.token) == paid
    defence = out.total_gas("defender")
    assert 0 < defence <= DEFENCE_GAS and paid >= defence * 10**9
    env.assert_solvent()


# -- level-1 re-execution bound ---------------------------------------------------------------------


def test_level1_reexecution_is_bounded_by_the_checkpoint_interval(deploy: Callable[..., Any], artifacts: Any,
                                                                    w3: Web3) -> None:
    """A whole dispute over a 1,000-step digits job with a checkpoint every 100 steps (k = 16),
    played on chain with the real ScalarVM: each party re-executes at most 12% of the job (level 1
    settles on one checkpoint span first). The same game split evenly (N = 1 grid, the old rule)
    re-executes far more, so the bound comes from the checkpoint grid."""
    from verde_chain.examples.digits import digits_job
    from verde_chain.graph.world import OutputFault, TrainingWorld

    T, N = 1000, 100
    job = digits_job(steps=T, checkpoint_interval=N)
    node = [x.index for x in job.program.graph.nodes if x.label == "sgd/sgd_param"][-1]
    game = deploy("DisputeGame", deploy("ScalarVM").address)
    resolver = deploy("ResolverMock")
    client = DisputeGameClient(w3, game, artifacts)
    used = {}
    for grid in (N, 1):
        honest, liar = TrainingWorld.from_job(job), TrainingWorld.from_job(job, OutputFault(457, node, 1, 3))
        c_t = liar.step_commitment(T)
        assert honest.step_commitment(T) != c_t
        before = liar.executed, honest.executed
        p = GameParams(w3.eth.accounts[1], w3.eth.accounts[2], job.spec.initial_commitment, c_t, T,
                       job.spec.graph_root, job.spec.batch_root, 16, CLOCK, job.spec.num_nodes, grid)
        gid = client.create_game_via(resolver, p)
        out = runner.play(client, gid, pl.Defender(liar), pl.Challenger(honest), lambda s: increase_time(w3, s))
        assert out.winner == w3.eth.accounts[2] and out.final is not None and out.final.step == 457
        used[grid] = max(liar.executed - before[0], honest.executed - before[1])
    assert used[N] <= 0.12 * T and used[1] > 3 * used[N]
