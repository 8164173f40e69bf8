"""What a killed process leaves behind, and how the next one clears it away.

A temporary file or folder that outlives its process when that process is killed (SIGKILL, or a
signal Python doesn't handle, which skips `atexit`) carries its owner in its name: `owner_tag()`,
`<pid>-<start>`, where start is when that process started, in clock ticks since boot (Linux's
/proc/PID/stat; 0 where there is no /proc). Once the owner has ended anyone may remove the entry;
a later process that was given the same pid has another start, so it is never taken for the owner.

Such names sit in folders that other users share (/tmp, /dev/shm, a save's folder), so anyone may
plant one: a sweep looks only at entries this user owns (by lstat, never following a symlink), reads
the owner from a name as a guess that may be wrong, and never raises. A temporary file that is to
replace a target (`temp_beside`) is created exclusively under a name no one can predict.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import shutil
import signal
import stat

PID_LIMIT = 2**31 - 1  # pid_t's largest: no process has a pid above it


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
    if not 0 < pid <= PID_LIMIT:  # no process has it (and os.kill would overflow)
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


def _owner(found: re.Match[str]) -> tuple[int, int] | None:
    """The `<pid>-<start>` that a matched name gives, or None where no process of ours could have
    made it (digits other than ASCII's, a pid out of range, a start too long for /proc's)."""
    pid, start = found["pid"], found["start"]
    if not (pid.isascii() and pid.isdigit() and start.isascii() and start.isdigit() and len(start) <= 20):
        return None
    if len(pid) > len(str(PID_LIMIT)) or not 0 < int(pid) <= PID_LIMIT:
        return None
    return int(pid), int(start)


def _stale(entry: os.DirEntry[str], pattern: re.Pattern[str], folders: bool) -> bool:
    """Whether `entry` is this user's leftover to remove: ours (by lstat, so a symlink is never
    followed, and checked before anything else), a folder if `folders`, else a plain file, with a
    name `pattern` matches in full that names an owner that has ended."""
    found = pattern.fullmatch(entry.name)
    if found is None:
        return False
    info = entry.stat(follow_symlinks=False)
    if info.st_uid != os.getuid() or not (stat.S_ISDIR if folders else stat.S_ISREG)(info.st_mode):
        return False
    owner = _owner(found)
    return owner is not None and not owner_alive(*owner)


def sweep(folder: str, pattern: re.Pattern[str], folders: bool) -> list[str]:
    """Remove the entries of `folder` whose names `pattern` matches in full (with groups `pid` and
    `start`) and whose owner has ended: folders if `folders`, else files; never a symlink, never
    another user's. Returns the paths removed. It never raises on what it finds: an entry it can't
    read or remove is skipped (another process may be sweeping the same entries, or another user
    may have planted it), so that no one else's files can stop a start."""
    removed: list[str] = []
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return removed
    for entry in entries:
        try:
            if not _stale(entry, pattern, folders):
                continue
            shutil.rmtree(entry.path) if folders else os.unlink(entry.path)
        except (OSError, ValueError, OverflowError):
            continue
        removed.append(entry.path)
    return removed


# A temporary file beside the file it is to replace (`temp_beside`): `.<target's name>.<owner>.<random>.tmp`.
TEMP_NAME = re.compile(r"\..+\.(?P<pid>[0-9]+)-(?P<start>[0-9]+)\.[0-9a-f]{12}\.tmp")


def temp_name(target: str) -> str:
    """A name no one can predict for a temporary file beside `target` (a path), which TEMP_NAME matches."""
    return f".{os.path.basename(target)}.{owner_tag()}.{secrets.token_hex(6)}.tmp"


def temp_beside(target: str, tries: int = 100) -> tuple[int, str]:
    """A new file of ours alone in `target`'s folder, for data that is then to replace `target`:
    created exclusively (O_EXCL: never through a name someone planted, symlinks included) under
    `temp_name`, with the mode a new file gets (0666 less the umask). Returns it open for reading
    and writing, and its path. The temporary files of ended processes in that folder go first."""
    folder = os.path.dirname(os.path.abspath(target))
    sweep(folder, TEMP_NAME, folders=False)
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    for _ in range(tries):
        path = os.path.join(folder, temp_name(target))
        try:
            return os.open(path, flags, 0o666), path
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, f"no free name for a temporary file beside {target}", folder)


def write_whole(target: str, data: bytes) -> None:
    """Write `data` to `target` so that it is always its old file or the whole new one: into a
    `temp_beside` file, then os.replace. The temporary file is removed on every failure (a full
    disk included), and a symlink at `target` is replaced, never followed."""
    fd, tmp = temp_beside(target)
    try:
        with open(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
