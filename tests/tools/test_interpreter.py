"""Which of the interpreter's directories the sandboxes show the program: its own tree as it reports it, never a home
directory (a non-root trainer's sandbox runs as the same uid: its tokens would be readable)."""

import asyncio
import os
import stat

from recipe.tools import interpreter
from recipe.tools.bwrap import BubblewrapBackend
from recipe.tools.interpreter import interpreter_tree
from recipe.tools.result import Status


def _binds(backend):
    return [part[1] for part in backend._ro_paths() if part[0] == "--ro-bind"]


def test_a_python_in_the_home_binds_only_its_real_tree(tmp_path, monkeypatch):
    """``~/.local/bin/python3`` and ``~/bin/python3`` linking to Debian's python: the old ``parent.parent`` bound
    ``~/.local`` and the whole home; the interpreter says its prefix is /usr, which is bound anyway."""
    home = tmp_path / "home"
    for where in (home / ".local" / "bin", home / "bin"):
        where.mkdir(parents=True)
        (where / "python3").symlink_to("/usr/bin/python3")
    monkeypatch.setenv("HOME", str(home))
    interpreter_tree.cache_clear()
    for exe in (home / ".local" / "bin" / "python3", home / "bin" / "python3"):
        binds = _binds(BubblewrapBackend(python=str(exe)))
        assert not [b for b in binds if b.startswith(str(home))], binds
        assert interpreter_tree(str(exe)) == ()


def test_a_prefix_that_holds_a_home_is_refused_by_name(tmp_path, monkeypatch):
    """An interpreter whose prefix is the home (``--prefix=$HOME``): refused, never bound."""
    home = tmp_path / "home"
    (home / "bin").mkdir(parents=True)
    fake = home / "bin" / "python3"  # a test double: answers the prefix question as such a build would
    fake.write_text(f"#!/bin/sh\necho '[\"{home}\", \"{home}\", \"{home}\", \"{home}\"]'\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("HOME", str(home))
    interpreter_tree.cache_clear()
    backend = BubblewrapBackend(python=str(fake))
    problem = backend.interpreter_problem()
    assert problem and f"prefix at {home}" in problem and "home directory" in problem and "SANDBOX_PYTHON" in problem
    assert not [b for b in _binds(backend) if b.startswith(str(home))]
    r = asyncio.run(backend.run("print(1)"))
    assert r.status == Status.SANDBOX_ERROR and "home directory" in r.detail
    interpreter_tree.cache_clear()


def test_a_venv_binds_the_venv_and_its_base():
    import sys

    tree = interpreter_tree(sys.executable)
    assert isinstance(tree, tuple)
    assert sys.prefix.startswith("/usr") or os.path.realpath(sys.prefix) in tree
    assert all(not t.startswith("/usr") for t in tree)
    assert "/" not in tree and not [t for t in tree if t in interpreter.homes()]
