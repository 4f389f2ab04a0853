"""``python -m recipe.sim.multiturn``: one multi-turn shape and seed, every policy, a markdown table."""
from __future__ import annotations

import dataclasses

from ..engine import EngineParams
from .engine import REPREFILL
from .run import MT_DEFAULT_POLICIES, MT_POLICIES, simulate_mt
from .trace import MT_SHAPES, MTShape, generate_mt


def main(argv: list[str] | None = None) -> int:
    """``python -m recipe.sim.multiturn``: one multi-turn shape and seed, every policy, a markdown table."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m recipe.sim.multiturn", description=main.__doc__)
    ap.add_argument("--shape", default="mt-reference", choices=sorted(MT_SHAPES))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--policies", default=",".join(MT_DEFAULT_POLICIES), help=f"of: {', '.join(MT_POLICIES)}")
    ap.add_argument("--reprefill", choices=REPREFILL, default="full")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--trace-param", action="append", default=[], metavar="KEY=VALUE", help="an MTShape override")
    args = ap.parse_args(argv)
    names = [s for s in args.policies.split(",") if s]
    unknown = [nm for nm in names if nm not in MT_POLICIES]
    if unknown:
        raise SystemExit(f"unknown multi-turn policies {unknown}; known: {', '.join(MT_POLICIES)}")
    fields = {f.name: f.type for f in dataclasses.fields(MTShape)}
    over = {}
    for item in args.trace_param:
        key, _, value = item.partition("=")
        if key not in fields:
            raise SystemExit(f"--trace-param {item!r}: {key!r} is not an MTShape field")
        over[key] = value if key == "latency" else (int(value) if fields[key] == "int" else float(value))
    trace = generate_mt(args.shape, seed=args.seed, **over)
    print(f"`{args.shape}` seed {args.seed}: {trace.summary()}")
    print("| policy | speedup vs baseline | truncated | stale tokens | wasted tokens | re-prefill per decoded token |")
    print("|---|---|---|---|---|---|")
    for e in simulate_mt(trace, names, EngineParams(kv_tokens=None), batch_size=args.batch_size, seed=args.seed,
                         reprefill=args.reprefill):
        print(f"| {e['name']} | {e['speedup_vs_baseline']:.3f} | {100 * e['truncated_fraction']:.2f}% | "
              f"{100 * e['stale_token_fraction']:.1f}% | {100 * e['wasted_tokens_fraction']:.1f}% | "
              f"{e['reprefill_per_decoded']:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
