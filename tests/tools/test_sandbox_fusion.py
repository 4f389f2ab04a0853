"""The SandboxFusion backend against a fake server: the request and the limits it carries, the mapping of every
answer to a result, how much of an answer is read, and when a request is sent again.

``FakeSandboxFusion`` is a test double: a tiny HTTP server on 127.0.0.1 that records each ``POST /run_code`` (an
execution, for the server) and answers what a test scripts, in the shape of SandboxFusion's ``RunCodeResponse``
(sandbox-fusion 0.3.7's models). It does not run code. The backend under test uses the real PyPI ``sandbox-fusion``
models (skipped, with the install line, where they are not installed).
"""

import asyncio
import json
import socket
import threading
import time
import tracemalloc
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from recipe.tools.fusion import CLIENT_PIN, SandboxFusionBackend, answer_budget
from recipe.tools.fusion_probe import ACCEPT_ENV, GAPS, parse_accept
from recipe.tools.limits import MiB, SandboxLimits
from recipe.tools.result import Status
from recipe.tools.sandbox import make_backend, sandbox_self_check

pytest.importorskip("sandbox_fusion", reason=f"the SandboxFusion client is not installed: pip install {CLIENT_PIN}")

LIMITS = SandboxLimits(wall_timeout_s=2, max_output_bytes=1000)


def finished(stdout="", stderr="", code=0, status="Finished"):
    return {
        "status": "Success" if code == 0 and status == "Finished" else "Failed",
        "message": "",
        "compile_result": None,
        "run_result": {"status": status, "execution_time": 0.01, "return_code": code, "stdout": stdout,
                       "stderr": stderr},
        "executor_pod_name": "fake",
        "files": {},
    }


class FakeSandboxFusion:
    """Test double of the SandboxFusion server (see the module docstring). ``requests`` are the executions it was
    asked for; ``answer`` is a (code, payload) pair, or ``"disconnect"`` (close without answering), or
    ``("huge", n)``: a 200 answer of ``n`` bytes, written in 64 KiB pieces (never held whole), recording in
    ``written`` how many went out before the client hung up (``done`` is set when the handler ends)."""

    def __init__(self, listen=True):
        self.requests = []
        self.answer = (200, finished("2\n"))
        self.executor = None  # a function of the request that runs its code and answers (see the probe tests)
        self.delay = 0.0
        self.written = 0
        self.write_failed = False
        self.done = threading.Event()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                fake.requests.append({"path": self.path, "json": json.loads(body)})
                time.sleep(fake.delay)
                if fake.executor is not None:
                    fake.answer = (200, fake.executor(json.loads(body)))
                try:
                    if fake.answer == "disconnect":
                        self.close_connection = True
                        return
                    if fake.answer[0] == "huge":
                        self.send_huge(fake.answer[1])
                        return
                    code, payload = fake.answer
                    data = payload.encode() if isinstance(payload, str) else json.dumps(payload).encode()
                    self.send_response(code)
                    self.send_header("Content-Type", "application/json" if code == 200 else "text/plain")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    fake.write_failed = True
                finally:
                    fake.done.set()

            def send_huge(self, n):
                # A well-formed answer of n bytes, nearly all of them stdout: only its size is hostile.
                head = b'{"status": "Success", "message": "", "run_result": {"status": "Finished", "stdout": "'
                tail = b'", "stderr": "", "return_code": 0, "execution_time": 0.1}, "files": {}}'
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(n))
                self.end_headers()
                self.wfile.write(head)
                fake.written = len(head)
                piece = b"x" * 65536
                while fake.written < n - len(tail):
                    k = min(len(piece), n - len(tail) - fake.written)
                    self.wfile.write(piece[:k])
                    fake.written += k
                self.wfile.write(tail)
                fake.written += len(tail)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler, bind_and_activate=False)
        self.server.daemon_threads = True
        self.server.server_bind()  # bound but not listening: a connection is refused until listen()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.listening = False
        if listen:
            self.listen()

    def listen(self):
        self.server.server_activate()
        self.listening = True
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def close(self):
        if self.listening:
            self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def fake():
    f = FakeSandboxFusion()
    yield f
    f.close()


def backend(url, **kw):
    return SandboxFusionBackend(url=url, limits=LIMITS, max_attempts=1, **kw)


def run(b, code="print(1+1)", **kw):
    return asyncio.run(b.run(code, **kw))


def test_request_format_and_success(fake):
    r = run(backend(fake.url), "print(1+1)", stdin="in")
    assert r.status == Status.OK and r.stdout == "2\n" and r.exit_code == 0 and r.backend == "sandbox_fusion"
    (req,) = fake.requests
    assert req["path"] == "/run_code"
    body = req["json"]
    assert body["code"] == "print(1+1)" and body["language"] == "python" and body["stdin"] == "in"
    assert body["run_timeout"] == LIMITS.wall_timeout_s and body["files"] == {}


def test_request_carries_the_limits_the_api_accepts(fake):
    """run_timeout and memory_limit_MB are SandboxFusion's run_code fields; the rest have none (module docstring)."""
    lim = SandboxLimits(wall_timeout_s=3.5, memory_bytes=300 * MiB)
    assert run(SandboxFusionBackend(url=fake.url, limits=lim, max_attempts=1)).ok
    body = fake.requests[0]["json"]
    assert body["run_timeout"] == 3.5 and body["memory_limit_MB"] == 300


def test_self_check_line_says_what_is_enforced_where():
    line = SandboxFusionBackend(url="http://x", limits=SandboxLimits(wall_timeout_s=3.5, memory_bytes=300 * MiB,
                                                                     max_output_bytes=1000)).describe_limits()
    assert "run_timeout 3.5 s" in line and "memory_limit_MB 300" in line and "output cut at 1000 bytes" in line
    assert "processes" in line and "network: the server's own configuration" in line


def test_trailing_slash_in_url(fake):
    assert run(backend(fake.url + "/")).ok and fake.requests[0]["path"] == "/run_code"


@pytest.mark.parametrize(
    "answer, status, words",
    [
        (finished(stderr="Traceback...\nZeroDivisionError: division by zero", code=1), Status.ERROR, "status 1"),
        (finished(stderr="Traceback...\nMemoryError", code=1), Status.MEMORY_LIMIT, "memory limit"),
        (finished(stderr="BlockingIOError: [Errno 11] Resource temporarily unavailable", code=1),
         Status.PROCESS_LIMIT, "process limit"),
        (finished(stdout="partial", code=-1, status="TimeLimitExceeded"), Status.TIMEOUT, "timeout"),
        (finished(stdout="x" * 5000), Status.OUTPUT_LIMIT, "output limit"),
        ({"status": "SandboxError", "message": "no executor", "run_result": None}, Status.SANDBOX_ERROR,
         "no executor"),
    ],
)
def test_answers_map_to_named_results(fake, answer, status, words):
    fake.answer = (200, answer)
    r = run(backend(fake.url))
    assert r.status == status and words in r.detail, r
    if status == Status.OUTPUT_LIMIT:
        assert len(r.stdout) == LIMITS.max_output_bytes


def test_http_error_is_a_sandbox_error(fake):
    fake.answer = (500, "internal error")
    r = run(backend(fake.url))
    assert r.status == Status.SANDBOX_ERROR and "HTTP 500" in r.detail and "internal error" in r.detail


def test_garbage_answer_is_a_sandbox_error(fake):
    fake.answer = (200, "not json")
    r = run(backend(fake.url))
    assert r.status == Status.SANDBOX_ERROR


def test_unreachable_server_names_the_fix():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    r = run(backend(f"http://127.0.0.1:{port}"))
    assert r.status == Status.SANDBOX_ERROR and "cannot reach SandboxFusion" in r.detail
    assert "volcengine/sandbox-fusion" in r.detail and "SANDBOX_FUSION_URL" in r.detail


def test_slow_server_times_out(fake):
    fake.delay = 30.0  # far past the client's timeout: run_timeout 2 s + 0.2 s
    t0 = time.monotonic()
    r = run(backend(fake.url, http_margin_s=0.2), "print(1)")
    assert r.status == Status.TIMEOUT and time.monotonic() - t0 < 20.0  # gave up, did not wait for the answer


def test_cancel_returns_at_once(fake):
    """Cancelling closes the connection without waiting for the answer (the server's program runs on: docs)."""
    fake.delay = 30.0

    async def scenario():
        task = asyncio.create_task(backend(fake.url).run("print(1)"))
        await asyncio.sleep(0.3)
        t0 = time.monotonic()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return time.monotonic() - t0

    assert asyncio.run(scenario()) < 20.0


def test_missing_url_and_code_too_long():
    assert "SANDBOX_FUSION_URL" in run(backend("")).detail
    r = run(backend("http://127.0.0.1:9"), "x" * (LIMITS.max_code_bytes + 1))
    assert r.status == Status.CODE_TOO_LONG


def test_self_check(fake):
    """The scripted fake answers "2" to every program, so the isolation probe learns nothing: accepted by name."""
    assert sandbox_self_check(backend(fake.url, accept=frozenset(GAPS))) is None
    fake.answer = (500, "boom")
    err = sandbox_self_check(backend(fake.url))
    assert "print(1+1)" in err and "HTTP 500" in err
    assert "SANDBOX_FUSION_URL" in sandbox_self_check(make_backend("sandbox_fusion", environ={}))


def test_make_backend_from_env(fake):
    b = make_backend(environ={"SANDBOX_BACKEND": "sandbox_fusion", "SANDBOX_FUSION_URL": fake.url,
                              "SANDBOX_WALL_TIMEOUT_S": "7"})
    assert isinstance(b, SandboxFusionBackend) and b.url == fake.url and b.limits.wall_timeout_s == 7
    with pytest.raises(ValueError, match="SANDBOX_BACKEND must be one of"):
        make_backend("docker", environ={})


def test_huge_answer_is_cut_while_read(fake):
    """A 64 MB answer: the client reads at most the answer budget, hangs up, and never holds the rest."""
    lim = SandboxLimits(wall_timeout_s=2, max_output_bytes=1000, max_code_bytes=1000)
    total = 64 * MiB
    fake.answer = ("huge", total)
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        r = run(SandboxFusionBackend(url=fake.url, limits=lim, max_attempts=1))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert r.status == Status.OUTPUT_LIMIT and "output limit" in r.detail, r
    assert peak < 4 * MiB, f"the client held {peak} bytes while reading a {total}-byte answer"
    assert r.extra["answer_bytes"] <= answer_budget(lim) < 100_000
    assert fake.done.wait(60)
    assert fake.write_failed and fake.written < total  # the server saw the connection closed before the end


@pytest.mark.parametrize("answer", ["http_500", "read_timeout", "disconnect"])
def test_a_program_the_server_may_have_run_is_not_sent_again(fake, answer):
    """After the request reached the server, a failure ends the call: a second POST could run the program twice."""
    b = SandboxFusionBackend(url=fake.url, limits=SandboxLimits(wall_timeout_s=0.5), max_attempts=3,
                             http_margin_s=0.2, retry_backoff_s=0.01)
    if answer == "http_500":
        fake.answer = (500, "internal error")
    elif answer == "read_timeout":
        fake.delay = 2.0
    else:
        fake.answer = "disconnect"
    r = run(b)
    assert r.status in (Status.SANDBOX_ERROR, Status.TIMEOUT) and not r.ok, r
    assert fake.done.wait(60)  # the server handled the first request (a loaded machine may be slow to)
    assert len(fake.requests) == 1, f"{answer}: the program was sent {len(fake.requests)} times"


def test_a_refused_connection_is_tried_again():
    """Refused (nothing listens yet): the server never saw the request, so the next attempt sends it, once."""
    fake = FakeSandboxFusion(listen=False)
    try:
        b = SandboxFusionBackend(url=fake.url, limits=LIMITS, max_attempts=2, retry_backoff_s=0.01)
        post, attempts = b._post, []

        async def first_refused_then_listen(*args):
            attempts.append(fake.listening)
            try:
                return await post(*args)
            finally:
                if not fake.listening:
                    fake.listen()

        b._post = first_refused_then_listen
        r = run(b)
        assert attempts == [False, True] and r.ok and r.stdout == "2\n" and len(fake.requests) == 1, r
    finally:
        fake.close()


# ---- what the server enforces: the startup probe ---------------------------------------------------------------
PROBE_LIMITS = SandboxLimits(wall_timeout_s=30, memory_bytes=256 * MiB, max_processes=8, max_output_bytes=4096)


def unisolated(request):
    """Runs the program as SandboxFusion's default ``isolation: none`` does (servers from 2025-06-17): this host's
    network and user, RLIMIT_AS = memory_limit_MB per process, nothing else."""
    import resource
    import subprocess
    import sys

    limit = request["memory_limit_MB"] * 2**20

    def rlimit():
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    r = subprocess.run([sys.executable, "-c", request["code"]], capture_output=True, text=True,
                       timeout=request["run_timeout"], preexec_fn=rlimit)
    return finished(r.stdout, r.stderr, r.returncode)


def test_an_unisolated_server_is_refused_by_name(fake):
    """The probe's program reaches this host and forks past max_processes: the self-check (and so the preflight)
    refuses the server, naming each gap and the knob that accepts it. (Before, print(1+1) was all it checked.)"""
    fake.executor = unisolated
    b = SandboxFusionBackend(url=fake.url, limits=PROBE_LIMITS, max_attempts=1)
    err = sandbox_self_check(b)
    assert err is not None and "does not isolate model-written code" in err, err
    assert "network: NOT held (the program connected to this host" in err
    assert "processes: NOT held (16 of 16 forks succeeded)" in err and "memory: held" in err
    assert f"{ACCEPT_ENV}=network,processes" in err and "accept_unenforced" in err


def test_gaps_accepted_by_name_run_and_are_stated(fake):
    fake.executor = unisolated
    b = make_backend("sandbox_fusion", {"limits": {"wall_timeout_s": 30, "memory_bytes": 256 * MiB,
                                                   "max_processes": 8}},
                     environ={"SANDBOX_FUSION_URL": fake.url, ACCEPT_ENV: "network,processes"})
    assert sandbox_self_check(b) is None
    line = b.describe_limits()
    assert "probed: network: NOT held" in line and "accepted by name: network,processes" in line
    b.accept = frozenset({"network"})  # accepting less than the server lacks is still refused
    assert "processes: NOT held" in sandbox_self_check(b)


def test_an_isolated_server_passes_the_probe(fake):
    """A server that runs programs isolated (here: through the recipe's own bubblewrap sandbox, no network,
    memory and processes in total) holds all three."""
    from harness.sandbox_check import require_sandbox
    from recipe.tools.bwrap import BubblewrapBackend

    inner = require_sandbox(BubblewrapBackend(limits=PROBE_LIMITS))

    def isolated(request):
        r = asyncio.run(inner.run(request["code"]))
        return finished(r.stdout, r.stderr, r.exit_code if r.exit_code is not None else 1)

    fake.executor = isolated
    b = SandboxFusionBackend(url=fake.url, limits=PROBE_LIMITS, max_attempts=1)
    assert sandbox_self_check(b) is None
    assert "network: held" in b.describe_limits() and "NOT held" not in b.describe_limits()


def test_accepting_an_unknown_gap_names_the_known_ones():
    assert parse_accept("network, Memory", ACCEPT_ENV) == {"network", "memory"}
    with pytest.raises(ValueError, match=f"{ACCEPT_ENV}.*network, memory, processes"):
        make_backend("sandbox_fusion", environ={ACCEPT_ENV: "internet"})
    with pytest.raises(ValueError, match="accept_unenforced"):
        make_backend("sandbox_fusion", {"accept_unenforced": ["all"]}, environ={})
