"""``python -m recipe.sim.learned``: the tail cut (``best-onpolicy-spec``) with each drafter side by side in one run:
``group`` (a curve file of ``recipe/sim/curves``), an EAGLE-3 head frozen, the head trained online, and the two
together; for each, the acceptance it needs for 3x over verl's random order. Every row names its acceptance source.

The learned rows use ``recipe.sim.draft_head`` (the head's forwards charged on the roofline, its drift, training and
memory): the depth schedule by batch size is chosen once from the head's step-0 acceptance at ``--schedule-ctx``
tokens of context (vLLM takes one static ``num_speculative_tokens_per_batch_size``); the replicas lose the KV the
head's weights and cache take; EAGLE-3 keeps vLLM's async scheduling (``config/vllm.py`` exempts EAGLE methods), so
no sync penalty. The online head trains where it costs the run less time: after the actor update (its GPU-seconds
over ``Training.gpus``, added to the step; the head lags the policy by 1 step) or on GPUs idle in the next step's tail
(free up to the idle GPU-seconds, the rest added; it lags by 2). The combination takes, each step, the longer of the
head's and the group drafter's drafts (``ChainAcceptance.best_of``): an UPPER BOUND, since vLLM 0.24 runs one
proposer per engine (``speculative_config`` has one ``method``) and a wrapper would have to pick by expected match
before verifying; such a custom proposer turns async scheduling off (the sync penalty is charged) and pays the
group drafter's CPU per token and its router. Speed-ups and truncation are means over ``--seeds`` (H100 by default).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from dataclasses import dataclass

import numpy as np

from .__main__ import build_parser, engine_params, load_trace, spec_cost, trace_limits
from .draft_head import (K_MAX, LAG, MATH_HEAD, REF_K, WHERE, ChainAcceptance, DraftHead, Drift, LearnedSpeculation,
                         Training, best_depth, schedule)
from .run import ModelExecutor, run_policy, summarize
from .speculation import SYNC_PENALTY, AcceptanceCurve, SpecCost, needed_tau

POLICY = "best-onpolicy-spec"
GROUP_FILE = "recipe/sim/curves/math-heldout-issue43.json"
GROUP_DRAFTER = "suffix:own+group:k=4:depth=8:min=1:set=2"
GROUP_K = 4  # the group drafter's k in its name
GROUP_CPU_S = 1e-6  # s per emitted token (bench/group_drafter_cost.py; the README's speed table charges the same)
TARGET = 3.0


@dataclass(frozen=True)
class Drafter:
    """One learned row: the head's acceptance at policy version 0, frozen or online (trained ``where``), optionally
    beside the group drafter (``group``: its chain)."""

    name: str
    head: ChainAcceptance
    online: bool
    where: str = "after-actor"
    group: ChainAcceptance | None = None

    def acceptance(self, step: int, drift: Drift) -> ChainAcceptance:
        lag = min(step, LAG[self.where]) if self.online else step
        acc = drift.at(self.head, lag)
        if self.group is None:
            return acc
        return ChainAcceptance.best_of(acc, self.group, f"per step the longer of ({acc.source}) and the group "
                                                        f"drafter ({self.group.source}): an upper bound")


class LearnedExecutor(ModelExecutor):
    """The engine model with a learned drafter: the step's acceptance by drift, the schedule's depth by running
    count, the head's forwards, and (online) its training time charged per step."""

    def __init__(self, engine, seed: int, cost: SpecCost, drafter: Drafter, depths, *, head: DraftHead,
                 drift: Drift, training: Training, charge_draft: bool = True):
        super().__init__(engine, seed, cost)
        self.drafter, self.depths, self.head, self.drift, self.training = drafter, tuple(depths), head, drift, training
        self.charge_draft, self.step, self.train_s, self.tau_ref = charge_draft, 0, [], []

    def speculation(self, policy):
        if policy.spec.speculate == "off":
            return None
        acc = self.drafter.acceptance(self.step, self.drift)
        self.tau_ref.append(acc.tau(REF_K))
        extra = GROUP_CPU_S if self.drafter.group is not None else 0.0
        return LearnedSpeculation(self.spec_cost, self.head, acc, self.depths, extra, self.charge_draft)

    def run_step(self, policy, plan, launch, *, epoch, global_step):
        self.step = global_step
        res = super().run_step(policy, plan, launch, epoch=epoch, global_step=global_step)
        if not self.drafter.online:
            return res
        need = self.training.gpu_seconds(self.head, self.spec_cost, int(res.now.sum()))
        if self.drafter.where == "tail":
            idle = sum(self.spec_cost.tp * max(0.0, res.time_s - tl.time_s) for tl in self.last_timing.timelines)
            need = max(0.0, need - idle)
        extra = need / self.training.gpus
        self.train_s.append(extra)
        return dataclasses.replace(res, time_s=res.time_s + extra)


@dataclass
class Setup:
    """One seed's trace, engine and baseline (shared by every row)."""

    args: argparse.Namespace
    trace: object
    previous: object
    engine: object
    baseline: object


def setup(sim_argv: list[str], seed: int) -> Setup:
    args = build_parser().parse_args([*sim_argv, "--seed", str(seed)])
    trace = load_trace(args)
    trace = trace.subset(prompts=trace.num_prompts // args.batch_size * args.batch_size)
    engine, _ = engine_params(args)
    previous = trace.previous_run()
    base = run_policy(trace, "baseline", engine, batch_size=args.batch_size, seed=seed)
    return Setup(args, trace, previous, engine, base)


def measure(s: Setup, executor: ModelExecutor) -> dict:
    run = run_policy(s.trace, POLICY, s.engine, batch_size=s.args.batch_size, seed=s.args.seed,
                     previous=s.previous, executor=executor)
    p = summarize(run, s.trace.epochs, s.trace.num_prompts, s.baseline)
    b = summarize(s.baseline, s.trace.epochs, s.trace.num_prompts)
    return {"speedup": p["speedup_vs_baseline"], "extra_truncation": p["truncated_fraction"] - b["truncated_fraction"]}


def group_cost(s: Setup, tau: float | None = None) -> SpecCost:
    """The group drafter's cost model as ``python -m recipe.sim`` builds it from the curve file (``tau``: its tokens
    per step replaced, draft tokens per step kept unless fewer than tau - 1)."""
    a = build_parser().parse_args(["--acceptance-curve", GROUP_FILE, "--drafter", GROUP_DRAFTER, "--gpu", s.args.gpu,
                                   "--spec-draft-s-per-context-token", "0",
                                   "--spec-draft-s-per-new-token", str(GROUP_CPU_S)])
    cost = spec_cost(a, trace_limits(s.trace, s.args, s.engine))
    if tau is None:
        return cost
    drafted = max(cost.curve.drafted[0], tau - 1)
    return dataclasses.replace(cost, curve=AcceptanceCurve((0,), (tau,), (drafted,), f"set: {tau:.3f}"))


class Model:
    """The learned rows' shared inputs."""

    def __init__(self, gpu: str, head: DraftHead, drift: Drift, training: Training, ctx: float, max_num_seqs: int,
                 k_max: int = REF_K):
        self.gpu, self.head, self.drift, self.training, self.ctx = gpu, head, drift, training, ctx
        self.max_num_seqs, self.k_max = max_num_seqs, k_max

    def cost(self, drafter: Drafter) -> SpecCost:
        combo = drafter.group is not None  # a custom proposer: async scheduling off, ragged drafts, group router
        return SpecCost.for_gpu(self.gpu, sync_penalty=SYNC_PENALTY if combo else 0.0, draft_s_per_token=0.0,
                                ragged_drafts=combo, group_affinity=combo)

    def depths(self, drafter: Drafter) -> np.ndarray:
        extra = GROUP_CPU_S * drafter.acceptance(0, self.drift).tau(REF_K) if drafter.group is not None else 0.0
        return best_depth(self.cost(drafter), self.head, drafter.acceptance(0, self.drift),
                          np.arange(1, self.max_num_seqs + 1), self.ctx, self.k_max, extra_s=extra)

    def executor(self, s: Setup, drafter: Drafter, **kw) -> LearnedExecutor:
        engine = dataclasses.replace(s.engine, kv_tokens=self.head.kv_tokens(s.engine.kv_tokens))
        return LearnedExecutor(engine, s.args.seed, self.cost(drafter), drafter, self.depths(drafter),
                               head=self.head, drift=self.drift, training=self.training, **kw)


def learned_run(model: Model, setups: list[Setup], drafter: Drafter) -> dict:
    runs, taus, train = [], [], []
    for s in setups:
        ex = model.executor(s, drafter)
        runs.append(measure(dataclasses.replace(s, engine=ex.engine), ex))
        taus.append(ex.tau_ref)
        train.append(sum(ex.train_s) / max(1, len(ex.train_s)))
    return {"speedups": [r["speedup"] for r in runs], "speedup": float(np.mean([r["speedup"] for r in runs])),
            "extra_truncation": float(np.mean([r["extra_truncation"] for r in runs])),
            "tau_first": taus[0][0], "tau_last": taus[0][-1], "train_s_per_step": float(np.mean(train)),
            "schedule": schedule(model.depths(drafter))}


def group_run(setups: list[Setup], tau: float | None = None) -> dict:
    runs = [measure(s, ModelExecutor(s.engine, s.args.seed, group_cost(s, tau))) for s in setups]
    return {"speedups": [r["speedup"] for r in runs], "speedup": float(np.mean([r["speedup"] for r in runs])),
            "extra_truncation": float(np.mean([r["extra_truncation"] for r in runs]))}


def with_head_tau(d: Drafter, tau: float) -> Drafter:
    return dataclasses.replace(d, head=ChainAcceptance.flat(tau, REF_K, f"set: {tau:.3f}"))


def report(model: Model, setups: list[Setup], head: ChainAcceptance, needed: bool = True) -> dict:
    """Every row's figures and, with ``needed``, the acceptance each needs for ``TARGET`` (bisection on the seeds)."""
    g_tau = group_cost(setups[0]).curve.tau[0]
    g_chain = ChainAcceptance.flat(g_tau, GROUP_K, f"{GROUP_FILE}: {GROUP_DRAFTER}")
    frozen = Drafter("eagle3 frozen", head, online=False)
    online = {w: Drafter(f"eagle3 online ({w})", head, online=True, where=w) for w in WHERE}
    online_runs = {w: learned_run(model, setups, d) for w, d in online.items()}
    where = max(WHERE, key=lambda w: online_runs[w]["speedup"])
    combo = Drafter(f"eagle3 online ({where}) + group", head, online=True, where=where, group=g_chain)
    rows = [{"drafter": "group", "source": group_cost(setups[0]).curve.source, **group_run(setups),
             "tau_first": g_tau, "tau_last": g_tau},
            {"drafter": frozen.name, "source": head.source, **learned_run(model, setups, frozen)},
            *({"drafter": d.name, "source": head.source, **online_runs[w], "chosen": w == where}
              for w, d in online.items()),
            {"drafter": combo.name, "source": f"{head.source} + {g_chain.source} (upper bound: per step the longer "
                                              "draft)", **learned_run(model, setups, combo)}]
    if needed:
        rows[0]["needed"] = needed_tau(lambda t: group_run(setups, t)["speedup"], TARGET, hi=REF_K + 1.0, tol=0.02)
        for row, d in zip(rows[1:], [frozen, *online.values(), combo]):
            row["needed"] = needed_tau(lambda t, d=d: learned_run(model, setups, with_head_tau(d, t))["speedup"],
                                       TARGET, hi=REF_K + 1.0, tol=0.02)
    return {"rows": rows, "where": where}


def markdown(rep: dict, model: Model, seeds) -> list[str]:
    h = model.head
    lines = [f"tail cut (`{POLICY}`) on the reference trace, {model.gpu.upper()}, seeds {list(seeds)}; head "
             f"{h.params / 1e6:.0f}M parameters ({h.weight_bytes / 1e9:.2f} GB bf16 per replica, "
             f"{h.kv_bytes_per_token} B KV per token; trainer state {h.train_state_bytes / 1e9:.1f} GB, hidden states "
             f"{h.hidden_bytes_per_token * model.training.opt_steps * model.training.tokens_per_opt_step / 1e9:.1f} GB"
             f" at most per RL step); drift "
             f"half-life {model.drift.half_life:g} RL steps (assumed); online training chosen: {rep['where']}",
             "",
             f"| drafter | speed-up (per seed) | extra truncation | tokens per step at k={REF_K}, batch 1 (first -> "
             "last step) | depth by batch (vLLM schedule) | training s per step | needs for 3x (tokens per step at "
             f"k={REF_K}, batch 1) | acceptance source |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rep["rows"]:
        need = r.get("needed", "-")
        need = "-" if need == "-" else ("not reachable" if need is None else f"{need:.2f}")
        lines.append(f"| {r['drafter']}{' (chosen)' if r.get('chosen') else ''} | **{r['speedup']:.2f}x** "
                     f"({' / '.join(f'{x:.3f}' for x in r['speedups'])}) | {100 * r['extra_truncation']:+.2f} points "
                     f"| {r['tau_first']:.2f} -> {r['tau_last']:.2f} | {r.get('schedule', '-')} | "
                     f"{r.get('train_s_per_step', 0):.2f} | {need} | {r['source']} |")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m recipe.sim.learned", description=__doc__.splitlines()[0],
                                 epilog="other arguments go to python -m recipe.sim's parser (trace, engine, --gpu)",
                                 allow_abbrev=False)  # --n is recipe.sim's, not a prefix of --no-needed
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--head-tau", type=float, help=f"the head's tokens per step at k={REF_K}, batch 1, at policy "
                                                   f"version 0 (default: {MATH_HEAD.source})")
    ap.add_argument("--drift-half-life", type=float, default=Drift.half_life, help="RL steps (assumed)")
    ap.add_argument("--schedule-ctx", type=float, default=4096.0, help="context tokens the depth schedule is set at")
    ap.add_argument("--k-max", type=int, default=REF_K,
                    help=f"deepest draft the schedule may choose (default {REF_K}, the published figures' depth; "
                         "deeper extrapolates the sources' last per-position rate ratio)")
    ap.add_argument("--no-needed", action="store_true", help="skip the bisection for what 3x needs")
    ap.add_argument("--schedule", action="store_true",
                    help="print only the head's depth schedule as vLLM's speculative_config keys (JSON; null "
                         "where one depth serves every batch size) and exit")
    args, sim_argv = ap.parse_known_args(argv)
    try:
        head = MATH_HEAD if args.head_tau is None else ChainAcceptance.flat(
            args.head_tau, REF_K, f"set with --head-tau {args.head_tau}")
        drift = Drift(half_life=args.drift_half_life)
    except ValueError as exc:
        raise SystemExit(f"--head-tau / --drift-half-life: {exc}") from None
    if not 1 <= args.k_max <= K_MAX:
        raise SystemExit(f"--k-max {args.k_max}: must lie in [1, {K_MAX}]")
    if args.schedule:
        sa = build_parser().parse_args(sim_argv)
        model = Model(sa.gpu, DraftHead(), drift, Training(), sa.prompt_len + args.schedule_ctx, sa.max_num_seqs,
                      args.k_max)
        sched = schedule(model.depths(Drafter("eagle3", head, online=True)))
        print(json.dumps({"num_speculative_tokens": max(k for _, _, k in sched),  # one depth: no schedule (FULL graphs)
                          "num_speculative_tokens_per_batch_size": sched if len(sched) > 1 else None}))
        return 0
    setups = [setup(sim_argv, s) for s in args.seeds]
    sa = setups[0].args
    model = Model(sa.gpu, DraftHead(), drift, Training(), sa.prompt_len + args.schedule_ctx, sa.max_num_seqs,
                  args.k_max)
    print("\n".join(markdown(report(model, setups, head, needed=not args.no_needed), model, args.seeds)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
