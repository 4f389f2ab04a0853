"""The SandboxFusion backend against a fake server: request format and the mapping of every answer to a result.

``FakeSandboxFusion`` is a test double: a tiny HTTP server on 127.0.0.1 that records each ``POST /run_code`` and
answers what a test scripts, in the shape of SandboxFusion's ``RunCodeResponse`` (sandbox-fusion 0.3.7's models). It
does not run code. The client under test is the real PyPI ``sandbox-fusion`` client (skipped, with the install line,
where it is not installed).
"""

import asyncio
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from recipe.tools.fusion import CLIENT_PIN, SandboxFusionBackend
from recipe.tools.limits import SandboxLimits
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
    """Test double of the SandboxFusion server (see the module docstring)."""

    def __init__(self):
        self.requests = []
        self.answer = (200, finished("2\n"))
        self.delay = 0.0
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                fake.requests.append({"path": self.path, "json": json.loads(body)})
                time.sleep(fake.delay)
                code, payload = fake.answer
                data = payload.encode() if isinstance(payload, str) else json.dumps(payload).encode()
                try:
                    self.send_response(code)
                    self.send_header("Content-Type", "application/json" if code == 200 else "text/plain")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def close(self):
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
    fake.delay = 3.0  # past the client's timeout: run_timeout 2 s + 0.2 s
    t0 = time.monotonic()
    r = run(backend(fake.url, http_margin_s=0.2), "print(1)")
    assert r.status == Status.TIMEOUT and time.monotonic() - t0 < 3.0


def test_cancel_returns_at_once(fake):
    fake.delay = 5.0

    async def scenario():
        task = asyncio.create_task(backend(fake.url).run("print(1)"))
        await asyncio.sleep(0.3)
        t0 = time.monotonic()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return time.monotonic() - t0

    assert asyncio.run(scenario()) < 1.0


def test_missing_url_and_code_too_long():
    assert "SANDBOX_FUSION_URL" in run(backend("")).detail
    r = run(backend("http://127.0.0.1:9"), "x" * (LIMITS.max_code_bytes + 1))
    assert r.status == Status.CODE_TOO_LONG


def test_self_check(fake):
    assert sandbox_self_check(backend(fake.url)) is None
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
