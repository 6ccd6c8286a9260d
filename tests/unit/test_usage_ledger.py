"""DeepL's usage counts kept in a file (core/usage.py): read back after a restart,
refunds exact, a broken file refused (never reset), writes whole or not at all,
counting periods. The clock is a stand-in: nothing here waits on the wall clock."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
from pathlib import Path

import pytest

from seq2serve.server.api.http.access import Access
from seq2serve.server.api.http.deepl_auth import DeepLAccess, QuotaExceeded
from seq2serve.server.core import durable
from seq2serve.server.core.usage import UsageFileError, UsageLedger, key_account, period_start


class Clock:
    def __init__(self, when: dt.datetime) -> None:
        self.now = when

    def __call__(self) -> dt.datetime:
        return self.now


def at(year: int, month: int, day: int) -> dt.datetime:
    return dt.datetime(year, month, day, 12, tzinfo=dt.timezone.utc)


def test_counts_are_read_back_after_a_restart_and_keys_are_not_written(tmp_path: Path) -> None:
    path = tmp_path / "usage.json"
    door = DeepLAccess(Access(keys=["secret-key"], char_limits={"secret-key": 100}),
                       UsageLedger(path))
    caller = door.access.admit("10.0.0.1", None, "secret-key")
    door.reserve(caller, 30)
    door.ledger.close()  # a stop: the last counts written
    assert "secret-key" not in path.read_text("utf-8")  # kept as its SHA-256 only
    again = DeepLAccess(door.access, UsageLedger(path))
    assert again.usage(caller).character_count == 30
    with pytest.raises(QuotaExceeded, match="used 30 of its 100 characters"):
        again.reserve(caller, 71)
    again.ledger.close()


def test_a_refund_is_exact_across_writes_and_restarts(tmp_path: Path) -> None:
    path = tmp_path / "usage.json"
    ledger = UsageLedger(path)
    kept = ledger.reserve("key-sha256:a", 10, 100)
    failed = ledger.reserve("key-sha256:a", 7, 100)
    assert kept is not None and failed is not None
    ledger.flush()  # the failed request's characters are on disk for now
    assert json.loads(path.read_text("utf-8"))["counts"] == {"key-sha256:a": 17}
    ledger.refund(failed)
    ledger.close()
    assert UsageLedger(path).used("key-sha256:a") == 10


@pytest.mark.parametrize("content", [b"{not json", b"", b"\xff\xfe",
                                     b'{"format": "seq2serve-usage", "version": 1, '
                                     b'"counts": {"k": -3}}',
                                     b'{"format": "other", "version": 1, "counts": {}}',
                                     b'{"format": "seq2serve-usage", "version": 9, '
                                     b'"counts": {}}'])
def test_a_broken_file_is_refused_naming_it_and_left_as_it_was(tmp_path: Path,
                                                               content: bytes) -> None:
    path = tmp_path / "usage.json"
    path.write_bytes(content)
    with pytest.raises(UsageFileError, match=str(path)):
        UsageLedger(path)
    assert path.read_bytes() == content  # never overwritten with zeros
    path.unlink()
    UsageLedger(path).close()  # the refused one's lock was released


def test_a_second_server_on_the_same_file_is_refused(tmp_path: Path) -> None:
    first = UsageLedger(tmp_path / "usage.json")
    with pytest.raises(UsageFileError, match="another server uses this file"):
        UsageLedger(tmp_path / "usage.json")
    first.close()
    UsageLedger(tmp_path / "usage.json").close()


def test_a_write_that_fails_before_its_rename_leaves_the_old_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "usage.json"
    ledger = UsageLedger(path)
    assert ledger.reserve("key-sha256:d", 5, 100) is not None
    ledger.flush()
    before = path.read_bytes()
    assert ledger.reserve("key-sha256:d", 6, 100) is not None

    def fail(source: object, destination: object) -> None:
        raise OSError("injected between write and rename")

    monkeypatch.setattr(durable.os, "replace", fail)
    with pytest.raises(OSError, match="injected"):
        ledger.flush()
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == [".usage.json.lock", "usage.json"]
    ledger.flush()  # what failed is written at the next flush
    ledger.close()
    assert UsageLedger(path).used("key-sha256:d") == 11


def test_the_writer_thread_writes_and_the_stop_writes_the_last_counts(tmp_path: Path) -> None:
    path = tmp_path / "usage.json"

    async def serve() -> None:
        ledger = UsageLedger(path)
        await ledger.start()
        assert ledger.reserve("key-sha256:b", 4, 10) is not None
        await ledger.stop(grace=0.0)

    asyncio.run(serve())
    assert UsageLedger(path).used("key-sha256:b") == 4


@pytest.mark.parametrize(("now", "day", "start"), [
    (at(2026, 11, 28), 1, dt.date(2026, 11, 1)),
    (at(2026, 11, 14), 15, dt.date(2026, 10, 15)),
    (at(2026, 11, 15), 15, dt.date(2026, 11, 15)),
    (at(2026, 1, 3), 28, dt.date(2025, 12, 28)),
])
def test_a_monthly_period_begins_on_its_reset_day(now: dt.datetime, day: int,
                                                  start: dt.date) -> None:
    assert period_start("monthly", day, now) == start
    assert period_start("never", day, now) is None


def test_monthly_counts_start_again_and_old_refunds_do_not_reach_the_new_period(
        tmp_path: Path) -> None:
    path, clock = tmp_path / "usage.json", Clock(at(2026, 11, 28))
    ledger = UsageLedger(path, "monthly", 1, clock=clock)
    old = ledger.reserve("key-sha256:c", 40, 40)
    assert old is not None and ledger.reserve("key-sha256:c", 1, 40) is None  # 456
    ledger.close()
    assert UsageLedger(path, "monthly", 1, clock=clock).used("key-sha256:c") == 40
    clock.now = at(2026, 12, 1)
    ledger = UsageLedger(path, "monthly", 1, clock=clock)  # the file's period is over
    assert ledger.used("key-sha256:c") == 0
    new = ledger.reserve("key-sha256:c", 25, 40)
    assert new is not None
    ledger.refund(old)  # reserved in November: December's count is not touched
    assert ledger.used("key-sha256:c") == 25
    clock.now = at(2027, 1, 2)  # a period turns while the server runs
    assert ledger.used("key-sha256:c") == 0
    ledger.close()
    assert json.loads(path.read_text("utf-8"))["period_start"] == "2027-01-01"


def test_the_writer_logs_a_failed_write_once_and_writes_when_the_disk_is_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
        ) -> None:
    import threading

    from seq2serve.server.core import usage

    path = tmp_path / "usage.json"
    monkeypatch.setattr(usage, "USAGE_FLUSH_INTERVAL_S", 0.001)
    replace, failures, written = durable.os.replace, [], threading.Event()

    def flaky(source: str, destination: str) -> None:
        if len(failures) < 3:  # three writes fail, then the disk is back
            failures.append(destination)
            raise OSError(28, "No space left on device")
        replace(source, destination)
        written.set()

    monkeypatch.setattr(durable.os, "replace", flaky)

    async def serve() -> None:
        ledger = UsageLedger(path)
        await ledger.start()
        assert ledger.reserve("key-sha256:e", 3, 10) is not None
        assert await asyncio.to_thread(written.wait, 60)  # a bound, not a measurement
        await ledger.stop(grace=0.0)

    asyncio.run(serve())
    assert len(failures) == 3
    logged = [r.getMessage() for r in caplog.records if "cannot write" in r.getMessage()]
    assert len(logged) == 1 and str(path) in logged[0] and "No space" in logged[0]
    monkeypatch.undo()
    assert UsageLedger(path).used("key-sha256:e") == 3


def test_only_keys_accounts_are_kept_in_the_file(tmp_path: Path) -> None:
    """Addresses' counts (no key: no quota) stay in memory: the file never grows with
    the addresses a public server sees, and a restart starts them at 0."""
    path = tmp_path / "usage.json"
    ledger = UsageLedger(path)
    key = key_account("secret-key")
    assert ledger.reserve(key, 5, 100) is not None
    for i in range(50):
        assert ledger.reserve(f"ip:10.0.0.{i}", 3, 100) is not None
    assert ledger.used("ip:10.0.0.7") == 3
    ledger.close()
    counts = json.loads(path.read_text())["counts"]
    assert counts == {key: 5} and "secret-key" not in path.read_text()
    again = UsageLedger(path)
    assert (again.used(key), again.used("ip:10.0.0.7")) == (5, 0)
    again.close()
