"""Files written whole or not at all, and durably: the one way the server replaces a
file that must survive a crash (a document job's state, the DeepL usage counts).

A temporary file in the same folder is written, flushed and fsynced, then
`os.replace` makes it the file, then the folder is fsynced so that the rename
itself is on disk. A failure at any step leaves the old file as it was.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


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
