"""The landlock sandbox not as root (uid 4242 in the Docker-like setting of docker_nonroot.py), where its scratch lies
on the host's disk and only the supervisor's watch bounds it: the programs of bench/sandbox_hostile.py that hid data
from the old 0.1 s walk (a mode-0300 directory: 5x the cap, ``ok``, 321 MiB left), took 3 GiB with ``fallocate``,
or raised ``RecursionError`` out of ``run`` (a 3,000-deep tree) are held, by name, and leave nothing; the
``setpriority(PRIO_USER, 0, 19)`` program leaves a process of the same uid outside the sandbox at nice 0."""
import os
from pathlib import Path

import pytest

from harness.script_module import load_script

REPO = Path(__file__).resolve().parents[2]
PROGRAMS = {
    "a hidden mode-0300 directory, 5x the scratch cap": "disk_limit",
    "fallocate KEEP_SIZE 3 GiB": "ok",
    "posix_fallocate 3 GiB": "disk_limit",
    "a 3,000-deep tree, rights removed": "disk_limit",
    "setpriority(PRIO_USER, 0, 19)": "ok",
    "exec a file written in the scratch": "ok",
}


@pytest.fixture(scope="module")
def rows():
    if os.geteuid() != 0:
        pytest.skip("making the non-root Docker setting needs root (a mount namespace, a uid drop)")
    if not os.path.exists("/usr/bin/python3"):
        pytest.skip("/usr/bin/python3 is not installed")
    bench = load_script(REPO / "bench" / "sandbox_hostile.py")
    return {row["program"]: row for row in bench.nonroot_rows(list(PROGRAMS))}


@pytest.mark.parametrize("name", PROGRAMS)
def test_held_by_its_limit_and_nothing_left(rows, name):
    row = rows[name]
    assert row["backend"] == "landlock (uid 4242)"
    assert row["held"] and row["status"] == PROGRAMS[name], row  # held: no ESCAPED, no victim reniced, nothing left


def test_a_hidden_directory_is_named(rows):
    row = rows["a hidden mode-0300 directory, 5x the scratch cap"]
    assert "took the read or search right off a directory" in row["why"], row
