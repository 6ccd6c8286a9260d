"""Files written whole or not at all, and durably: the one way the server replaces a
file that must survive a crash (a document job's state, the DeepL usage counts),
and the lock that keeps such files to one server.

A temporary file in the same folder is written, flushed and fsynced, then
`os.replace` makes it the file, then the folder is fsynced so that the rename
itself is on disk. A failure at any step leaves the old file as it was.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
from pathlib import Path
from typing import IO


def write_atomically(path: Path, data: bytes) -> None:
    """`data` at `path`, whole or not at all, and durably: the bytes reach the disk
    before the rename makes them the file, and the rename before this returns."""
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    sync_folder(path.parent)


def sync_folder(folder: Path) -> None:
    """The folder's entries (a rename, a new file) on disk (POSIX: fsync the folder)."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def lock_exclusively(path: Path) -> IO[bytes] | None:
    """An exclusive advisory lock on `path` (created if missing), held while the file
    returned stays open (closing it releases the lock, as does the process's end);
    None when another process holds it. OSError when it cannot be opened."""
    handle = path.open("ab")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        return None
    return handle
