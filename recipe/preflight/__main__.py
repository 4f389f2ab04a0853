"""``python -m recipe.preflight``: the preflight of ``scripts/train_grpo.sh``, the variables' table, their defaults."""
from __future__ import annotations

import argparse
import os
import shlex
import sys

from . import KNOB, __doc__ as PACKAGE_DOC, dump, effective_env, env_table_markdown, format_report, parse_env, \
    run_preflight, write_plan


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m recipe.preflight", description=PACKAGE_DOC.split("\n\n")[0])
    ap.add_argument("--plan-out", help="write the bash launch plan here (scripts/train_grpo.sh)")
    ap.add_argument("--env-table", action="store_true", help="print the table of variables (docs/training.md) and exit")
    ap.add_argument("--print-env", nargs="+", metavar="VAR",
                    help="print VAR=value as the run would use it (PRESET and POLICY_PRESET applied) and exit")
    ap.add_argument("overrides", nargs="*", help="extra Hydra overrides, applied last")
    args = ap.parse_args(argv)
    if args.env_table:
        print(env_table_markdown())
        return 0
    if args.print_env:
        unknown = [n for n in args.print_env if n not in KNOB or KNOB[n].kind == "script"]
        # every variable, with PRESET's and POLICY_PRESET's values as the run gets them: a computed default
        # (EXPERIMENT_NAME, ...) reads others; their errors say why it has no value
        values, errors = parse_env(effective_env(os.environ)[0])
        missing = [n for n in args.print_env if n not in unknown and n not in values]
        if unknown or missing:
            errors = [f"{n} is not a preflight variable" for n in unknown] + [e for n in missing for e in (
                [e for e in errors if e.startswith(f"{n}=") or e.startswith(f"{n} ")]
                or [f"{n} has no value: fix the variables it is computed from ({'; '.join(errors)})"])]
            print("\n".join(f"preflight: ERROR: {e}" for e in errors), file=sys.stderr)
            return 2
        print("\n".join(f"{n}={shlex.quote(str(values[n]))}" for n in args.print_env))
        return 0
    report = run_preflight(args.overrides)
    print(format_report(report), flush=True)
    dump_path = os.environ.get("PREFLIGHT_DUMP")
    if dump_path:
        dump(report, dump_path)
    if not report.ok:
        return 2
    if args.plan_out:
        write_plan(report, args.plan_out)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BrokenPipeError:  # the reader left (`--env-table | head`): no traceback, but still a failed write
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # Python flushes stdout again at exit
        sys.exit(1)
