"""Choose a sandbox backend and check it before a run starts (pure dispatch; no verl).

``SANDBOX_BACKEND`` = ``bubblewrap`` (default; local, Debian's ``bubblewrap``), ``landlock`` (local, no namespaces
or cgroups: non-root Docker) or ``sandbox_fusion`` (the user's SandboxFusion server at ``SANDBOX_FUSION_URL``).
``sandbox_self_check`` runs ``print(1+1)`` through the backend and returns ``None`` or one line that names the fix;
the preflight calls it before anything starts. For bubblewrap it first checks the bwrap version and whether each
run can get a cgroup of its own (``limits_line`` says which); for SandboxFusion it probes what the server enforces
(``recipe/tools/fusion_probe.py``) and refuses an unisolated server unless its gaps are accepted by name.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import threading

from recipe.tools.bwrap import ALLOW_PER_PROCESS, BubblewrapBackend
from recipe.tools.landlock_sandbox import LandlockBackend
from recipe.tools.fusion import CLIENT_PIN, SERVER_HINT, SandboxFusionBackend
from recipe.tools.fusion_probe import ACCEPT_ENV, parse_accept, probe, refusal
from recipe.tools.limits import SandboxLimits
from recipe.tools.result import Status
from recipe.tools.seccomp import SeccompUnavailable, filter_bpf

BACKENDS = ("bubblewrap", "landlock", "sandbox_fusion")
_ALIASES = {"bwrap": "bubblewrap", "local": "bubblewrap", "fusion": "sandbox_fusion", "sandboxfusion": "sandbox_fusion"}
DOCKER_FIX = (
    "use SANDBOX_BACKEND=landlock (no namespaces, cgroups or privilege needed; one process per run), or "
    "SANDBOX_BACKEND=sandbox_fusion with SANDBOX_FUSION_URL (an isolated server: docs/tools.md)"
)


def _flag(value, name: str) -> bool:
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("", "0", "false", "no", "off", "none"):
        return False
    raise ValueError(f"{name}={value!r}: use 1 (accept per-process sandbox limits) or 0")


def make_backend(name: str | None = None, config: dict | None = None, environ: dict | None = None):
    """A backend from the tool config (keys: backend, limits, sandbox_fusion_url, python, extra_ro_binds,
    allow_per_process_limits, max_attempts, accept_unenforced); the config wins over the environment."""
    config = dict(config or {})
    environ = os.environ if environ is None else environ
    name = (name or config.get("backend") or environ.get("SANDBOX_BACKEND") or "bubblewrap").strip().lower()
    name = _ALIASES.get(name, name)
    limits = SandboxLimits.from_config(config.get("limits"), environ)
    if name == "bubblewrap":
        kw = {}
        if config.get("python") or environ.get("SANDBOX_PYTHON"):
            kw["python"] = config.get("python") or environ["SANDBOX_PYTHON"]
        if config.get("extra_ro_binds"):
            kw["extra_ro_binds"] = tuple(config["extra_ro_binds"])
        if "allow_per_process_limits" in config:
            kw["allow_per_process_limits"] = _flag(config["allow_per_process_limits"], "allow_per_process_limits")
        else:
            kw["allow_per_process_limits"] = _flag(environ.get(ALLOW_PER_PROCESS, ""), ALLOW_PER_PROCESS)
        return BubblewrapBackend(limits=limits, **kw)
    if name == "sandbox_fusion":
        url = config.get("sandbox_fusion_url") or environ.get("SANDBOX_FUSION_URL", "")
        if "accept_unenforced" in config:
            accept = parse_accept(config["accept_unenforced"], "accept_unenforced in the tool config")
        else:
            accept = parse_accept(environ.get(ACCEPT_ENV, ""), ACCEPT_ENV)
        return SandboxFusionBackend(url=url, limits=limits, max_attempts=int(config.get("max_attempts", 2)),
                                    accept=accept)
    if name == "landlock":
        kw = {}
        if config.get("python") or environ.get("SANDBOX_PYTHON"):
            kw["python"] = config.get("python") or environ["SANDBOX_PYTHON"]
        if config.get("extra_ro_binds"):
            kw["extra_ro_paths"] = tuple(config["extra_ro_binds"])
        return LandlockBackend(limits=limits, **kw)
    raise ValueError(f"unknown sandbox backend {name!r}: SANDBOX_BACKEND must be one of {', '.join(BACKENDS)}")


async def async_self_check(backend) -> str | None:
    """Run ``print(1+1)``; ``None`` when it prints 2, else one line naming the fix."""
    if isinstance(backend, str):
        backend = make_backend(backend)
    if isinstance(backend, BubblewrapBackend) and backend.bwrap_path() is None:
        return (
            f"bubblewrap is not installed ({backend.bwrap} not found): apt-get install bubblewrap "
            f"(or bash scripts/lib/install_sandbox.sh), or {DOCKER_FIX}"
        )
    if isinstance(backend, BubblewrapBackend) and backend.sandbox_uid is not None and os.geteuid() == 0 \
            and shutil.which("setpriv") is None:
        return "setpriv (util-linux) is not installed: apt-get install util-linux (it drops root to the sandbox's uid)"
    if isinstance(backend, BubblewrapBackend) and not os.access(backend.python, os.X_OK):
        return f"the sandbox's python {backend.python} is not executable here: set SANDBOX_PYTHON to a python3"
    if isinstance(backend, BubblewrapBackend):
        try:
            filter_bpf()
        except SeccompUnavailable as e:
            return str(e)
        problem = await asyncio.to_thread(backend.version_problem) or backend.limits_mode()[1] \
            or await asyncio.to_thread(backend.interpreter_problem)
        if problem is not None:
            return problem
    if isinstance(backend, LandlockBackend) and (problem := await asyncio.to_thread(backend.problem)) is not None:
        return problem
    if isinstance(backend, SandboxFusionBackend):
        if not backend.url:
            return f"SANDBOX_BACKEND=sandbox_fusion needs SANDBOX_FUSION_URL: {SERVER_HINT}"
        try:
            import sandbox_fusion  # noqa: F401
        except ImportError:
            return f"the SandboxFusion client is not installed: pip install {CLIENT_PIN}"
    r = await backend.run("print(1+1)")
    if r.ok and r.stdout.strip() == "2":
        if isinstance(backend, SandboxFusionBackend):
            backend.probed = await probe(backend)
            return refusal(backend.url, backend.probed, backend.accept)
        return None
    what = f"{backend.name} sandbox self-check (print(1+1)) failed: {r.status.value}: {r.detail}"
    if r.stderr.strip() and r.stderr.strip().splitlines()[0] not in r.detail:
        what += f" [stderr: {r.stderr.strip().splitlines()[0][:200]}]"
    if isinstance(backend, BubblewrapBackend):
        text = (r.detail + " " + r.stderr).lower()
        if "can't find source path" in text or "execvp" in text:
            return (
                f"{what}; the sandbox cannot reach {backend.python} (its directory must be readable by uid "
                f"{backend.sandbox_uid}): set SANDBOX_PYTHON to a python3 under /usr, e.g. /usr/bin/python3"
            )
        if r.status == Status.SANDBOX_ERROR and any(
            s in text for s in ("namespace", "operation not permitted", "uid map", "permission denied", "setting up")
        ):
            return f"{what}; bwrap cannot create namespaces here (inside docker?): {DOCKER_FIX}"
        return f"{what}; check bubblewrap (bwrap --version) or {DOCKER_FIX}"
    return what


def limits_line(backend) -> str:
    """How the backend's limits are enforced here, for ``python -m recipe.tools check``."""
    return backend.describe_limits()


def sandbox_required(environ=None) -> bool:
    """Where the environment promises a working sandbox (CI, or ``RECIPE_REQUIRE_SANDBOX=1``): its absence is a
    failure there, not a reason to skip the sandbox's tests."""
    environ = os.environ if environ is None else environ
    return environ.get("CI", "").lower() == "true" or environ.get("RECIPE_REQUIRE_SANDBOX", "") == "1"


def _event_loop_runner():
    """uvloop's ``run`` where it is installed (Ray's async actors, verl's agent-loop workers, run on it, and it refuses
    some subprocess arguments asyncio accepts), else asyncio's."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run
    return uvloop.run


def sandbox_self_check(backend="bubblewrap") -> str | None:
    """Synchronous ``async_self_check`` for the preflight, on the event loop the tools will run on; safe to call from
    inside a running event loop too."""
    run = _event_loop_runner()
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return run(async_self_check(backend))
    out: list = []
    t = threading.Thread(target=lambda: out.append(run(async_self_check(backend))))
    t.start()
    t.join()
    return out[0] if out else "sandbox self-check crashed"
