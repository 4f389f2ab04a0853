"""``python -m recipe.tools check [BACKEND]``: the sandbox self-check and how its limits are enforced here (in total
per run by a cgroup, one process under Landlock, per process only, or what a SandboxFusion server was probed to
hold); exit 1 and the fix when it fails;
``python -m recipe.tools run FILE.py [BACKEND]``: run a program in the sandbox and print the tool's reply."""

from __future__ import annotations

import asyncio
import json
import sys

from recipe.tools.result import format_for_model
from recipe.tools.sandbox import limits_line, make_backend, sandbox_self_check


def main(argv: list[str]) -> int:
    if len(argv) >= 1 and argv[0] == "check":
        backend = make_backend(argv[1] if len(argv) > 1 else None)
        err = sandbox_self_check(backend)
        print(f"sandbox ({backend.name}): " + ("ok" if err is None else err))
        print(f"limits: {limits_line(backend)}")
        return 0 if err is None else 1
    if len(argv) >= 2 and argv[0] == "run":
        backend = make_backend(argv[2] if len(argv) > 2 else None)
        with open(argv[1], encoding="utf-8") as f:
            result = asyncio.run(backend.run(f.read()))
        print(format_for_model(result))
        print(json.dumps(result.metrics()), file=sys.stderr)
        return 0 if result.ok else 1
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
