"""A scratch directory on the host's disk, measured while a program runs and removed after it, whatever the program
did to it (the landlock sandbox's, where no size-capped mount can be had: not root).

Both walk by file descriptor (``openat`` from the directory above), never by path: a tree deeper than ``PATH_MAX``
is no obstacle, and nothing recurses in Python. The program runs as the supervisor's uid, so it can take read or
search permission off its own directories: the measure then refuses (:class:`Unmeasurable`, which ends the run
as ``disk_limit``) instead of counting what it can see, and the removal gives each directory back its owner's
rights before it empties it.
"""
from __future__ import annotations

import errno
import os

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
MAX_DEPTH = 128  # deeper nesting ends the run: the walk holds one descriptor per level


class Unmeasurable(Exception):
    """The program made part of its scratch directory impossible to measure (no read or search right, too deep)."""


def measure(path: str) -> tuple[int, int]:
    """(bytes allocated, entries) below ``path``; what vanishes while walking is not counted (the next poll sees
    where it went). Raises :class:`Unmeasurable`."""
    total, count = 0, 0
    stack: list[tuple[int, list[str]]] = []  # (descriptor, subdirectories still to walk) per level
    fd = -1
    try:
        fd = os.open(path, DIR_FLAGS)
        while fd >= 0:
            subdirs = []
            for entry in _entries(fd):
                count += 1
                try:
                    st = entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                total += st.st_blocks * 512
                if entry.is_dir(follow_symlinks=False):
                    subdirs.append(entry.name)
            stack.append((fd, subdirs))
            fd = -1
            while stack and fd < 0:
                parent, names = stack[-1]
                if not names:
                    os.close(stack.pop()[0])
                elif len(stack) > MAX_DEPTH:
                    raise Unmeasurable(f"the scratch directory is nested deeper than {MAX_DEPTH} levels")
                else:
                    try:
                        fd = os.open(names.pop(), DIR_FLAGS, dir_fd=parent)
                    except (FileNotFoundError, NotADirectoryError):
                        pass
        return total, count
    except PermissionError as e:
        raise Unmeasurable(f"the program took the read or search right off a directory of its scratch ({e})") from e
    except OSError as e:
        raise Unmeasurable(f"the scratch directory cannot be measured ({e})") from e
    finally:
        for d in [fd] * (fd >= 0) + [d for d, _ in stack]:
            os.close(d)


def _entries(fd: int) -> list[os.DirEntry]:
    with os.scandir(fd) as it:
        return list(it)


def remove(path: str) -> str | None:
    """Remove ``path`` and everything below it, depth and permissions notwithstanding (the program has ended: nothing
    moves under the walk); one descriptor at a time. None when it is gone, else the line saying what is left."""
    cur, names = -1, []
    try:
        os.chmod(path, 0o700)
        cur = os.open(path, DIR_FLAGS)
        while True:
            sub = None
            for entry in _entries(cur):
                if entry.is_dir(follow_symlinks=False):
                    sub = sub or entry.name
                else:
                    _unlink(entry.name, cur)
            if sub is not None:
                os.chmod(sub, 0o700, dir_fd=cur)
                down = os.open(sub, DIR_FLAGS, dir_fd=cur)
                os.close(cur)
                cur = down
                names.append(sub)
                continue
            if not names:
                break
            up = os.open("..", DIR_FLAGS, dir_fd=cur)
            os.close(cur)
            cur = up
            os.rmdir(names.pop(), dir_fd=cur)
        os.close(cur)
        cur = -1
        os.rmdir(path)
    except FileNotFoundError:
        if not os.path.lexists(path):
            return None
        return f"cannot remove the scratch directory {path}: something vanished under the removal"
    except OSError as e:
        return f"cannot remove the scratch directory {path}: {e}"
    finally:
        if cur >= 0:
            os.close(cur)
    return None


def _unlink(name: str, dir_fd: int) -> None:
    try:
        os.unlink(name, dir_fd=dir_fd)
    except OSError as e:
        if e.errno != errno.ENOENT:
            raise
