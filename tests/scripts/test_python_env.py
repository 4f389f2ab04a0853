"""A new ``.venv-gpu`` fails closed (``scripts/lib/python_env.sh``): a failed step fails the caller, names the
command and leaves no ``.recipe-gpu-ready``, so the next launch does not reuse a broken venv.

A fake ``nvidia-smi`` lists 2 GPUs; the venv's ``python`` is the test interpreter behind a wrapper, so pip and
``recipe.stack_versions`` run for real, offline (``PIP_NO_INDEX=1``) and fast.
"""
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# What the launch scripts do: the call inside $(...) || die, under errexit (off inside the substitution).
CALLER = ('set -euo pipefail; source {lib}; '
          'PY="$(recipe_python {root})" || {{ echo "caller: status $?" >&2; exit 3; }}; echo "chosen: $PY"')


@pytest.fixture
def repo(tmp_path, make_nvidia_smi):
    """A repo root copy (the libs, requirements/, recipe.stack_versions) and a PATH with 2 fake GPUs and a
    ``python3`` whose ``-m venv`` makes ``bin/python`` a wrapper around the test interpreter."""
    root = tmp_path / "repo"
    (root / "scripts" / "lib").mkdir(parents=True)
    for lib in ("python_env.sh", "gpu.sh"):
        shutil.copy(REPO / "scripts" / "lib" / lib, root / "scripts" / "lib" / lib)
    (root / "recipe").mkdir()
    for module in ("__init__.py", "stack_versions.py"):
        shutil.copy(REPO / "recipe" / module, root / "recipe" / module)
    (root / "requirements").mkdir()
    bin_dir = tmp_path / "bin"
    make_nvidia_smi(bin_dir, 2)
    (bin_dir / "python3").write_text(
        "#!/usr/bin/env bash\n"
        'if [[ "$1" == "-c" ]]; then exit 1; fi\n'  # `import verl` fails: no python3 with verl here
        'if [[ "$1 $2" == "-m venv" ]]; then\n'
        '    if [[ -n "${FAKE_VENV_FAILS:-}" ]]; then echo "Error: ensurepip failed" >&2; exit 1; fi\n'
        '    mkdir -p "$3/bin" && cp "$VENV_PYTHON_WRAPPER" "$3/bin/python"; exit\n'
        "fi\n"
        "exit 2\n")
    (bin_dir / "python3").chmod(0o755)
    return root, bin_dir


def wrapper(path: Path, body: str) -> Path:
    path.write_text("#!/usr/bin/env bash\n" + body)
    path.chmod(0o755)
    return path


def choose(repo, venv_python: Path, **env) -> subprocess.CompletedProcess:
    root, bin_dir = repo
    script = CALLER.format(lib=shlex.quote(str(root / "scripts/lib/python_env.sh")), root=shlex.quote(str(root)))
    full = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(root.parent), "VENV_PYTHON_WRAPPER": str(venv_python),
            **env}
    return subprocess.run(["bash", "-c", script], env=full, capture_output=True, text=True, timeout=120)


def test_unresolvable_requirement_fails_closed(repo, tmp_path):
    root, _ = repo
    (root / "requirements" / "gpu.txt").write_text("recipe-no-such-package==0.0.0\n")
    (root / "requirements" / "gpu-no-deps.txt").write_text("")
    # The real pip of the test interpreter; PIP_DRY_RUN in case anything ever resolved: nothing is installed.
    python = wrapper(tmp_path / "venv-python", f'exec {shlex.quote(sys.executable)} "$@"\n')
    r = choose(repo, python, PIP_NO_INDEX="1", PIP_DRY_RUN="1", PIP_NO_INPUT="1", PIP_CONFIG_FILE="/dev/null")
    assert r.returncode == 3 and "caller: status 1" in r.stderr, r.stderr
    assert "chosen:" not in r.stdout
    assert "recipe-no-such-package==0.0.0" in r.stderr  # pip's own error
    failed = [line for line in r.stderr.splitlines() if line.startswith("python_env: FAILED")]
    assert failed == [f"python_env: FAILED (exit 1): {root}/.venv-gpu/bin/python -m pip install "
                      f"--disable-pip-version-check -q -r {root}/requirements/gpu.txt "]
    assert "gpu-no-deps.txt" not in r.stderr  # nothing after the failed step ran
    assert not (root / ".venv-gpu" / ".recipe-gpu-ready").exists()
    assert "is not ready" in r.stderr and "docs/install-gpu.md" in r.stderr


def test_failed_venv_creation_fails_closed(repo, tmp_path):
    root, _ = repo
    (root / "requirements" / "gpu.txt").write_text("verl==0.9.1\n")
    python = wrapper(tmp_path / "venv-python", "exit 0\n")
    r = choose(repo, python, FAKE_VENV_FAILS="1")
    assert r.returncode == 3, r.stderr
    assert f"python_env: FAILED (exit 1): python3 -m venv {root}/.venv-gpu " in r.stderr
    assert "ensurepip failed" in r.stderr
    assert not (root / ".venv-gpu").exists()


def test_wrong_verl_is_refused_by_name_and_not_marked_ready(repo, tmp_path):
    """pip "succeeds" (a stub that logs) but leaves verl 0.9.0: the stack check refuses it by name."""
    root, _ = repo
    (root / "requirements" / "gpu.txt").write_text("verl==0.9.0\n")
    (root / "requirements" / "gpu-no-deps.txt").write_text("")
    site = tmp_path / "site"
    (site / "verl-0.9.0.dist-info").mkdir(parents=True)
    (site / "verl-0.9.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: verl\nVersion: 0.9.0\n")
    log = tmp_path / "pip.log"
    # -S: only the fake site dir and the repo copy are on sys.path (no real verl, no torch import).
    python = wrapper(tmp_path / "venv-python",
                     f'if [[ "$1 $2" == "-m pip" ]]; then echo "$*" >> {shlex.quote(str(log))}; exit 0; fi\n'
                     f'PYTHONPATH={shlex.quote(f"{site}:{root}")} exec {shlex.quote(sys.executable)} -S "$@"\n')
    r = choose(repo, python)
    assert r.returncode == 3, r.stderr
    assert len(log.read_text().splitlines()) == 3  # gpu.txt, gpu-no-deps.txt (--no-deps), the repo (editable)
    assert "stack: verl 0.9.0" in r.stderr
    assert f"stack: ERROR: verl 0.9.0 is installed in {sys.executable}; the recipe is written against verl==0.9.1" \
        in r.stderr
    assert f"python_env: FAILED (exit 1): {root}/.venv-gpu/bin/python -m recipe.stack_versions --target gpu " \
        in r.stderr
    assert not (root / ".venv-gpu" / ".recipe-gpu-ready").exists()
    # The next launch tries again instead of reusing the refused venv.
    again = choose(repo, python)
    assert again.returncode == 3 and "creating" in again.stderr
