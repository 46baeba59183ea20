"""Hugging Face language models: a RepOps training step against torch eager, same thread count.

    .venv/bin/python scripts/bench_lm.py [--arch llama] [--hidden 64] [--layers 2] [--seq 16]
                                         [--batch 2] [--threads 1] [--steps 20] [--json]
    .venv/bin/python scripts/bench_lm.py --gpt2-small [--threads 2] [--steps 3]

Default: a tiny model (``examples/lm.py``'s LMConfig; the issue's tiny Llama), AdamW, next-token
cross-entropy, in one process: torch eager's step (zero_grad, ``model(ids, labels=ids).loss``,
backward, AdamW step: transformers shifts the labels as the RepOps job's dataset does), a plain
RepOps step (the whole-step kernel: what a run does between checkpoints) and a committed one
(plus every tensor root, node hash and C_s), and the amortised step of a run of two checkpoint
intervals as ``verde-chain train`` runs it (C_s at each checkpoint, checkpoint writes included).
Medians after warm-up; ratios RepOps / torch.

``--gpt2-small``: GPT-2 small (12 layers, hidden 768, 12 heads, vocabulary 50,257: 124 M
parameters; sequence 128, batch 4; random weights from the config). Torch and RepOps each run in
a fresh child process, which reports its peak RSS (``ru_maxrss``: the model, the optimizer state
and the step's tensors) and its median step time; RepOps also times the hashing of every
parameter and Adam state (the roots a checkpoint commits). The parent prints both ratios. A side
whose RSS passes ``--max-rss-gib`` (default 12: the machine is shared) is stopped, and the
memory ratio is reported as a lower bound.
"""

from __future__ import annotations

import argparse
import gc
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_training import interval_run, median_time

import verde_chain.graph.executor as ex
from verde_chain.commit.native import tensor_roots
from verde_chain.examples.lm import LMConfig, hf_model, lm_job
from verde_chain.graph.backend import make_runner

GPT2_SMALL = LMConfig("gpt2", layers=12, hidden=768, heads=12, vocab=50257, seq=128, batch=4)


def torch_step(cfg: LMConfig, lr: float, weight_decay: float):  # type: ignore[no-untyped-def]
    """A plain torch eager FP32 step of the same model (train mode: dropout is 0 in the config)."""
    model = hf_model(cfg).train()
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, cfg.vocab, (cfg.batch, cfg.seq), generator=gen)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()

    return step


def repops_times(cfg: LMConfig, steps: int, threads: int, keep_all: bool = False) -> dict[str, float]:
    """Median plain and committed step (s) of the RepOps job, and the hashing of the state.
    ``keep_all``: the steps keep every node output (the full arena layout) instead of the
    shared layout a run uses (docs/training.md, "The step's memory")."""
    job = lm_job(cfg, steps=steps + 3, checkpoint_interval=0)
    runner = make_runner("cpu", threads)
    plain = job.make_run(None, 0, runner, steps + 3)
    if keep_all:
        plain.keep = None
    plain.run()
    plain_s = statistics.median(log.wall_s for log in plain.logs[3:] if log.commitment is None)
    del plain
    gc.collect()  # a run and its Commitments refer to each other: free its kernel and arenas now
    full = job.make_run(None, 0, runner, steps + 3)
    full.commit_every = True
    if keep_all:
        full.keep = None
    full.run()
    committed_s = statistics.median(log.wall_s for log in full.logs[3:])
    # a state from a plain step on the run's own (shared) layout: its roots not yet taken
    ex, st = full.exec, full.exec.run_plain(full.state, job.batch(1), keep=full.keep).state
    del full
    gc.collect()
    t0 = time.perf_counter()
    roots = ex.ensure_roots(st)
    hash_s = time.perf_counter() - t0
    numel = sum(s.numel for s in job.program.graph.states)
    return {"plain_s": plain_s, "committed_s": committed_s, "state_hash_s": hash_s, "state_tensors": len(roots),
            "state_numel": numel, "nodes": len(job.program.graph.nodes)}  # fmt: skip


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child(side: str, steps: int, threads: int) -> None:
    """One side of --gpt2-small in this (fresh) process: prints one JSON line."""
    torch.set_num_threads(threads)
    cfg = GPT2_SMALL
    if side == "torch":
        out: dict[str, Any] = {"step_s": median_time(torch_step(cfg, 1e-3, 0.01), steps, warmup=1)}
    else:
        out = repops_times(cfg, steps, threads)
        out["step_s"] = out["committed_s"]
    out["peak_rss_mib"] = peak_rss_mib()
    print(json.dumps(out))


def run_child(side: str, steps: int, threads: int, cap_mib: float) -> dict[str, Any]:
    """One side in a fresh process, its RSS watched: past ``cap_mib`` (a machine shared with
    others) it is stopped and reported as {"over_cap_mib": cap} (its peak is at least that)."""
    cmd = [sys.executable, __file__, "--child", side, "--steps", str(steps), "--threads", str(threads)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    status = Path(f"/proc/{proc.pid}/status")
    while proc.poll() is None:
        try:
            rss_kib = next(int(ln.split()[1]) for ln in status.read_text().splitlines() if ln.startswith("VmRSS:"))
        except (OSError, StopIteration, ValueError):
            rss_kib = 0
        if rss_kib / 1024 > cap_mib:
            proc.kill()
            proc.communicate()
            return {"over_cap_mib": cap_mib}
        time.sleep(0.2)
    out, err = proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(f"the {side} process failed:\n{err[-3000:]}")
    return dict(json.loads(out.strip().splitlines()[-1]))


def hash_state(cfg: LMConfig, threads: int) -> tuple[float, int, int]:
    """(seconds, tensors, elements) of the tensor roots of every parameter and its two Adam
    moments (the same sizes as the job's state; the time does not depend on the values)."""
    params = [p.detach().numpy() for p in hf_model(cfg).parameters()]
    state = params + [np.full_like(p, 0.5) for p in params] + [np.full_like(p, 0.25) for p in params]
    tensor_roots(state[:3], threads)  # load the library
    t0 = time.perf_counter()
    tensor_roots(state, threads)
    return time.perf_counter() - t0, len(state), sum(p.size for p in state)


def gpt2_small(steps: int, threads: int, cap_mib: float) -> dict[str, Any]:
    hash_s, n_hashed, numel_hashed = hash_state(GPT2_SMALL, threads)
    print(f"hashing every parameter and both Adam moments of GPT-2 small ({n_hashed} tensors, "
          f"{numel_hashed / 1e6:.1f} M elements) on {threads} thread(s): {hash_s:.2f} s (goal <= 1 s)")
    t = run_child("torch", steps, threads, cap_mib)
    if "over_cap_mib" in t:
        raise SystemExit(f"torch eager alone passed the {cap_mib:.0f} MiB cap (--max-rss-gib)")
    r = run_child("repops", steps, threads, cap_mib)
    if "over_cap_mib" in r:
        print(f"GPT-2 small, {threads} thread(s): torch eager step {t['step_s']:.3f} s, peak RSS "
              f"{t['peak_rss_mib']:.0f} MiB; RepOps passed the {cap_mib:.0f} MiB cap and was stopped: peak "
              f"memory ratio > {cap_mib / t['peak_rss_mib']:.1f}x (goal <= 2x)")
        return {"threads": threads, "torch": t, "repops": r, "hash_s": hash_s}
    params = sum(p.numel() for p in hf_model(GPT2_SMALL).parameters())
    print(f"GPT-2 small ({params / 1e6:.1f} M parameters, seq {GPT2_SMALL.seq}, batch {GPT2_SMALL.batch}), "
          f"{threads} thread(s), {r['nodes']} nodes")
    print(f"torch eager step        {t['step_s']:8.3f} s   peak RSS {t['peak_rss_mib']:8.0f} MiB")
    print(f"RepOps plain step       {r['plain_s']:8.3f} s")
    print(f"RepOps committed step   {r['committed_s']:8.3f} s   peak RSS {r['peak_rss_mib']:8.0f} MiB")
    print(f"ratios: committed step time {r['committed_s'] / t['step_s']:.2f}x (goal <= 1.5x), "
          f"peak memory {r['peak_rss_mib'] / t['peak_rss_mib']:.2f}x (goal <= 2x)")
    print(f"hashing all parameters and Adam state ({r['state_tensors']} tensors, {r['state_numel'] / 1e6:.1f} M "
          f"elements): {r['state_hash_s']:.2f} s (goal <= 1 s)")
    return {"threads": threads, "torch": t, "repops": r, "params": params, "hash_s": hash_s}


def tiny(cfg: LMConfig, steps: int, threads: int) -> dict[str, Any]:
    torch.set_num_threads(threads)
    job = lm_job(cfg, steps=2)
    o = job.spec.optimizer
    torch_s = median_time(torch_step(cfg, o.lr, o.weight_decay), max(steps, 20))
    r = repops_times(cfg, steps, threads)
    full = repops_times(cfg, steps, threads, keep_all=True)
    # a run as `verde-chain train` does it: C_s at every checkpoint (default interval), plain
    # steps between, checkpoint writes included
    interval = ex.DEFAULT_CHECKPOINT_INTERVAL
    run_steps = 2 * interval
    wall, _, _ = interval_run(lm_job(cfg, steps=run_steps), make_runner("cpu", threads), interval, run_steps,
                              keep_all=False)
    r["run_s"] = wall / run_steps
    print(f"{cfg.arch} (layers {cfg.layers}, hidden {cfg.hidden}, seq {cfg.seq}, batch {cfg.batch}), {threads} "
          f"thread(s), {r['nodes']} nodes; ms per step")
    print(f"torch eager {1e3 * torch_s:8.3f}   RepOps plain {1e3 * r['plain_s']:8.3f} "
          f"({r['plain_s'] / torch_s:.2f}x)   committed {1e3 * r['committed_s']:8.3f} "
          f"({r['committed_s'] / torch_s:.2f}x)   run at checkpoint interval {interval} "
          f"{1e3 * r['run_s']:8.3f} ({r['run_s'] / torch_s:.2f}x)")
    print(f"the same steps keeping every node output (full arena): plain {1e3 * full['plain_s']:8.3f} "
          f"committed {1e3 * full['committed_s']:8.3f}; shared / full: plain {r['plain_s'] / full['plain_s']:.2f}x "
          f"committed {r['committed_s'] / full['committed_s']:.2f}x")
    return {"threads": threads, "torch_ms": 1e3 * torch_s, **{k: v for k, v in r.items()},
            "full_plain_ms": 1e3 * full["plain_s"], "full_committed_ms": 1e3 * full["committed_s"]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", default="llama", choices=("gpt2", "llama"))  # causal: labels = the ids
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--seq", type=int, default=16)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--gpt2-small", action="store_true")
    p.add_argument("--max-rss-gib", type=float, default=12.0, help="stop a --gpt2-small side past this RSS")
    p.add_argument("--child", choices=("torch", "repops"), help=argparse.SUPPRESS)
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    if a.child:
        child(a.child, a.steps, a.threads)
        return
    if a.gpt2_small:
        rep = gpt2_small(a.steps, a.threads, 1024 * a.max_rss_gib)
    else:
        rep = tiny(LMConfig(a.arch, a.layers, a.hidden, vocab=128, seq=a.seq, batch=a.batch), a.steps, a.threads)
    if a.json:
        print(json.dumps(rep, default=float))


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
