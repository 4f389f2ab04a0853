"""The syscall allowlist (recipe/tools/syscalls.py): deny by default, and what CPython, numpy and sympy programs need
is on it. The corpus it was derived from (tests/support/harness/syscall_corpus.py) runs through the bubblewrap sandbox here
(and through the landlock sandbox in test_landlock_sandbox.py)."""

import asyncio
import subprocess

import pytest

from harness.sandbox_check import require_sandbox
from harness.syscall_corpus import CORPUS
from recipe.tools import seccomp, syscalls
from recipe.tools.bwrap import BubblewrapBackend
from recipe.tools.limits import MiB, SandboxLimits
from recipe.tools.result import Status

# What the allowlist must never hold, whatever a later edit adds (the old denylist's and the review's held-out set).
NEVER = {
    "unshare", "setns", "mount", "umount2", "pivot_root", "chroot", "fsopen", "fsconfig", "fsmount", "fspick",
    "move_mount", "open_tree", "mount_setattr", "ptrace", "process_vm_readv", "process_vm_writev", "kcmp",
    "pidfd_getfd", "pidfd_open", "pidfd_send_signal", "keyctl", "add_key", "request_key", "bpf", "perf_event_open",
    "userfaultfd", "io_uring_setup", "io_uring_enter", "io_uring_register", "memfd_create", "memfd_secret",
    "shmget", "shmat", "shmctl", "msgget", "msgsnd", "semget", "mq_open", "personality", "modify_ldt",
    "init_module", "finit_module", "delete_module", "kexec_load", "kexec_file_load", "reboot", "swapon", "acct",
    "quotactl", "syslog", "iopl", "ioperm", "open_by_handle_at", "name_to_handle_at", "settimeofday",
    "clock_settime", "clock_adjtime", "adjtimex", "setuid", "setgid", "setresuid", "setgroups", "capset",
    "chown", "fchown", "lchown", "fchownat", "setxattr", "fsetxattr", "lsetxattr", "inotify_init1",
    "fanotify_init", "clone3", "get_robust_list", "migrate_pages", "move_pages", "vmsplice", "landlock_create_ruleset",
}


def test_nothing_dangerous_is_allowed():
    for policy in (syscalls.Policy(), syscalls.Policy(processes=False, sockets=False, signal_pid=123)):
        assert syscalls.allowed_names(policy) & NEVER == set()


def test_every_listed_call_is_known_to_this_libseccomp():
    """A name libseccomp does not know is silently left out (denied): none of the list may be lost that way here."""
    rules = syscalls.rules(syscalls.Policy())
    assert [r.name for r in rules if not seccomp.known(r.name)] == []


def test_each_group_says_why():
    for name, (reason, calls) in syscalls.GROUPS.items():
        assert len(reason) > 20 and calls, name


def test_conditional_rules_pin_their_arguments():
    """clone only without a CLONE_NEW* flag; socket() only for unix/inet where there is a network namespace; no
    socket() and no new process or thread where there is none; signals to oneself only when ``signal_pid`` is set."""
    ns = syscalls.rules(syscalls.Policy())
    clone = [r for r in ns if r.name == "clone"]
    assert clone == [syscalls.Rule("allow", "clone", ((0, "masked_eq", 0, syscalls.CLONE_NEW_MASK),))]
    assert syscalls.CLONE_NEW_MASK & 0x10000000  # CLONE_NEWUSER
    assert {r.args[0][2] for r in ns if r.name == "socket" and r.action == "allow"} == {1, 2, 10}
    flat = syscalls.rules(syscalls.Policy(processes=False, sockets=False, signal_pid=4242))
    assert [r for r in flat if r.name == "socket"] == [syscalls.Rule("EAFNOSUPPORT", "socket")]
    assert {r.name for r in flat if r.action == "EAGAIN"} == {"clone", "clone3", "fork", "vfork"}
    assert not [r for r in flat if r.action == "allow" and r.name in ("clone", "fork", "vfork", "connect")]
    assert {r.args for r in flat if r.name == "kill"} == {((0, "eq", 4242, 0),), ((0, "eq", 0, 0),)}
    assert all(r.args == ((0, "eq", 0, 0),) for r in flat if r.name == "prlimit64")
    # setsockopt never raises a socket's buffers (kernel memory outside RLIMIT_AS and, on some kernels, the cgroup)
    opts = [r.args for r in ns if r.name == "setsockopt"]
    assert {a[0] for a in opts if len(a) == 1} == {(1, "eq", v, 0) for v in (0, 6, 17, 41)}
    assert all(a[1][2] not in (7, 8, 32, 33) for a in opts if len(a) == 2)
    # getpriority/setpriority: PRIO_PROCESS (which == 0) and the caller (who == 0, or its pid where it is known)
    for policy, whos in ((syscalls.Policy(), {0}), (syscalls.Policy(processes=False, signal_pid=4242), {0, 4242})):
        for name in ("getpriority", "setpriority"):
            got = [r.args for r in syscalls.rules(policy) if r.name == name]
            assert sorted(got) == sorted(((0, "eq", 0, 0), (1, "eq", w, 0)) for w in whos), (name, got)
    assert not {"sched_setscheduler", "sched_setparam", "sched_setattr"} & syscalls.allowed_names()


def test_allow_rules_compare_what_the_kernel_reads():
    """An allow rule compares an argument with ``eq`` (all 64 bits: a value with bits above the kernel's 32-bit
    ``int`` equals no allowed value) or, for ``clone``'s 64-bit flags, masks them; never ``ne`` or ``ge``, which
    let ``SOL_SOCKET | 1 << 32`` pass as "not SOL_SOCKET" while the kernel reads SOL_SOCKET."""
    for policy in (syscalls.Policy(), syscalls.Policy(processes=False, sockets=False, signal_pid=123)):
        for r in syscalls.rules(policy):
            if r.action == "allow":
                assert all(op == "eq" or (r.name == "clone" and op == "masked_eq") for _, op, _, _ in r.args), r


@pytest.fixture(scope="module")
def sandbox():
    return require_sandbox(BubblewrapBackend(limits=SandboxLimits(wall_timeout_s=120, cpu_time_s=60,
                                                                  memory_bytes=1024 * MiB)))


def _has(python: str, modules: tuple[str, ...]) -> bool:
    return not modules or subprocess.run([python, "-c", "import " + ", ".join(modules)]).returncode == 0


@pytest.mark.parametrize("program", CORPUS, ids=lambda p: p.name)
def test_corpus_runs_under_the_allowlist(sandbox, program):
    if not _has(sandbox.python, program.needs):
        pytest.skip(f"{sandbox.python} lacks {program.needs}: bash scripts/lib/install_sandbox.sh installs them")
    r = asyncio.run(sandbox.run(program.code, stdin="a line\n"))
    assert r.status == Status.OK and "CORPUS OK" in r.stdout, r
