"""What a killed process leaves behind, and how the next one clears it away.

A temporary file or folder that outlives its process when that process is killed (SIGKILL, or a
signal Python doesn't handle, which skips `atexit`) carries its owner in its name: `owner_tag()`,
`<pid>-<start>`, where start is when that process started, in clock ticks since boot (Linux's
/proc/PID/stat; 0 where there is no /proc). Once the owner has ended anyone may remove the entry;
a later process that was given the same pid has another start, so it is never taken for the owner.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import stat


def _proc_stat(pid: int) -> list[bytes] | None:
    """The fields of /proc/PID/stat after the command name (the state first), or None if unreadable."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _start(pid: int) -> int:
    fields = _proc_stat(pid)
    return int(fields[19]) if fields is not None and len(fields) > 19 else 0


def owner_tag() -> str:
    """This process, as leftovers name their owner."""
    return f"{os.getpid()}-{_start(os.getpid())}"


def owner_alive(pid: int, start: int) -> bool:
    """Whether the process that `owner_tag()` named `<pid>-<start>` is still running. A zombie has
    ended; where /proc can't tell (start 0, or no /proc), any process with that pid counts."""
    if pid <= 0:
        return False
    fields = _proc_stat(pid)
    if fields is not None:
        return fields[0] != b"Z" and (start == 0 or int(fields[19]) == start)
    try:  # no /proc: any process with that pid counts
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True


_PF_EXITING = 0x4  # /proc/PID/stat's flags: the process is exiting


def ending(pid: int) -> bool:
    """Whether process `pid` has ended or is being killed: exiting, or with SIGKILL or a SIGTERM it
    doesn't catch already sent to it (as to every process of its group at once). Linux's /proc;
    elsewhere, whether it has ended."""
    fields = _proc_stat(pid)
    if fields is None:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False
    if fields[0] in (b"Z", b"X") or int(fields[6]) & _PF_EXITING:
        return True
    try:
        with open(f"/proc/{pid}/status") as f:
            masks = {key: int(value, 16) for key, _, value in (line.partition(":") for line in f)
                     if key in ("SigPnd", "ShdPnd", "SigIgn", "SigCgt")}
    except (OSError, ValueError):
        return False
    pending, handled = masks["SigPnd"] | masks["ShdPnd"], masks["SigIgn"] | masks["SigCgt"]
    kill, term = 1 << (signal.SIGKILL - 1), 1 << (signal.SIGTERM - 1)
    return bool(pending & kill or pending & term & ~handled)


def preallocated_file(path: str, size: int) -> int:
    """Make `path`, which must not exist (never through a symlink), mode 0600, with all of its `size`
    bytes allocated now, and return it open for reading and writing. On a full /dev/shm this raises
    OSError (ENOSPC) here, where a file merely truncated to size would kill whoever first writes into
    its mapping with SIGBUS. Nothing is left behind when it raises."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.posix_fallocate(fd, 0, size)
    except BaseException:
        os.close(fd)
        os.unlink(path)
        raise
    return fd


def sweep(folder: str, pattern: re.Pattern[str], folders: bool) -> list[str]:
    """Remove the entries of `folder` whose names `pattern` matches in full (with groups `pid` and
    `start`) and whose owner has ended: folders if `folders`, else files; never a symlink, never
    another user's. Returns the paths removed. Errors are skipped: another process may be sweeping
    the same entries."""
    removed = []
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return removed
    for entry in entries:
        found = pattern.fullmatch(entry.name)
        if found is None or owner_alive(int(found["pid"]), int(found["start"])):
            continue
        try:
            info = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if info.st_uid != os.getuid() or not (stat.S_ISDIR if folders else stat.S_ISREG)(info.st_mode):
            continue
        try:
            shutil.rmtree(entry.path) if folders else os.unlink(entry.path)
        except OSError:
            continue
        removed.append(entry.path)
    return removed
