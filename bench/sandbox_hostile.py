"""Hostile programs through both local sandboxes, in three settings: bubblewrap as root, Landlock as root (it drops to
nobody), Landlock as uid 4242 inside a Docker-like setting (tests/tools/docker_nonroot.py: no user namespaces, a
read-only cgroupfs). Prints a markdown table (program, backend, status, held or not) and the command to reproduce.

"held": nothing printed ``ESCAPED`` and no victim was touched (a process of the sandbox's uid outside it, reniced by
``setpriority``), and the run ended in a status its limit names (``expect``): a run the wall clock ended where a
limit should have caught it is "only by the timeout", which counts as not held. These are the set's own programs,
beside the tests' fixtures (tests/support/harness/hostile.py); they probe the holes of issue 45 and the usual ways out.

Reproduce (as root, bubblewrap installed: ``bash scripts/lib/install_sandbox.sh``; ~2 min on 2 cores):

    .venv/bin/python bench/sandbox_hostile.py
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
NONROOT_UID = 4242
ESCAPE_PATHS = ("/var/tmp/sandbox-hostile-escape", "/usr/sandbox-hostile-escape")
MiB = 1 << 20

PRELUDE = """
import ctypes, errno, os, socket, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def call(nr, *args):
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(nr), *[a if isinstance(a, ctypes.c_void_p) else ctypes.c_long(a) for a in args])
    return r if r >= 0 else errno.errorcode.get(ctypes.get_errno(), ctypes.get_errno())
def ptr(v):
    return ctypes.cast(ctypes.pointer(v), ctypes.c_void_p)
"""
# (name, code, statuses that mean the right limit held it besides "ok"); x86_64 system call numbers.
PROGRAMS = [
    ("setsockopt SOL_SOCKET|1<<32 SO_SNDBUF 8 MiB", """
a, b = socket.socketpair()
before = a.getsockopt(1, 7)
print('setsockopt', call(54, a.fileno(), 1 | 1 << 32, 7, ptr(ctypes.c_int(8 << 20)), 4))
after = a.getsockopt(1, 7)
print('ESCAPED sndbuf', before, '->', after) if after > before else print('held', after)
""", set()),
    ("setsockopt SO_SNDBUFFORCE|1<<32 512 MiB", """
a, b = socket.socketpair()
before = a.getsockopt(1, 7)
print('setsockopt', call(54, a.fileno(), 1 | 1 << 32, 32, ptr(ctypes.c_int(512 << 20)), 4))
after = a.getsockopt(1, 7)
print('ESCAPED sndbuf', before, '->', after) if after > before else print('held', after)
""", set()),
    ("setpriority(PRIO_USER, 0, 19)", "print('setpriority', call(141, 2, 0, 19))\n", set()),
    ("setpriority(PRIO_PGRP, 0, 19)", "print('setpriority', call(141, 1, 0, 19))\n", set()),
    ("sched_setscheduler SCHED_FIFO 50", """
r = call(144, 0, 1, ptr(ctypes.c_int(50)))
print('ESCAPED SCHED_FIFO') if r == 0 else print('denied', r)
""", set()),
    ("setrlimit raise (hard, soft)", """
import resource as R
for k in ('RLIMIT_AS', 'RLIMIT_STACK', 'RLIMIT_NOFILE', 'RLIMIT_MEMLOCK', 'RLIMIT_NICE', 'RLIMIT_RTPRIO'):
    s, h = R.getrlimit(getattr(R, k))
    for new in ((h, h + 1), (s + 1, h)) if h != R.RLIM_INFINITY else ((h, h),):
        try:
            R.setrlimit(getattr(R, k), new); print('ESCAPED raised', k, (s, h), '->', new)
        except (ValueError, OSError):
            pass
print('done')
""", set()),
    ("root, capabilities", """
caps = {l.split(':')[0]: int(l.split()[1], 16) for l in open('/proc/self/status') if l.startswith('Cap')}
print('uid', os.getuid(), 'caps', {k: hex(v) for k, v in caps.items()})
if caps['CapEff'] or caps['CapPrm'] or caps['CapAmb']:
    print('ESCAPED capabilities')
""", set()),
    ("a hidden mode-0300 directory, 5x the scratch cap", """
os.mkdir('h', 0o300)  # write and search, no read: the owner cannot list it
for i in range(40):
    with open(f'h/f{i}', 'wb') as f:
        f.write(b'x' * (1 << 20))
import time; time.sleep(3)
print('ESCAPED hid', 40, 'MiB')
""", {"disk_limit"}),
    ("fallocate KEEP_SIZE 3 GiB", """
fd = os.open('f', os.O_CREAT | os.O_WRONLY)
r = call(285, fd, 1, 0, 3 << 30)
blocks = os.fstat(fd).st_blocks * 512
print('fallocate', r, 'allocated', blocks)
if blocks > 64 << 20:
    print('ESCAPED allocated', blocks)
""", {"disk_limit"}),
    ("posix_fallocate 3 GiB", """
fd = os.open('f', os.O_CREAT | os.O_WRONLY)
os.posix_fallocate(fd, 0, 3 << 30)
print('ESCAPED allocated', os.fstat(fd).st_blocks * 512)
""", {"disk_limit"}),
    ("write 5x the scratch cap in 1 MiB files", """
for i in range(40):
    with open(f'f{i}', 'wb') as f:
        f.write(b'x' * (1 << 20))
import time; time.sleep(3)
print('ESCAPED wrote 40 MiB')
""", {"disk_limit"}),
    ("one file past RLIMIT_FSIZE", "open('f', 'wb').write(b'x' * (80 << 20))\nprint('ESCAPED 80 MiB file')\n",
     {"disk_limit"}),
    ("100k empty files", """
for i in range(100000):
    open(f'e{i}', 'w').close()
import time; time.sleep(3)
print('created 100k files')
""", {"disk_limit"}),
    ("a 3,000-deep tree, rights removed", """
fd = os.open('.', os.O_RDONLY)
for i in range(3000):
    os.mkdir('d', dir_fd=fd); n = os.open('d', os.O_RDONLY, dir_fd=fd); os.close(fd); fd = n
os.chmod('d', 0)
print('built')
""", {"disk_limit"}),
    ("exec a file written in the scratch", """
open('x', 'w').write('#!/bin/sh\\necho ran a written file, in the same sandbox\\n'); os.chmod('x', 0o755)
try:
    os.execv('./x', ['./x'])
except OSError as e:
    print('denied', e.errno)
""", set()),
    ("memory 4 GiB", "x = bytearray(4 << 30)\nprint('ESCAPED 4 GiB')\n", {"memory_limit"}),
    ("CPU spin", "while True: pass\n", {"cpu_limit"}),
    ("output flood", "while True: print('x' * 1000)\n", {"output_limit"}),
    ("fork bomb", "import os\nwhile True: os.fork()\n", {"process_limit"}),
    ("thread bomb", "import threading, time\n[threading.Thread(target=time.sleep, args=(60,)).start() "
                    "for _ in range(10000)]\nprint('ESCAPED 10000 threads')\n", {"process_limit"}),
    ("signal pid 1 and the parent", """
for pid in sorted({1, os.getppid()}):
    try:
        os.kill(pid, 0)
    except OSError as e:
        print('denied', pid, e.errno); continue
    try:  # bwrap: pid 1 of the sandbox's own pid namespace is its init, bwrap
        own = b'bwrap' in open(f'/proc/{pid}/cmdline', 'rb').read()
    except OSError:
        own = False
    print('signalled its own init', pid) if own else print('ESCAPED signalled', pid)
""", set()),
    ("prlimit64 on pid 1", """
r = call(302, 1, 7, 0, ctypes.cast((ctypes.c_ulong * 2)(), ctypes.c_void_p))
print('ESCAPED read pid 1 limits') if r == 0 else print('denied', r)
""", set()),
    ("read /etc/shadow and /root, write /var/tmp and /usr", """
for p in ('/etc/shadow', '/root'):
    try:
        open(p).read(1); print('ESCAPED read', p)
    except OSError as e:
        print('denied', p, e.errno)
for p in ('/var/tmp/sandbox-hostile-escape', '/usr/sandbox-hostile-escape'):
    try:
        open(p, 'w').write('x'); print('ESCAPED wrote', p)
    except OSError as e:
        print('denied write', p, e.errno)
""", {"read_only_fs"}),
    ("connect to 1.1.1.1:53", """
try:
    socket.create_connection(('1.1.1.1', 53), timeout=2); print('ESCAPED connected')
except OSError as e:
    print('denied', e.errno)
""", {"no_network"}),
    ("memfd 512 MiB", """
try:
    fd = os.memfd_create('m'); os.write(fd, b'x' * (512 << 20)); print('ESCAPED memfd')
except OSError as e:
    print('denied', e.errno)
""", set()),
    ("sleep forever (the wall clock is its limit)", "import time\ntime.sleep(600)\n", {"timeout"}),
    ("low: stat a host path", """
try:
    os.stat('/etc/passwd'); print('LOW stat /etc/passwd works')
except OSError as e:
    print('denied', e.errno)
""", set()),
    ("low: /proc/self/mountinfo, /proc/1/cmdline", """
for p in ('/proc/self/mountinfo', '/proc/1/cmdline'):
    try:
        print('LOW read', p, len(open(p, 'rb').read()), 'bytes')
    except OSError as e:
        print('denied', p, e.errno)
""", set()),
]


def limits():
    from recipe.tools.limits import SandboxLimits
    return SandboxLimits(wall_timeout_s=20, cpu_time_s=2, memory_bytes=256 * MiB, max_processes=16,
                         max_output_bytes=64 * 1024, scratch_bytes=8 * MiB, max_file_bytes=64 * MiB)


def nice(pid: int) -> int:
    raw = Path(f"/proc/{pid}/stat").read_text()
    return int(raw[raw.rindex(")") + 2:].split()[16])


def run_all(backend, victim_uid: int, names: list[str] | None = None) -> list[dict]:
    """Each program (those named, or all) through ``backend``, a victim process of ``victim_uid`` beside it; what it
    left in the scratch root is checked after each run."""
    rows = []
    for name, body, expect in PROGRAMS:
        if names and name not in names:
            continue
        victim = subprocess.Popen(["sleep", "300"], **({"user": victim_uid, "group": victim_uid, "extra_groups": []}
                                                       if os.geteuid() == 0 else {}))
        t0 = time.monotonic()
        r = asyncio.run(backend.run(PRELUDE + body))
        wall = time.monotonic() - t0
        reniced = nice(victim.pid)
        victim.kill()
        victim.wait()
        root = getattr(backend, "scratch_root", None)
        left = os.listdir(root) if root else []
        escaped = [line for line in r.stdout.splitlines() if line.startswith("ESCAPED")]
        if reniced:
            escaped.append(f"ESCAPED a victim of uid {victim_uid} reniced to {reniced}")
        if left:
            escaped.append(f"ESCAPED left {left} in the scratch root")
        for p in ESCAPE_PATHS:
            if os.path.lexists(p):
                escaped.append(f"ESCAPED wrote {p}")
                os.unlink(p)
        low = [line for line in r.stdout.splitlines() if line.startswith("LOW")]
        ok_status = r.status.value == "ok" or r.status.value in expect
        only_timeout = r.status.value == "timeout" and "timeout" not in expect
        rows.append({"program": name, "backend": backend.name, "status": r.status.value, "wall_s": round(wall, 2),
                     "held": not escaped and ok_status and not only_timeout, "only_timeout": only_timeout,
                     "low": bool(low),
                     "why": "; ".join(escaped + low) or (r.detail if r.status.value != "ok" else
                                                         r.stdout.strip().splitlines()[-1:] and
                                                         r.stdout.strip().splitlines()[-1][:80])})
    return rows


def nonroot_rows(names: list[str] | None = None) -> list[dict]:
    """This file's ``--worker`` as uid 4242 in the Docker-like setting, with the recipe and the two bindings copied
    where that uid can read them (the venv lives under /root)."""
    import landlock
    import pyseccomp

    site = Path(tempfile.mkdtemp(prefix="hostile-site-"))
    try:
        site.chmod(0o755)
        shutil.copy(pyseccomp.__file__, site)
        shutil.copytree(os.path.dirname(landlock.__file__), site / "landlock")
        shutil.copytree(REPO / "recipe", site / "recipe", ignore=shutil.ignore_patterns("__pycache__"))
        (site / "bench").mkdir()
        shutil.copy(__file__, site / "bench" / "sandbox_hostile.py")
        for d, _, files in os.walk(site):
            os.chmod(d, 0o755)
            for n in files:
                os.chmod(os.path.join(d, n), 0o644)
        env = {"PATH": "/usr/bin:/bin", "HOME": "/nonexistent", "LANG": "C.UTF-8", "PYTHONPATH": str(site)}
        r = subprocess.run([sys.executable, str(REPO / "tests" / "tools" / "docker_nonroot.py"), str(NONROOT_UID),
                            "/usr/bin/python3", str(site / "bench" / "sandbox_hostile.py"), "--worker",
                            *(f"--program={n}" for n in names or ())],
                           cwd="/", env=env, capture_output=True, text=True, timeout=1800)
    finally:
        shutil.rmtree(site)
    if r.returncode != 0:
        raise SystemExit(f"the uid {NONROOT_UID} run failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def worker(names: list[str] | None) -> list[dict]:
    from recipe.tools.landlock_sandbox import LandlockBackend

    root = tempfile.mkdtemp(prefix="hostile-scratch-")
    try:
        b = LandlockBackend(limits=limits(), scratch_root=root)
        return [dict(row, backend=f"landlock (uid {os.getuid()})") for row in run_all(b, os.getuid(), names)]
    finally:
        os.rmdir(root)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--worker", action="store_true", help="(internal) the non-root run; prints JSON")
    ap.add_argument("--only", choices=("bubblewrap", "landlock-root", "landlock-nonroot"), action="append")
    ap.add_argument("--program", action="append", help="run only this program (its name in the table); repeatable")
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(args.program)))
        return
    if os.geteuid() != 0:
        raise SystemExit("run as root: bubblewrap drops root to nobody, Landlock is run as root and as uid 4242")
    from recipe.tools.bwrap import NOBODY, BubblewrapBackend
    from recipe.tools.landlock_sandbox import LandlockBackend
    from recipe.tools.sandbox import sandbox_self_check

    only = set(args.only or ("bubblewrap", "landlock-root", "landlock-nonroot"))
    rows = []
    if "bubblewrap" in only:
        b = BubblewrapBackend(limits=limits())
        problem = sandbox_self_check(b)
        if problem:
            raise SystemExit(f"bubblewrap: {problem}")
        rows += [dict(row, backend="bubblewrap (root -> nobody)") for row in run_all(b, NOBODY, args.program)]
    if "landlock-root" in only:
        root = tempfile.mkdtemp(prefix="hostile-scratch-")
        os.chmod(root, 0o711)
        try:
            b = LandlockBackend(limits=limits(), scratch_root=root)
            rows += [dict(row, backend="landlock (root -> nobody)") for row in run_all(b, NOBODY, args.program)]
        finally:
            os.rmdir(root)
    if "landlock-nonroot" in only:
        rows += nonroot_rows(args.program)
    lim = limits()
    print(f"limits: wall {lim.wall_timeout_s:g} s, CPU {lim.cpu_time_s} s, memory {lim.memory_bytes // MiB} MiB, "
          f"{lim.max_processes} processes, scratch {lim.scratch_bytes // MiB} MiB, file {lim.max_file_bytes // MiB} "
          f"MiB, output {lim.max_output_bytes // 1024} KiB; kernel {os.uname().release}\n")
    print("| program | backend | status | held | what it did / why |")
    print("|---|---|---|---|---|")
    for row in rows:
        held = "yes" if row["held"] else ("NO (only by the timeout)" if row["only_timeout"] else "NO")
        held += " (low: it sees what it should not)" if row["held"] and row["low"] else ""
        why = str(row["why"]).replace("|", "\\|")[:160]
        print(f"| {row['program']} | {row['backend']} | {row['status']} | {held} | {why} |")
    bad = [r for r in rows if not r["held"]]
    print(f"\n{len(rows) - len(bad)}/{len(rows)} held. Reproduce: .venv/bin/python bench/sandbox_hostile.py")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
