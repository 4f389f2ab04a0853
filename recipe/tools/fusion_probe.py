"""What a SandboxFusion server enforces, found out at startup by running three probe programs on it.

SandboxFusion's default ``isolation: none`` runs the program as the server's user with the server container's
network: the internet and every port the training hosts bind on 0.0.0.0 (Ray, vLLM's servers, TransferQueue, none
authenticated); its ``server-20250609`` image ignores ``memory_limit_MB``; nothing bounds the processes. So before a
launch the recipe asks the server itself:

- ``network``: the program connects to a port this process listens on, at the address the server reaches this host
  by. Held when no connection arrives.
- ``memory``: the program allocates ``memory_bytes`` + 64 MiB and writes every page. Held when it cannot.
- ``processes``: the program forks ``max_processes`` + 8 children that each sleep a moment. Held when some fork
  fails.

A gap refuses the backend (the self-check fails, so the preflight refuses the launch) unless it is accepted by
name: ``SANDBOX_FUSION_ACCEPT=network,memory,processes`` (any of them), or ``accept_unenforced: [...]`` in the tool
config. The self-check's ``limits:`` line says what was probed and found.
"""
from __future__ import annotations

import socket
import threading
from dataclasses import dataclass
from urllib.parse import urlparse

GAPS = ("network", "memory", "processes")
ACCEPT_ENV = "SANDBOX_FUSION_ACCEPT"
EXTRA_MIB = 64
EXTRA_PROCESSES = 8


def parse_accept(value, where: str) -> frozenset[str]:
    """The gaps accepted by name; anything else is refused with the known names."""
    if value in (None, "", [], ()):
        return frozenset()
    names = [v.strip().lower() for v in (value.split(",") if isinstance(value, str) else value) if str(v).strip()]
    unknown = [n for n in names if n not in GAPS]
    if unknown:
        raise ValueError(f"{where}: unknown SandboxFusion gap(s) {unknown}; accept any of {', '.join(GAPS)}")
    return frozenset(names)


def network_code(host: str, port: int) -> str:
    return (
        "import socket\n"
        "try:\n"
        f"    socket.create_connection(({host!r}, {port}), timeout=5).close()\n"
        "    print('PROBE network reached')\n"
        "except OSError as e:\n"
        "    print('PROBE network blocked', e.errno)\n"
    )


def memory_code(limit_bytes: int) -> str:
    n = limit_bytes + EXTRA_MIB * 1024 * 1024
    return f"x = bytearray({n})\nfor i in range(0, {n}, 4096):\n    x[i] = 1\nprint('PROBE memory allocated', {n})\n"


def processes_code(n: int) -> str:
    return (
        "import os, time\nforked = 0\npids = []\n"
        f"for _ in range({n}):\n"
        "    try:\n"
        "        pid = os.fork()\n"
        "    except OSError:\n"
        "        break\n"
        "    if pid == 0:\n"
        "        time.sleep(2)\n"
        "        os._exit(0)\n"
        "    pids.append(pid)\n"
        "for p in pids:\n"
        "    os.waitpid(p, 0)\n"
        "print('PROBE processes forked', len(pids))\n"
    )


def this_host_address(url: str) -> str:
    """The address the server at ``url`` reaches this host by (the source address of a route to it)."""
    parsed = urlparse(url)
    host, port = parsed.hostname or "127.0.0.1", parsed.port or 80
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect((socket.gethostbyname(host), port))
            return s.getsockname()[0]
        except OSError:
            return "127.0.0.1"


class _Listener:
    """A TCP port on every address of this host that counts the connections it gets."""

    def __init__(self):
        self.sock = socket.create_server(("0.0.0.0", 0))
        self.sock.settimeout(0.1)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self):
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
                self.accepted += 1
                conn.close()
            except OSError:
                continue

    def close(self):
        self._stop.set()
        self._thread.join()
        self.sock.close()


@dataclass
class Probed:
    held: dict  # gap -> whether the server held it
    seen: dict  # gap -> what the probe saw, in words

    def gaps(self) -> list[str]:
        return [g for g in GAPS if not self.held[g]]

    def describe(self) -> str:
        return "; ".join(f"{g}: {'held' if self.held[g] else 'NOT held'} ({self.seen[g]})" for g in GAPS)


async def probe(backend) -> Probed:
    """Run the three probes through ``backend`` (a ``SandboxFusionBackend``)."""
    lim = backend.limits
    held, seen = {}, {}
    listener = _Listener()
    try:
        host = this_host_address(backend.url)
        r = await backend.run(network_code(host, listener.port))
        reached = listener.accepted > 0 or "PROBE network reached" in r.stdout
        held["network"] = not reached and "PROBE network blocked" in r.stdout
        seen["network"] = (f"the program connected to this host at {host}:{listener.port}" if reached else
                           "no connection to this host" if held["network"] else
                           f"no answer from the probe ({r.status.value}: {r.detail[:120]})")
    finally:
        listener.close()
    r = await backend.run(memory_code(lim.memory_bytes))
    allocated = "PROBE memory allocated" in r.stdout
    held["memory"] = not allocated and r.status.value in ("memory_limit", "killed", "error")
    seen["memory"] = (f"allocated {lim.memory_bytes // 2**20 + EXTRA_MIB} MiB under memory_limit_MB "
                      f"{lim.memory_bytes // 2**20}" if allocated else f"stopped: {r.status.value}")
    n = lim.max_processes + EXTRA_PROCESSES
    r = await backend.run(processes_code(n))
    forked = next((int(line.split()[-1]) for line in r.stdout.splitlines() if line.startswith("PROBE processes")), None)
    held["processes"] = forked is not None and forked < n
    seen["processes"] = (f"{forked} of {n} forks succeeded" if forked is not None else
                         f"no answer from the probe ({r.status.value})")
    return Probed(held, seen)


def refusal(url: str, probed: Probed, accepted: frozenset[str]) -> str | None:
    """None when every gap is held or accepted by name, else the line that refuses the server."""
    open_gaps = [g for g in probed.gaps() if g not in accepted]
    if not open_gaps:
        return None
    return (f"SandboxFusion at {url} does not isolate model-written code: {probed.describe()}. Run the server with "
            f"isolation (a network-less container or its lite isolation, a memory and pids cgroup) or accept "
            f"by name: {ACCEPT_ENV}={','.join(probed.gaps())} (or accept_unenforced: [{', '.join(probed.gaps())}] "
            f"in the tool config)")
