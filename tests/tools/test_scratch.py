"""The landlock sandbox's scratch directory on the host's disk (recipe/tools/scratch.py), as a non-root program leaves
it: its measure cannot be hidden from (a directory without read or search right, a deep tree end it), and its
removal leaves nothing, whatever the modes and the depth. Runs as uid 4242 (root would read through any mode)."""
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="dropping to uid 4242 (the owner of the tree) needs root")

AS_UID = r"""
import json, os, sys
from recipe.tools.scratch import MAX_DEPTH, Unmeasurable, measure, remove
os.setgroups([]); os.setresgid(4242, 4242, 4242); os.setresuid(4242, 4242, 4242)
d = sys.argv[1]
os.chdir(d)
def deep(n, top='deep'):
    os.mkdir(top); fd = os.open(top, os.O_RDONLY)
    for _ in range(n):
        os.mkdir('d', dir_fd=fd); nxt = os.open('d', os.O_RDONLY, dir_fd=fd); os.close(fd); fd = nxt
    os.close(os.open('f', os.O_CREAT | os.O_WRONLY, 0, dir_fd=fd)); os.close(fd)
def try_measure():
    try:
        return list(measure(d))
    except Unmeasurable as e:
        return str(e)
out = {}
exec(sys.argv[2])
print('OUT', json.dumps(out))
"""


@pytest.fixture
def tree():
    d = tempfile.mkdtemp(prefix="scratch-test-")  # under /tmp: pytest's own are root's only
    os.chown(d, 4242, 4242)
    yield d
    shutil.rmtree(d, ignore_errors=True)
    assert not os.path.exists(d)


def as_uid(tree: str, code: str) -> dict:
    r = subprocess.run([sys.executable, "-c", AS_UID, tree, code], cwd=REPO, capture_output=True, text=True,
                       timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
    lines = [line for line in r.stdout.splitlines() if line.startswith("OUT ")]
    assert r.returncode == 0 and lines, r.stdout + r.stderr
    return json.loads(lines[-1][4:])


def test_measure_counts_what_is_there(tree):
    out = as_uid(tree, "os.makedirs('a/b'); open('a/b/f', 'wb').write(b'x' * (1 << 20))\n"
                       "os.fsync(os.open('a/b/f', 0))\nout['m'] = try_measure()")
    used, entries = out["m"]
    assert used >= 1 << 20 and entries == 3, out


@pytest.mark.parametrize("mode", [0o300, 0o600, 0o000])
def test_a_directory_without_its_rights_cannot_hide_data(tree, mode):
    """A mode-0300 directory hid 5x the cap from the old walk (it skipped what it could not list)."""
    out = as_uid(tree, f"os.mkdir('h'); open('h/data', 'wb').write(b'x' * (4 << 20)); os.chmod('h', {mode})\n"
                       "out['m'] = try_measure()")
    assert isinstance(out["m"], str) and "read or search right" in out["m"], out


def test_a_tree_deeper_than_the_walk_is_refused(tree):
    out = as_uid(tree, "deep(MAX_DEPTH + 5)\nout['m'] = try_measure()")
    assert isinstance(out["m"], str) and "deeper than" in out["m"], out


def test_removal_leaves_nothing_whatever_the_program_did(tree):
    """3,000 levels (an old recursive rmtree raised RecursionError), directories and files with no rights, a
    symlink to a file outside (removed, not followed)."""
    outside = Path(tempfile.mkdtemp(prefix="scratch-outside-")) / "keep"
    outside.write_text("keep")
    try:
        out = as_uid(tree, (
            "deep(3000)\n"
            "os.mkdir('h'); open('h/data', 'wb').write(b'x' * (1 << 20)); os.chmod('h/data', 0); os.chmod('h', 0o300)\n"
            "os.chmod('deep', 0)\n"
            f"os.symlink({str(outside)!r}, 'link')\n"
            "out['left'] = remove(d)\n"
            "out['exists'] = os.path.exists(d)\n"))
        assert out == {"left": None, "exists": False}
        assert outside.read_text() == "keep"
    finally:
        shutil.rmtree(outside.parent)
