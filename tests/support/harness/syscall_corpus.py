"""The programs the sandbox's syscall allowlist is derived from and tested against (``recipe/tools/syscalls.py``).

What a model writes for math and code tasks: CPython's standard library, numpy and sympy, files in the scratch
directory, threads, subprocesses and multiprocessing. ``scripts/derive_sandbox_syscalls.py`` runs each under strace
and prints the system calls it makes that the allowlist lacks; ``tests/tools/test_syscall_allowlist.py`` runs each
through the sandboxes and asserts it prints ``CORPUS OK``. Programs that need numpy or sympy are skipped where the
sandbox's interpreter lacks them (``needs``).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Program:
    name: str
    code: str
    needs: tuple[str, ...] = ()  # modules the interpreter must have
    processes: bool = False  # starts threads or processes (the landlock sandbox grants one process, one thread)
    writes: bool = False  # writes files in the scratch directory


CORPUS = (
    Program("stdlib", """
import math, cmath, fractions, decimal, itertools, functools, collections, re, json, random, statistics, heapq
import bisect, array, struct, string, textwrap, datetime, time, calendar, operator, copy, pprint, enum, typing
import dataclasses, hashlib, hmac, base64, binascii, zlib, gzip, bz2, lzma, pickle, io, csv, uuid, secrets
import sqlite3, warnings, traceback, sys, os, locale, unicodedata, inspect, ast, dis, timeit, contextlib, abc
decimal.getcontext().prec = 60
print(decimal.Decimal(2).sqrt(), fractions.Fraction(7, 3) ** 3, math.comb(60, 30), 2 ** 4000 % 1000007)
print(sorted(random.Random(0).sample(range(100), 5)), statistics.median([3, 1, 2]), uuid.uuid4().version)
print(hashlib.sha256(b"x").hexdigest()[:8], len(zlib.compress(b"a" * 10000)), len(lzma.compress(b"b" * 1000)))
db = sqlite3.connect(":memory:")
db.execute("create table t(x)"); db.executemany("insert into t values (?)", [(i,) for i in range(100)])
print(db.execute("select sum(x) from t").fetchone(), json.dumps({"a": [1, 2]}), datetime.date(2024, 2, 29))
print(secrets.token_hex(4).__len__(), os.urandom(4).__len__(), time.time() > 0, time.perf_counter() >= 0)
sys.setrecursionlimit(10000)
@functools.lru_cache(None)
def f(n): return n if n < 2 else f(n - 1) + f(n - 2)
print(f(300) % 1000, timeit.timeit("1+1", number=1000) >= 0, len(inspect.getsource(f)) > 0)
try:
    1 / 0
except ZeroDivisionError:
    traceback.format_exc()
warnings.warn("a warning")
print("CORPUS OK")
"""),
    Program("files", """
import os, tempfile, pathlib, shutil, glob, io
p = pathlib.Path("work"); p.mkdir()
(p / "a.txt").write_text("hello\\n" * 1000)
with open(p / "b.bin", "wb") as f:
    f.write(os.urandom(1 << 20)); f.flush(); os.fsync(f.fileno())
shutil.copy(p / "a.txt", p / "c.txt"); os.rename(p / "c.txt", p / "d.txt"); os.symlink("a.txt", p / "e")
with tempfile.NamedTemporaryFile("w", delete=False) as t:
    t.write("x")
with tempfile.TemporaryDirectory() as d:
    open(os.path.join(d, "z"), "w").write("z")
print(sorted(os.listdir(p)), os.path.getsize(p / "b.bin"), os.stat(p / "a.txt").st_size, glob.glob("work/*.txt"))
os.chmod(p / "a.txt", 0o600); os.utime(p / "a.txt"); os.truncate(p / "a.txt", 3)
print(open(p / "a.txt").read(), os.getcwd(), os.path.expanduser("~"), os.cpu_count() >= 1)
shutil.rmtree(p); os.unlink(t.name)
print(open("/dev/null", "w").write("x"), len(open("/dev/urandom", "rb").read(8)))
print("CORPUS OK")
""", writes=True),
    Program("numpy", """
import numpy as np, io
rng = np.random.default_rng(0)
a = rng.standard_normal((200, 200))
print(round(float(np.linalg.det(a[:5, :5])), 6), np.linalg.solve(a, np.ones(200)).shape, np.linalg.eigvals(a[:20, :20]).shape)
print(np.fft.fft(np.arange(64)).shape, np.sort(rng.integers(0, 100, 10)), np.einsum("ij,jk->ik", a, a).shape)
print(np.polyfit(np.arange(10), np.arange(10) ** 2, 2).round(6), np.percentile(a, 90).round(3), a.T.dot(a).trace() > 0)
buf = io.BytesIO(); np.save(buf, a); buf.seek(0); print(np.load(buf).shape)
np.save("a.npy", a); print(np.load("a.npy").sum().round(3) == a.sum().round(3))
big = np.zeros(50_000_000 // 8); big[::4096] = 1; print(int(big.sum()))
print("CORPUS OK")
""", needs=("numpy",), writes=True),
    Program("sympy", """
import sympy as sp
x, y, n = sp.symbols("x y n")
print(sp.solve(x ** 2 - 5 * x + 6, x), sp.factor(x ** 4 - 1), sp.integrate(sp.sin(x) ** 2, (x, 0, sp.pi)))
print(sp.simplify(sp.sin(x) ** 2 + sp.cos(x) ** 2), sp.series(sp.exp(x), x, 0, 5), sp.Matrix([[1, 2], [3, 4]]).det())
print(sp.nsimplify(0.333333333333), sp.isprime(2 ** 61 - 1), sp.summation(1 / n ** 2, (n, 1, sp.oo)), sp.N(sp.pi, 50))
print(sp.limit(sp.sin(x) / x, x, 0), sp.diff(sp.atan(x), x), sp.linsolve([x + y - 3, x - y - 1], x, y))
f = sp.lambdify(x, sp.sqrt(x) + 1); print(f(4.0), sp.Rational(3, 7) + sp.Rational(1, 7), sp.factorint(360))
print("CORPUS OK")
""", needs=("sympy",)),
    Program("threads", """
import threading, queue, concurrent.futures as cf
q = queue.Queue()
ts = [threading.Thread(target=lambda i=i: q.put(i * i)) for i in range(8)]
[t.start() for t in ts]; [t.join() for t in ts]
with cf.ThreadPoolExecutor(4) as ex:
    print(sorted(ex.map(abs, [-1, -2, -3])), sorted(q.queue))
ev = threading.Event(); threading.Timer(0.01, ev.set).start(); print(ev.wait(5))
print("CORPUS OK")
""", processes=True),
    Program("processes", """
import multiprocessing as mp, subprocess, os, sys, signal, concurrent.futures as cf
def sq(v): return v * v
if __name__ == "__main__":
    with mp.Pool(2) as pool:
        print(pool.map(sq, range(5)))
    a, b = mp.Pipe(); a.send([1, 2]); print(b.recv())
    qq = mp.Queue(); p = mp.Process(target=qq.put, args=("from child",)); p.start(); print(qq.get()); p.join()
    with cf.ProcessPoolExecutor(2) as ex:
        print(list(ex.map(sq, [3, 4])))
    print(subprocess.run(["echo", "hi"], capture_output=True, text=True).stdout.strip())
    print(subprocess.run([sys.executable, "-c", "print(6*7)"], capture_output=True, text=True).stdout.strip())
    print(subprocess.run("echo $((1+2)) | cat", shell=True, capture_output=True, text=True).stdout.strip())
    pid = os.fork()
    if pid == 0:
        os._exit(3)
    print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
    print("CORPUS OK")
""", processes=True),
    Program("signals_and_io", """
import signal, time, select, os, sys, resource, asyncio, socket, faulthandler
faulthandler.enable()
signal.signal(signal.SIGALRM, lambda *a: None); signal.setitimer(signal.ITIMER_REAL, 0.01); time.sleep(0.05)
r, w = os.pipe(); os.write(w, b"x"); print(select.select([r], [], [], 1)[0] == [r], os.read(r, 1))
a, b = socket.socketpair(); a.sendall(b"ping"); print(b.recv(4))
async def main():
    await asyncio.sleep(0.01)
    return await asyncio.gather(*(asyncio.sleep(0, result=i) for i in range(3)))
print(asyncio.run(main()), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss > 0, resource.getrlimit(resource.RLIMIT_AS))
print(os.getpid() > 0, os.getuid() >= 0, os.uname().sysname, os.times().user >= 0, input())
print("CORPUS OK")
"""),
    Program("errors", """
import sys
print("CORPUS OK")
sys.stdout.flush()
raise SystemExit(0)
"""),
)
