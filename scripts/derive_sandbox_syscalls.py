"""Derive the sandbox's syscall allowlist: run each program of tests/support/harness/syscall_corpus.py under strace with a
given interpreter and print the system calls it makes, marking those recipe/tools/syscalls.py does not allow.

    python scripts/derive_sandbox_syscalls.py [PYTHON ...]      (default: /usr/bin/python3 and this interpreter)

Needs strace (apt-get install strace). Runs outside the sandbox, in a fresh temporary directory per program (the
corpus uses relative paths), so a call missing from the allowlist shows here instead of as a failing program.
Exit status 1 when some call a corpus program makes is not allowed (the allowlist needs a line, with its reason).
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "support"))  # the corpus: the test harness's

from harness.syscall_corpus import CORPUS  # noqa: E402
from recipe.tools.bwrap import SANDBOX_ENV  # noqa: E402
from recipe.tools.syscalls import FALLBACK, Policy, allowed_names  # noqa: E402

CALL = re.compile(r"^\d+\s+(?:<\.\.\. )?([a-z0-9_]+)[( ]")


def traced(python: str, code: str) -> tuple[bool, set[str]]:
    """(whether the program printed CORPUS OK, the system calls it and its children made)."""
    with tempfile.TemporaryDirectory() as d:
        Path(d, "main.py").write_text(code)
        env = {**SANDBOX_ENV, "HOME": d, "TMPDIR": d}
        r = subprocess.run(["strace", "-f", "-qq", "-o", os.path.join(d, "trace"), python, "main.py"], cwd=d,
                           input="a line\n", capture_output=True, text=True, env=env, timeout=300)
        names = {m.group(1) for line in Path(d, "trace").read_text().splitlines() if (m := CALL.match(line))}
    return "CORPUS OK" in r.stdout, names


def main(pythons: list[str]) -> int:
    if shutil.which("strace") is None:
        print("strace is not installed: apt-get install strace", file=sys.stderr)
        return 2
    allowed = allowed_names(Policy())
    missing_any = False
    for python in pythons:
        for program in CORPUS:
            have = subprocess.run([python, "-c", "import " + ", ".join(program.needs)], capture_output=True)
            if program.needs and have.returncode != 0:
                print(f"{python} {program.name}: skipped (no {', '.join(program.needs)})")
                continue
            ok, names = traced(python, program.code)
            missing = sorted(names - allowed - set(FALLBACK))
            missing_any |= bool(missing) or not ok
            print(f"{python} {program.name}: {'ok' if ok else 'FAILED'}, {len(names)} calls"
                  + (f"; NOT ALLOWED: {', '.join(missing)}" if missing else ""))
    print(f"command: python scripts/derive_sandbox_syscalls.py {' '.join(pythons)}")
    return 1 if missing_any else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or ["/usr/bin/python3", sys.executable]))
