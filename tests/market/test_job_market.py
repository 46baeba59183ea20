"""JobMarket: lifecycle, commit-reveal, disputes, pairwise rival disputes, forfeits and burns,
deadlines and solvency, in ETH and ERC-20 (market deployed with the fast profile).

Every scenario ends with the solvency check: the market's ETH and token balances equal what it
owes, computed two ways (its own ``totalOwed`` and the sum of rewards + stakes + active bonds +
withdrawable balances + the burned total read back from the views). Amounts are checked to the
wei; the burned share of a forfeit comes from the Python twin ``split_forfeit``.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import pytest
from eth_utils import keccak
from hypothesis import given, settings
from hypothesis import strategies as st
from web3 import Web3

from tests.support.market import (
    BOND,
    BOND_BURN,
    BOND_PAID,
    C_0,
    REWARD,
    STAKE,
    STAKE_BURN,
    STAKE_PAID,
    TRUE_RESULT,
    Env,
    expect,
    join_and_submit,
    make_env,
    wrong_result,
)
from tests.support.toy import Fault, ToyJob, ToyWorld, default_graph
from verde_chain.chain.dispute_client import DisputeGameClient
from verde_chain.chain.market_client import Market
from verde_chain.chain.tx import transact
from verde_chain.dispute import players as pl
from verde_chain.dispute import runner
from verde_chain.dispute.types import Resolution
from verde_chain.errors import ContractRevert, CustomError
from verde_chain.market.marketparams import FAST, check_job, split_forfeit
from verde_chain.market.types import (
    ETH,
    MAX_SLOTS,
    ZERO32,
    JobStatus,
    SlotStatus,
    commitment,
    reward_share,
    validate,
)

pytestmark = pytest.mark.chain


# -- pure rules ---------------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 10**30), st.integers(1, MAX_SLOTS))
def test_reward_shares_sum_to_reward(reward: int, n: int) -> None:
    shares = [reward_share(reward, n, r) for r in range(n)]
    assert sum(shares) == reward and max(shares) - min(shares) < n


# -- lifecycle ----------------------------------------------------------------------------------


def test_honest_lifecycle(env: Env) -> None:
    assert env.market.game_address() == env.game.address and env.market.max_slots() == 32
    job_id = env.post()
    assert env.market.job(job_id).status is JobStatus.OPEN
    env.assert_solvent()
    join_and_submit(env, job_id, [TRUE_RESULT] * 3)
    env.assert_solvent()
    env.past_challenge(job_id)
    receipt = env.market.finalize(job_id)
    (fin,) = env.market.events(receipt, "JobFinalized")
    assert fin.args["acceptedResult"] == TRUE_RESULT and fin.args["accepted"] == 3
    job = env.market.job(job_id)
    assert job.status is JobStatus.FINALIZED and job.accepted_result == TRUE_RESULT and job.reward_held == 0
    expected = [STAKE + reward_share(REWARD, 3, r) for r in range(3)]
    assert expected[0] == STAKE + REWARD // 3 + 1 and sum(expected) == 3 * STAKE + REWARD  # no dust
    assert [env.market.balance_of(t, env.token) for t in env.trainers] == expected
    assert all(s.status is SlotStatus.SETTLED and s.stake_held == 0 for s in env.market.slots(job_id))
    env.assert_solvent()
    # a bot following the chain sees every commitment, then every reveal, in the logs
    coms = env.market.logs("ResultCommitted", from_block=0)
    assert [e.args["commitment"] for e in coms] == [env.market.slot(job_id, i).commitment for i in range(3)]
    subs = env.market.logs("ResultRevealed", from_block=0)
    assert [(e.args["slot"], e.args["result"]) for e in subs] == [(i, TRUE_RESULT) for i in range(3)]
    (posted,) = env.market.logs("JobPosted", from_block=0)
    assert posted.args["bundleUri"] == env.market.job(job_id).terms.bundle_uri == "https://bundles.example/job-spec"
    paid = env.withdraw_all()
    assert paid == dict(zip(env.trainers, expected))
    assert env.market.token_balance(env.token) == 0 == env.market.total_owed(env.token)
    env.assert_solvent()


def test_erc20_balances_move_on_withdraw(w3: Web3, artifacts: Any, deploy: Callable[..., Any], chain: Any) -> None:
    env = make_env(w3, artifacts, deploy, chain, "token", mock=False)
    tok = env.token_contract
    before = {a: tok.functions.balanceOf(a).call() for a in env.accounts}
    job_id = env.post(slots=1)
    join_and_submit(env, job_id, [TRUE_RESULT])
    env.past_challenge(job_id)
    env.market.finalize(job_id)
    env.withdraw_all()
    after = {a: tok.functions.balanceOf(a).call() for a in env.accounts}
    assert after[env.client] == before[env.client] - REWARD
    assert after[env.trainers[0]] == before[env.trainers[0]] + REWARD


def test_eth_withdraw_pays_out(w3: Web3, artifacts: Any, deploy: Callable[..., Any], chain: Any) -> None:
    env = make_env(w3, artifacts, deploy, chain, "eth", mock=False)
    job_id = env.post(slots=1)
    join_and_submit(env, job_id, [TRUE_RESULT])
    env.past_challenge(job_id)
    env.market.finalize(job_id)
    t = env.trainers[0]
    before = env.w3.eth.get_balance(t)
    receipt = env.market.contract.functions.withdraw(ETH).transact({"from": t})
    r = env.w3.eth.wait_for_transaction_receipt(receipt)
    gas_cost = r["gasUsed"] * r["effectiveGasPrice"]
    assert env.w3.eth.get_balance(t) == before + STAKE + REWARD - gas_cost
    assert env.w3.eth.get_balance(env.market.address) == 0


# -- disputes -----------------------------------------------------------------------------------


def test_cheating_trainer_loses_stake_to_challenger(env: Env) -> None:
    job_id = env.post(slots=1)
    join_and_submit(env, job_id, [wrong_result()])
    gid = env.dispute(job_id, 0)
    g = env.game_state(gid)
    # the game is bound to the job: C_0, the defender's C_T, T, graph, batches, arity, nodes;
    # the market is its resolver
    assert (g["defender"], g["challenger"], g["resolver"]) == (env.trainers[0], env.challenger, env.market.address)
    assert (g["initialCommitment"], g["finalCommitment"], g["graphRoot"], g["batchRoot"]) == (
        C_0, wrong_result(), keccak(b"graph"), keccak(b"batches"))
    assert (g["numSteps"], g["arity"], g["numNodes"]) == (1000, 8, 4)
    assert env.game.functions.turn(gid).call() == env.trainers[0]
    assert env.market.job(job_id).active_disputes == 1
    env.assert_solvent()
    env.resolve(gid, defender_wins=False)
    # the bond comes back whole; of the beaten stake half is burned, the rest goes to the winner
    assert env.market.balance_of(env.challenger, env.token) == BOND + STAKE_PAID
    assert env.market.burned(env.token) == STAKE_BURN
    assert env.market.slot(job_id, 0).status is SlotStatus.REJECTED
    env.assert_solvent()
    env.past_challenge(job_id)
    env.market.finalize(job_id)
    # nobody survived: the reward goes back to the client, the cheater gets nothing
    assert env.market.balance_of(env.client, env.token) == REWARD
    assert env.market.balance_of(env.trainers[0], env.token) == 0
    assert env.market.job(job_id).accepted_result == ZERO32
    env.assert_solvent()
    env.withdraw_all()
    env.assert_solvent()


def test_lying_challenger_loses_bond(env: Env) -> None:
    job_id = env.post(slots=1)
    join_and_submit(env, job_id, [TRUE_RESULT])
    gid = env.dispute(job_id, 0, bond=BOND + 7)  # bonds above the minimum are allowed and at risk
    env.resolve(gid, defender_wins=True)
    burn, paid = split_forfeit(BOND + 7, FAST.burn_bps)
    assert env.market.balance_of(env.trainers[0], env.token) == paid and env.market.burned(env.token) == burn
    assert env.market.balance_of(env.challenger, env.token) == 0
    assert env.market.slot(job_id, 0).status is SlotStatus.REVEALED
    env.assert_solvent()
    env.past_challenge(job_id)
    env.market.finalize(job_id)
    assert env.market.balance_of(env.trainers[0], env.token) == paid + STAKE + REWARD
    env.assert_solvent()


def test_concurrent_challengers_against_a_cheater(env: Env) -> None:
    """Two honest challengers: the EARLIEST-OPENED winner takes the stake (less the burn) even if
    the other's game ends first; the stake waits until both games are over; neither loses money."""
    job_id = env.post(slots=1)
    join_and_submit(env, job_id, [wrong_result()])
    g1 = env.dispute(job_id, 0, sender=env.challenger)
    g2 = env.dispute(job_id, 0, sender=env.outsider)
    env.resolve(g2, defender_wins=False)
    # the result is now rejected: a third dispute would be pointless and is refused
    expect("NotDisputable", lambda: env.dispute(job_id, 0, sender=env.client), slot=0,
           status=int(SlotStatus.REJECTED))
    # g1 still runs, so the stake is not assigned yet: only g2's bond came back
    s = env.market.slot(job_id, 0)
    assert (s.stake_held, s.beaten_by, s.beaten_winner) == (STAKE, g2, env.outsider)
    assert env.market.balance_of(env.outsider, env.token) == BOND
    env.assert_solvent()
    env.resolve(g1, defender_wins=False)
    s = env.market.slot(job_id, 0)
    assert (s.stake_held, s.beaten_by, s.beaten_winner) == (0, g1, env.challenger)
    assert env.market.balance_of(env.outsider, env.token) == BOND
    assert env.market.balance_of(env.challenger, env.token) == BOND + STAKE_PAID
    assert env.market.burned(env.token) == STAKE_BURN
    env.assert_solvent()


def test_pairwise_rivals_k3(env: Env) -> None:
    """Trainers 0 and 1 are honest, 2 cheats. 2 disputes 0 and loses; 1 and 0 agree; the cheater's
    stake pays the honest defender and the honest pair shares the reward."""
    job_id = env.post()
    join_and_submit(env, job_id, [TRUE_RESULT, TRUE_RESULT, wrong_result()])
    assert env.market.rivals(job_id, 0) == [2] and env.market.rivals(job_id, 2) == [0, 1]
    expect("SameResult", lambda: env.rival(job_id, 0, 1), result=TRUE_RESULT)
    g = env.rival(job_id, 0, 2)  # the cheater attacks an honest result, locking a bond like anyone
    assert (env.market.dispute(g).challenger, env.market.dispute(g).bond) == (env.trainers[2], BOND)
    env.resolve(g, defender_wins=True)
    assert env.market.slot(job_id, 2).status is SlotStatus.REJECTED
    # the honest defender wins the rival's bond and its stake, each less the burn
    won = BOND_PAID + STAKE_PAID
    assert env.market.balance_of(env.trainers[0], env.token) == won
    assert env.market.burned(env.token) == BOND_BURN + STAKE_BURN
    # the rejected result can no longer be disputed nor used to dispute
    expect("NotDisputable", lambda: env.rival(job_id, 2, 1), slot=2)
    expect("NotDisputable", lambda: env.rival(job_id, 1, 2), slot=2)
    env.assert_solvent()
    env.past_challenge(job_id)
    env.market.finalize(job_id)
    assert env.market.balance_of(env.trainers[0], env.token) == won + STAKE + reward_share(REWARD, 2, 0)
    assert env.market.balance_of(env.trainers[1], env.token) == STAKE + reward_share(REWARD, 2, 1)
    assert env.market.balance_of(env.trainers[2], env.token) == 0
    assert env.market.job(job_id).accepted_result == TRUE_RESULT
    env.assert_solvent()


def test_pairwise_honest_attacks_cheater(env: Env) -> None:
    job_id = env.post()
    join_and_submit(env, job_id, [wrong_result("a"), TRUE_RESULT, wrong_result("b")])
    g0 = env.rival(job_id, 0, 1)  # honest trainer 1 attacks cheater 0
    g2 = env.rival(job_id, 2, 1)  # ... and cheater 2, concurrently
    env.past_challenge(job_id)
    expect("DisputesPending", lambda: env.market.finalize(job_id), active=2)
    env.resolve(g0, defender_wins=False)
    env.resolve(g2, defender_wins=False)
    env.market.finalize(job_id)
    # both bonds back, both cheaters' stakes less the burn, its own stake and the whole reward
    assert env.market.balance_of(env.trainers[1], env.token) == 2 * BOND + 2 * STAKE_PAID + STAKE + REWARD
    assert env.market.burned(env.token) == 2 * STAKE_BURN
    assert [s.status for s in env.market.slots(job_id)] == [SlotStatus.REJECTED, SlotStatus.SETTLED,
                                                            SlotStatus.REJECTED]
    env.assert_solvent()


def test_disagreeing_survivors_refund_client(env: Env) -> None:
    """Nobody disputed two different results: no result is accepted, the client gets the reward
    back and both trainers their stakes (an honest trainer avoids this by disputing its rival)."""
    job_id = env.post(slots=2)
    join_and_submit(env, job_id, [TRUE_RESULT, wrong_result()])
    env.past_challenge(job_id)
    (fin,) = env.market.events(env.market.finalize(job_id), "JobFinalized")
    assert fin.args["acceptedResult"] == ZERO32 and fin.args["accepted"] == 0
    assert env.market.balance_of(env.client, env.token) == REWARD
    assert [env.market.balance_of(t, env.token) for t in env.trainers[:2]] == [STAKE, STAKE]
    env.assert_solvent()


def test_no_show_and_unrevealed_stakes_are_forfeited(env: Env) -> None:
    """A slot that never committed and one that committed but never revealed forfeit their
    stakes at finalize: half burned, the rest to the client."""
    job_id = env.post(slots=3)
    for t in env.trainers:
        env.market.join(job_id, sender=t)
    env.commit(job_id, TRUE_RESULT, env.trainers[0])
    env.commit(job_id, TRUE_RESULT, env.trainers[1])
    env.past_submission(job_id)
    env.reveal(job_id, TRUE_RESULT, env.trainers[0])
    env.past_challenge(job_id)
    receipt = env.market.finalize(job_id)
    forfeits = env.market.events(receipt, "StakeForfeited")
    assert [(e.args["slot"], e.args["beneficiary"], e.args["paid"], e.args["burnt"]) for e in forfeits] == [
        (1, env.client, STAKE_PAID, STAKE_BURN), (2, env.client, STAKE_PAID, STAKE_BURN)]
    assert env.market.balance_of(env.client, env.token) == 2 * STAKE_PAID
    assert env.market.burned(env.token) == 2 * STAKE_BURN
    assert env.market.balance_of(env.trainers[0], env.token) == STAKE + REWARD
    assert [s.status for s in env.market.slots(job_id)] == [SlotStatus.SETTLED] * 3
    env.assert_solvent()


def test_no_trainers_refunds_client(env: Env) -> None:
    job_id = env.post()
    env.past_challenge(job_id)
    env.market.finalize(job_id)
    assert env.market.balance_of(env.client, env.token) == REWARD
    env.assert_solvent()


# -- named reverts --------------------------------------------------------------------------------


def test_posting_rejects_bad_specs(env: Env) -> None:
    for over, fld in [
        ({"num_steps": 0}, "numSteps"),
        ({"checkpoint_interval": 0}, "checkpointInterval"),
        ({"checkpoint_interval": 1001}, "checkpointInterval"),
        ({"slots": 0}, "slots"),
        ({"slots": 33}, "slots"),
        ({"trainer_stake": 0}, "trainerStake"),
        ({"arity": 1}, "arity"),
        ({"arity": 12}, "arity"),
        ({"arity": 512}, "arity"),
        ({"num_nodes": 0}, "numNodes"),
        ({"initial_commitment": ZERO32}, "initialCommitment"),
        ({"graph_root": ZERO32}, "graphRoot"),
        ({"reward": 0}, "reward"),
        ({"bundle_uri": "x" * 2049}, "bundleUri"),
    ]:
        with pytest.raises(CustomError) as twin:  # the Python twin raises what the market reverts with
            validate(env.terms(**over))
        sol = expect("InvalidJobTerms", lambda over=over: env.post(**over), field=fld)
        assert twin.value.decoded == sol.decoded
    validate(env.terms())
    check_job(env.terms(), env.market.params(), env.chain.timestamp() + 1)
    # an empty bundle URI and one of the maximum length are fine
    env.post(bundle_uri="")
    env.post(bundle_uri="u" * 2048)
    env.assert_solvent()


def test_payment_must_match(env: Env) -> None:
    terms = env.terms()
    m = env.market
    if env.token == ETH:
        fn = m.contract.functions.postJob(terms.as_tuple())
        expect("WrongPayment", lambda: m._tx(fn, env.client, REWARD - 1), sent=REWARD - 1, expected=REWARD)
        job_id = env.post()
        expect("WrongPayment", lambda: m._tx(m.contract.functions.join(job_id), env.trainers[0], STAKE + 1))
        join_and_submit(env, job_id, [TRUE_RESULT])
        fn2 = m.contract.functions.openDispute(job_id, 0, BOND)
        expect("WrongPayment", lambda: m._tx(fn2, env.challenger, 0), sent=0, expected=BOND)
    else:
        # ETH sent along with a token payment would be stranded: refused
        m._pay(env.token, REWARD, env.client)
        fn = m.contract.functions.postJob(terms.as_tuple())
        expect("WrongPayment", lambda: m._tx(fn, env.client, 1), sent=1, expected=0)
        # without an allowance the token itself refuses (OpenZeppelin's named error)
        spender = env.outsider
        with pytest.raises(ContractRevert) as ei:
            m._tx(m.contract.functions.postJob(terms.as_tuple()), spender)
        assert ei.value.name == "ERC20InsufficientAllowance"
    env.assert_solvent()


def test_trainer_rules(env: Env) -> None:
    m = env.market
    expect("UnknownJob", lambda: m.join(99, sender=env.trainers[0]), jobId=99)
    job_id = env.post(slots=2)
    t0, t1, t2 = env.trainers
    m.join(job_id, sender=t0)
    expect("AlreadyJoined", lambda: m.join(job_id, sender=t0), trainer=t0, slot=0)
    m.join(job_id, sender=t1)
    expect("JobFull", lambda: m.join(job_id, sender=t2), slots=2)
    expect("NotATrainer", lambda: m.commit(job_id, keccak(b"c"), sender=t2), caller=t2)
    expect("EmptyCommitment", lambda: m.commit(job_id, ZERO32, sender=t0))
    c0 = env.commit(job_id, TRUE_RESULT, t0)
    expect("AlreadyCommitted", lambda: m.commit(job_id, keccak(b"other"), sender=t0), slot=0)
    # nothing is revealed before the deadline: every commitment must be final first
    deadline = m.job(job_id).terms.submission_deadline
    err = expect("RevealNotOpen", lambda: env.reveal(job_id, TRUE_RESULT, t0), opensAfter=deadline)
    assert err.fields["nowTs"] <= deadline
    env.past_submission(job_id)
    expect("SubmissionClosed", lambda: m.commit(job_id, keccak(b"late"), sender=t1), deadline=deadline)
    expect("NotCommitted", lambda: env.reveal(job_id, TRUE_RESULT, t1), slot=1, status=int(SlotStatus.JOINED))
    expect("NotATrainer", lambda: env.reveal(job_id, TRUE_RESULT, t2), caller=t2)
    expect("EmptyResult", lambda: m.reveal(job_id, ZERO32, keccak(b"ckpt" + TRUE_RESULT), env.salt(t0), sender=t0))
    # the preimage must be exact: another result, checkpoint root or salt does not open it
    for result, ckpt, salt in [(wrong_result(), keccak(b"ckpt" + TRUE_RESULT), env.salt(t0)),
                               (TRUE_RESULT, keccak(b"other ckpt"), env.salt(t0)),
                               (TRUE_RESULT, keccak(b"ckpt" + TRUE_RESULT), env.salt(t1))]:
        err = expect("CommitmentMismatch", lambda r=result, c=ckpt, sa=salt: m.reveal(job_id, r, c, sa, sender=t0),
                     slot=0, committed=c0)
        assert err.fields["computed"] == commitment(result, ckpt, salt, t0)
    # the contract's own helper agrees with the Python twin
    assert m.contract.functions.commitmentOf(TRUE_RESULT, keccak(b"ckpt" + TRUE_RESULT), env.salt(t0), t0).call() == c0
    env.reveal(job_id, TRUE_RESULT, t0)
    s0 = m.slot(job_id, 0)
    assert (s0.status, s0.result, s0.checkpoint_root) == (SlotStatus.REVEALED, TRUE_RESULT, keccak(b"ckpt" + TRUE_RESULT))
    expect("NotCommitted", lambda: env.reveal(job_id, TRUE_RESULT, t0), slot=0, status=int(SlotStatus.REVEALED))
    env.past_reveal(job_id)
    err = expect("RevealClosed", lambda: env.reveal(job_id, TRUE_RESULT, t1), deadline=m.reveal_deadline(job_id))
    assert err.fields["nowTs"] > m.reveal_deadline(job_id)
    env.assert_solvent()


def test_late_join_refused(env: Env) -> None:
    job_id = env.post()
    deadline = env.market.job(job_id).terms.submission_deadline
    env.past_submission(job_id)
    err = expect("SubmissionClosed", lambda: env.market.join(job_id, sender=env.trainers[0]), deadline=deadline)
    assert err.fields["nowTs"] > deadline


def test_dispute_rules(env: Env) -> None:
    m = env.market
    job_id = env.post()
    t0, t1, t2 = env.trainers
    m.join(job_id, sender=t0)
    m.join(job_id, sender=t1)
    env.commit(job_id, TRUE_RESULT, t0)
    env.commit(job_id, wrong_result(), t1)
    # a committed result is not public yet, so it cannot be disputed
    expect("NotDisputable", lambda: env.dispute(job_id, 0), slot=0, status=int(SlotStatus.COMMITTED))
    env.past_submission(job_id)
    env.reveal(job_id, TRUE_RESULT, t0)
    expect("UnknownSlot", lambda: env.dispute(job_id, 2), slot=2, slotsTaken=2)
    expect("NotDisputable", lambda: env.dispute(job_id, 1), slot=1, status=int(SlotStatus.COMMITTED))
    expect("SelfDispute", lambda: env.dispute(job_id, 0, sender=t0), slot=0)
    expect("BondTooSmall", lambda: env.dispute(job_id, 0, bond=BOND - 1), bond=BOND - 1, minimum=BOND)
    # rival disputes: caller must own the slot it names, and that slot must have revealed
    expect("NotATrainer", lambda: m.dispute_rival(job_id, 0, 1, sender=t2), caller=t2)
    expect("NotATrainer", lambda: m.dispute_rival(job_id, 0, 0, sender=t1))
    expect("NotDisputable", lambda: m.dispute_rival(job_id, 0, 1, sender=t1), slot=1)
    env.reveal(job_id, wrong_result(), t1)
    expect("SelfDispute", lambda: m.dispute_rival(job_id, 1, 1, sender=t1))
    expect("BondTooSmall", lambda: m.dispute_rival(job_id, 0, 1, sender=t1, bond=BOND - 1), minimum=BOND)
    # one game per challenger and result, rival or outside
    env.dispute(job_id, 1)
    expect("DuplicateDispute", lambda: env.dispute(job_id, 1), slot=1, challenger=env.challenger)
    env.rival(job_id, 0, 1)
    expect("DuplicateDispute", lambda: env.rival(job_id, 0, 1), slot=0, challenger=t1)
    assert m.has_disputed(job_id, 0, t1) and not m.has_disputed(job_id, 0, env.challenger)
    env.past_challenge(job_id)
    expect("ChallengeClosed", lambda: env.dispute(job_id, 0))
    expect("ChallengeClosed", lambda: env.rival(job_id, 0, 1))
    env.assert_solvent()


def test_resolution_rules(mock_env: Env) -> None:
    env = mock_env
    m = env.market
    job_id = env.post(slots=1)
    join_and_submit(env, job_id, [TRUE_RESULT])
    gid = env.dispute(job_id, 0)
    # only the game may report outcomes
    fn = m.contract.functions.onDisputeResolved(gid, env.challenger, env.trainers[0])
    expect("NotDisputeGame", lambda: m._tx(fn, env.challenger), caller=env.challenger, game=env.game.address)
    # the game must name the dispute's two parties
    with pytest.raises(ContractRevert) as ei:
        transact(env.w3, env.game.functions.resolveRaw(m.address, gid, env.outsider, env.trainers[0]), env.artifacts)
    assert ei.value.name == "WrongParties" and str(ei.value.fields["winner"]).lower() == env.outsider.lower()
    with pytest.raises(ContractRevert) as ei:
        transact(env.w3, env.game.functions.resolveRaw(m.address, 99, env.challenger, env.trainers[0]), env.artifacts)
    assert ei.value.name == "UnknownDispute"
    # a game handing out an id twice cannot overwrite the live dispute's escrow
    transact(env.w3, env.game.functions.rewind(gid), env.artifacts)
    expect("GameIdReused", lambda: env.dispute(job_id, 0, sender=env.outsider), gameId=gid)
    env.resolve(gid, defender_wins=True)
    # replayed resolution
    with pytest.raises(ContractRevert) as ei:
        env.resolve(gid, defender_wins=False)
    assert ei.value.name == "UnknownDispute" and ei.value.fields["gameId"] == gid
    assert m.balance_of(env.trainers[0], env.token) == BOND_PAID
    env.assert_solvent()


def test_game_resolves_once_and_pays_once(env: Env) -> None:
    job_id = env.post(slots=1)
    join_and_submit(env, job_id, [wrong_result()])
    gid = env.dispute(job_id, 0)
    env.resolve(gid, defender_wins=False)
    with pytest.raises(ContractRevert) as ei:
        transact(env.w3, env.game.functions.claimTimeout(gid), env.artifacts, sender=env.outsider)
    assert ei.value.name == "GameAlreadyResolved"
    # a move after resolution is refused too, and the market paid exactly once
    with pytest.raises(ContractRevert) as ei:
        transact(env.w3, env.game.functions.postClaims(gid, [keccak(b"x")] * 7), env.artifacts,
                 sender=env.trainers[0])
    assert ei.value.name == "GameAlreadyResolved"
    assert env.market.balance_of(env.challenger, env.token) == BOND + STAKE_PAID
    assert not env.market.dispute(gid).active
    env.assert_solvent()


def test_finalize_rules(env: Env) -> None:
    m = env.market
    expect("UnknownJob", lambda: m.finalize(42), jobId=42)
    job_id = env.post(slots=1)
    join_and_submit(env, job_id, [TRUE_RESULT])
    deadline = m.challenge_deadline(job_id)
    expect("ChallengeWindowOpen", lambda: m.finalize(job_id), deadline=deadline)
    env.past_challenge(job_id)
    m.finalize(job_id)
    expect("JobAlreadyFinalized", lambda: m.finalize(job_id), jobId=job_id)
    expect("JobAlreadyFinalized", lambda: m.join(job_id, sender=env.trainers[1]))
    env.withdraw_all()
    expect("NothingToWithdraw", lambda: m.withdraw(env.token, sender=env.trainers[0]), account=env.trainers[0])
    env.assert_solvent()


# -- randomised scenarios -----------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(6))
def test_random_scenarios_honest_never_lose(env: Env, seed: int) -> None:
    """Random mixes of honest and cheating trainers, outside challengers (honest or lying) and rival
    disputes; games are decided as the protocol guarantees (the correct side wins). Afterwards the
    honest parties end with at least what they put in, and the books balance after every step."""
    rng = random.Random(seed * 7919 + (0 if env.token == ETH else 1))
    n = rng.randint(1, 3)
    job_id = env.post(slots=n)
    honest = [rng.random() < 0.6 for _ in range(n)]
    results = [TRUE_RESULT if h else wrong_result(str(i)) for i, h in enumerate(honest)]
    join_and_submit(env, job_id, results)
    env.assert_solvent()
    games: list[tuple[int, bool]] = []  # (gameId, defender is right)
    for _ in range(rng.randint(0, 4)):
        slot = rng.randrange(n)
        s = env.market.slot(job_id, slot)
        if s.status is not SlotStatus.REVEALED:
            continue
        if rng.random() < 0.5 and n > 1:
            own = rng.choice([i for i in range(n) if i != slot])
            o = env.market.slot(job_id, own)
            if o.status is not SlotStatus.REVEALED or o.result == s.result \
                    or env.market.has_disputed(job_id, slot, o.trainer):
                continue
            games.append((env.rival(job_id, slot, own), honest[slot]))
        else:
            sender = rng.choice([env.challenger, env.outsider])
            if env.market.has_disputed(job_id, slot, sender):
                continue
            games.append((env.dispute(job_id, slot, sender=sender), honest[slot]))
        env.assert_solvent()
        if rng.random() < 0.5:  # resolve some games while others are still being opened
            gid, right = games.pop(0)
            env.resolve(gid, defender_wins=right)
            env.assert_solvent()
    for gid, right in games:
        env.resolve(gid, defender_wins=right)
        env.assert_solvent()
    env.past_challenge(job_id)
    env.market.finalize(job_id)
    env.assert_solvent()
    # honest trainers never lose: stake back (plus reward share when the result is accepted)
    accepted = env.market.job(job_id).accepted_result
    for i, h in enumerate(honest):
        if h:
            assert env.market.slot(job_id, i).status is SlotStatus.SETTLED
            assert env.market.balance_of(env.trainers[i], env.token) >= STAKE
        else:
            assert env.market.slot(job_id, i).status in (SlotStatus.REJECTED, SlotStatus.SETTLED)
    if any(honest):  # a wrong result can never be accepted next to a standing honest one
        assert accepted in (TRUE_RESULT, ZERO32)
    # outside challengers only ever disputed; they win exactly when the defender cheated
    for who in (env.challenger, env.outsider):
        disputes = [env.market.dispute(g) for g in env.game_ids]
        mine = [d for d in disputes if d.challenger == who and d.kind.name == "OUTSIDE"]
        won = [d for d in mine if not honest[d.defender_slot]]
        assert env.market.balance_of(who, env.token) >= BOND * len(won)
    env.withdraw_all()
    env.assert_solvent()
    assert env.market.total_owed(env.token) == env.market.burned(env.token)  # all but the burned share paid out


# -- hostile payees and tokens ------------------------------------------------------------------


def test_reentrant_withdraw_is_refused(w3: Web3, artifacts: Any, deploy: Callable[..., Any], chain: Any) -> None:
    game = deploy("DisputeGame", deploy("ToyStepper").address)
    market = Market.deploy(w3, artifacts, game.address, FAST)
    attacker = deploy("ReentrantClient", market.address)
    env = Env(w3, artifacts, chain, market, game, ETH, None, attacker.address, [], w3.eth.accounts[5],
              w3.eth.accounts[6])
    transact(w3, attacker.functions.post(env.terms().as_tuple()), artifacts, value=REWARD)
    env.past_challenge(1)
    market.finalize(1)  # no trainers: the reward is credited back to the (contract) client
    assert market.balance_of(attacker.address) == REWARD
    transact(w3, attacker.functions.setReenter(True), artifacts)
    with pytest.raises(ContractRevert) as ei:
        transact(w3, attacker.functions.pull(), artifacts)
    # the nested withdraw hits the guard, so the ETH transfer fails and the whole withdraw reverts
    assert ei.value.name == "EthTransferFailed"
    assert market.balance_of(attacker.address) == REWARD
    env.assert_solvent()
    transact(w3, attacker.functions.setReenter(False), artifacts)
    transact(w3, attacker.functions.pull(), artifacts)
    assert w3.eth.get_balance(attacker.address) == REWARD
    assert w3.eth.get_balance(market.address) == 0 == market.total_owed(ETH)


def test_fee_on_transfer_token_refused(w3: Web3, artifacts: Any, deploy: Callable[..., Any], chain: Any) -> None:
    game = deploy("DisputeGame", deploy("ToyStepper").address)
    fee = deploy("FeeOnTransferToken")
    market = Market.deploy(w3, artifacts, game.address, FAST.with_token(fee.address, BOND))
    client = w3.eth.accounts[1]
    transact(w3, fee.functions.mint(client, 10 * REWARD), artifacts)
    env = Env(w3, artifacts, chain, market, game, fee.address, fee, client, [], w3.eth.accounts[5], w3.eth.accounts[6])
    err = expect("TokenTransferShort", lambda: env.post())
    assert err.fields["received"] == REWARD - REWARD // 100 and err.fields["expected"] == REWARD
    env.assert_solvent()


# -- whole games played through the market (DisputeGame + ToyStepper + D1's players) ------------


def test_full_games_settle_through_market(env: Env) -> None:
    """k = 3 trainers on a toy job; trainer 1 runs a faulty execution. Honest trainer 0 disputes
    it (rival) and wins the played-out game down to the one-step proof; an outside challenger
    with a faulty world disputes honest trainer 2 and loses its bond. The honest pair shares the
    reward; the books balance after every game."""

    job = ToyJob(num_steps=12, nodes=default_graph(3, numels=[130], micro=[5]))
    honest = ToyWorld(job)
    faulty = ToyWorld(job, Fault("micro", step=7, node=1, element=129, micro=3))
    t_true, t_bad = honest.step_commitment(job.num_steps), faulty.step_commitment(job.num_steps)
    assert t_true != t_bad
    job_id = env.post(
        initial_commitment=honest.step_commitment(0), graph_root=job.graph_root, batch_root=job.batch_root,
        num_steps=job.num_steps, checkpoint_interval=4, num_nodes=job.num_nodes, arity=4, clock_seconds=600,
    )
    join_and_submit(env, job_id, [t_true, t_bad, t_true])
    client = DisputeGameClient(env.w3, env.game, env.artifacts)

    gid, _ = env.market.dispute_rival(job_id, 1, 0, sender=env.trainers[0], bond=BOND)
    out = runner.play(client, gid, pl.Defender(faulty), pl.Challenger(honest), env.chain.increase_time)
    assert out.winner == env.trainers[0] and out.resolution == Resolution.STEP
    assert env.market.slot(job_id, 1).status is SlotStatus.REJECTED
    assert env.market.balance_of(env.trainers[0], env.token) == BOND + STAKE_PAID
    env.game_ids.append(gid)
    env.assert_solvent()

    gid2 = env.market.open_dispute(job_id, 2, BOND, sender=env.challenger)[0]
    out2 = runner.play(client, gid2, pl.Defender(honest), pl.Challenger(faulty), env.chain.increase_time)
    assert out2.winner == env.trainers[2]
    assert env.market.balance_of(env.trainers[2], env.token) == BOND_PAID
    env.game_ids.append(gid2)
    env.assert_solvent()

    env.past_challenge(job_id)
    env.market.finalize(job_id)
    assert env.market.balance_of(env.trainers[0], env.token) == BOND + STAKE_PAID + STAKE + reward_share(REWARD, 2, 0)
    assert env.market.balance_of(env.trainers[2], env.token) == BOND_PAID + STAKE + reward_share(REWARD, 2, 1)
    assert env.market.burned(env.token) == STAKE_BURN + BOND_BURN
    assert env.market.balance_of(env.trainers[1], env.token) == 0
    assert env.market.balance_of(env.challenger, env.token) == 0
    assert env.market.job(job_id).accepted_result == t_true
    env.withdraw_all()
    env.assert_solvent()
    assert env.market.total_owed(env.token) == env.market.burned(env.token)  # all but the burned share paid out


@pytest.mark.parametrize("fault", [("input", 3, 2), ("desc", 1, 0), ("micro", 5, 1)])
def test_played_game_cheater_loses_stake_to_challenger(env: Env, fault: tuple[str, int, int]) -> None:
    """An outside challenger with the honest execution beats a faulty trainer in a game played
    to the end; it receives its bond back plus the trainer's stake less the burn, and the client its
    reward."""

    job = ToyJob(num_steps=6, nodes=default_graph(4, numels=[3, 200], micro=[4, 2]))
    honest = ToyWorld(job)
    kind, step, node = fault
    faulty = ToyWorld(job, Fault(kind, step=step, node=node, element=1, micro=2))
    job_id = env.post(
        slots=1, initial_commitment=honest.step_commitment(0), graph_root=job.graph_root, batch_root=job.batch_root,
        num_steps=job.num_steps, checkpoint_interval=2, num_nodes=job.num_nodes, arity=2,
    )
    join_and_submit(env, job_id, [faulty.step_commitment(job.num_steps)])
    gid = env.dispute(job_id, 0)
    client = DisputeGameClient(env.w3, env.game, env.artifacts)
    out = runner.play(client, gid, pl.Defender(faulty), pl.Challenger(honest), env.chain.increase_time)
    assert out.winner == env.challenger
    assert env.market.balance_of(env.challenger, env.token) == BOND + STAKE_PAID
    env.assert_solvent()
    env.past_challenge(job_id)
    env.market.finalize(job_id)
    assert env.market.balance_of(env.client, env.token) == REWARD
    assert env.market.balance_of(env.trainers[0], env.token) == 0
    env.assert_solvent()


def test_a_mined_revert_keeps_its_own_error(env: Env) -> None:
    """A transaction that fails once mined (sent with a fixed gas limit, so nothing is estimated
    first) is decoded as it failed in its own block: a commit landing one second after the deadline
    reads SubmissionClosed, though the same call replayed at the block before would succeed."""
    job_id = env.post(slots=1)
    t0 = env.trainers[0]
    env.market.join(job_id, sender=t0)
    deadline = env.market.job(job_id).terms.submission_deadline
    env.w3.provider.make_request("evm_setNextBlockTimestamp", [deadline + 1])  # type: ignore[arg-type]
    fn = env.market.contract.functions.commit(job_id, keccak(b"late"))
    with pytest.raises(ContractRevert) as ei:
        transact(env.w3, fn, env.artifacts, sender=t0, gas=200_000)
    assert ei.value.name == "SubmissionClosed"
    assert (ei.value.fields["deadline"], ei.value.fields["nowTs"]) == (deadline, deadline + 1)
    failed = env.w3.eth.get_block("latest")
    assert failed["timestamp"] == deadline + 1
    fn.call({"from": t0}, block_identifier=failed["number"] - 1)  # the old replay: no revert at all
    env.assert_solvent()
