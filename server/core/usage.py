"""Characters used per account (DeepL's /v2/usage and its 456 quota), in memory or
kept in a file (`--usage-file`) so that a restart neither forgets nor resets them.

The counts in memory are the truth; the file follows them. A writer thread writes
the file at most once per `USAGE_FLUSH_INTERVAL_S` when something changed, and once more
at stop, so a request never waits on the disk. Each write is whole or not at all
(durable.py). What a crash (not a stop) can lose: the counts of the last interval.
A request in flight at a crash stays counted (its refund never came), never the
other way round.

    {"format": "seq2serve-usage", "version": 1, "period": "monthly",
     "period_start": "2026-11-01", "counts": {"key-sha256:…": 18}}

Counting periods (`--usage-period`): `never` (one count for ever, the default) or
`monthly`, which starts every count again at 0 on `--usage-reset-day` of each
month (UTC), as DeepL's billing period does. Counts from a period that is over
(the file's `period_start` is not the current one) start at 0 when read.

Only keys' accounts (`key_account`) are kept in the file: a client without a key
has no quota (its count is what /v2/usage shows it), so the counts of client
addresses stay in memory, where a restart starts them at 0, and the file never grows
with the number of addresses a public server sees.

The file is one server's: a lock beside it (`.NAME.lock`, flock) refuses a second
server on the same file, whose writes would undo the first's.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import hashlib
import json
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from seq2serve.server.config import USAGE_FLUSH_INTERVAL_S, USAGE_PERIODS
from seq2serve.server.core.durable import lock_exclusively, write_atomically

log = logging.getLogger("seq2serve.server.usage")

FORMAT = "seq2serve-usage"
VERSION = 1

Clock = Callable[[], dt.datetime]
KEY_ACCOUNT = "key-sha256:"  # the accounts kept in the file: keys', by their SHA-256


def key_account(key: str) -> str:
    """A key's account: the key's SHA-256 only, so the file is not a copy of the keys."""
    return KEY_ACCOUNT + hashlib.sha256(key.encode()).hexdigest()


class UsageFileError(Exception):
    """The usage file cannot be used; the message names the file and what is wrong."""


def utc_now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def period_start(period: str, reset_day: int, now: dt.datetime) -> dt.date | None:
    """The day the counting period holding `now` began; None: one period for ever."""
    if period == "never":
        return None
    if now.day >= reset_day:
        return dt.date(now.year, now.month, reset_day)
    year, month = (now.year, now.month - 1) if now.month > 1 else (now.year - 1, 12)
    return dt.date(year, month, reset_day)


@dataclass(frozen=True)
class Reservation:
    """Characters counted for a request, to be given back exactly if it fails."""
    account: str
    characters: int
    period_start: dt.date | None


class UsageLedger:
    """Characters per account in the current counting period; `path` None: in memory
    only (a restart starts every count at 0)."""

    def __init__(self, path: Path | None = None, period: str = "never", reset_day: int = 1,
                 clock: Clock = utc_now) -> None:
        if period not in USAGE_PERIODS:
            raise ValueError(f"period must be one of {', '.join(USAGE_PERIODS)}, got {period!r}")
        self.path, self.period, self.reset_day, self._clock = path, period, reset_day, clock
        self._lock = threading.Lock()  # the counts: the event loop and the writer
        self._write_lock = threading.Lock()  # one write of the file at a time
        self._counts: dict[str, int] = {}  # keys' accounts: kept in the file
        self._transient: dict[str, int] = {}  # every other account: in memory only
        self._start = self._current_start()
        self._changes = self._written = 0
        self._stop = threading.Event()
        self._writer: threading.Thread | None = None
        self._file_lock: IO[bytes] | None = None
        if path is not None:
            self._take_file_lock(path)
            try:
                self._load(path)
            except BaseException:
                self._release()  # never written: a file that cannot be read stays as it is
                raise

    # -- counting (called on the event loop: memory only, never the disk) --------------

    def used(self, account: str) -> int:
        with self._lock:
            self._roll()
            return self._book(account).get(account, 0)

    def reserve(self, account: str, characters: int, limit: int) -> Reservation | None:
        """Count `characters` on `account` and return the reservation, or None (nothing
        counted) when they would take it past `limit`."""
        with self._lock:
            self._roll()
            book = self._book(account)
            used = book.get(account, 0)
            if used + characters > limit:
                return None
            book[account] = used + characters
            self._changes += book is self._counts
            return Reservation(account, characters, self._start)

    def refund(self, reservation: Reservation) -> None:
        """Give back what a failed request reserved: exactly it, in the period it was
        counted in (a period that ended since has already started again at 0)."""
        with self._lock:
            self._roll()
            if reservation.period_start != self._start or reservation.characters == 0:
                return
            book = self._book(reservation.account)
            left = book.get(reservation.account, 0) - reservation.characters
            if left > 0:
                book[reservation.account] = left
            else:
                book.pop(reservation.account, None)
            self._changes += book is self._counts

    def _book(self, account: str) -> dict[str, int]:
        """Where an account's count lives: the file's counts for a key, else memory."""
        return self._counts if account.startswith(KEY_ACCOUNT) else self._transient

    def _roll(self) -> None:
        """Start every count again when the counting period has changed (lock held)."""
        start = self._current_start()
        if start != self._start:
            log.info("usage period began %s: every account's count starts at 0", start)
            self._start, self._counts, self._transient = start, {}, {}
            self._changes += 1

    def _current_start(self) -> dt.date | None:
        return period_start(self.period, self.reset_day, self._clock())

    # -- the file ----------------------------------------------------------------------

    def _take_file_lock(self, path: Path) -> None:
        lock_path = path.with_name(f".{path.name}.lock")
        try:
            self._file_lock = lock_exclusively(lock_path)
        except OSError as e:
            raise UsageFileError(f"{path}: cannot open its lock file {lock_path}: "
                                 f"{e.strerror}") from None
        if self._file_lock is None:
            raise UsageFileError(f"{path}: another server uses this file (each server "
                                 "needs its own usage file)")

    def _load(self, path: Path) -> None:
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            log.info("usage counts: %s does not exist yet; every count starts at 0", path)
            return
        except OSError as e:
            raise UsageFileError(f"{path}: cannot be read: {e.strerror}") from None
        try:
            data = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise UsageFileError(f"{path}: not a usage file (not UTF-8 JSON: {e})") from None
        counts, start = _parse(path, data)
        if start != self._start:
            log.info("usage counts in %s are of the period that began %s; the current one "
                     "began %s: every count starts at 0", path, start or "never",
                     self._start or "never")
            self._changes += 1  # the file says the new period at the first write
            return
        self._counts = counts

    def _encode(self, counts: dict[str, int], start: dt.date | None) -> bytes:
        return json.dumps({"format": FORMAT, "version": VERSION, "period": self.period,
                           "period_start": start.isoformat() if start else None,
                           "counts": dict(sorted(counts.items()))},
                          indent=1).encode("utf-8") + b"\n"

    def flush(self) -> None:
        """Write the counts if they changed since the last write (OSError on failure,
        the counts then written at the next flush)."""
        if self.path is None:
            return
        with self._write_lock:
            with self._lock:
                self._roll()
                if self._written == self._changes:
                    return
                # A copy under the lock; encoded outside it, so the event loop's
                # counting never waits on the encoding of many accounts.
                changes, counts, start = self._changes, dict(self._counts), self._start
            write_atomically(self.path, self._encode(counts, start))
            self._written = changes

    def _run(self) -> None:
        failing = False
        while not self._stop.wait(USAGE_FLUSH_INTERVAL_S):
            try:
                self.flush()
            except OSError as e:
                if not failing:  # once per failure, not once a second
                    log.error("cannot write the usage counts to %s (retried every %gs): %s",
                              self.path, USAGE_FLUSH_INTERVAL_S, e)
                failing = True
            else:
                failing = False

    # -- a part of the server's lifecycle (lifecycle.py) -------------------------------

    async def start(self) -> None:
        if self.path is not None and self._writer is None:
            self._stop.clear()
            self._writer = threading.Thread(target=self._run, name="usage-writer",
                                            daemon=True)
            self._writer.start()

    async def stop(self, grace: float) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self.close)

    def close(self) -> None:
        """Stop the writer, write what changed, release the file."""
        self._stop.set()
        if self._writer is not None:
            self._writer.join()
            self._writer = None
        try:
            if self._file_lock is not None:
                try:
                    self.flush()
                except OSError as e:
                    log.error("cannot write the usage counts to %s at stop: %s", self.path, e)
        finally:
            self._release()

    def _release(self) -> None:
        if self._file_lock is not None:
            with contextlib.suppress(OSError):
                self._file_lock.close()  # releases the flock
            self._file_lock = None


def _parse(path: Path, data: object) -> tuple[dict[str, int], dt.date | None]:
    """The counts and period start of a usage file's JSON, or UsageFileError."""
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise UsageFileError(f"{path}: not a usage file (no \"format\": \"{FORMAT}\")")
    if data.get("version") != VERSION:
        raise UsageFileError(f"{path}: usage file version {data.get('version')!r}; this "
                             f"server reads version {VERSION}")
    counts = data.get("counts")
    if not isinstance(counts, dict) or not all(
            isinstance(k, str) and type(v) is int and v >= 0 for k, v in counts.items()):
        raise UsageFileError(f"{path}: \"counts\" must map each account to a whole number "
                             ">= 0")
    start = data.get("period_start")
    if start is None:
        return dict(counts), None
    try:
        return dict(counts), dt.date.fromisoformat(str(start))
    except ValueError:
        raise UsageFileError(f"{path}: \"period_start\" must be a date (YYYY-MM-DD) or "
                             f"null, got {start!r}") from None
