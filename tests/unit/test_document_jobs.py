"""Document jobs (core/documents/jobs.py, jobstore.py) with a stand-in runner: state on
disk, a restart takes every unfinished job up again or fails it with a reason (none
vanishes), the byte budget, the time-to-live, one download for DeepL's door."""

from __future__ import annotations

import asyncio
import json
import os
import stat
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from seq2serve.server.core import durable
from seq2serve.server.core.documents.jobs import MAX_ATTEMPTS, DocumentJobs, Outcome
from seq2serve.server.core.documents.jobstore import (
    JOB_OVERHEAD_BYTES,
    JobState,
    JobStore,
    Order,
    Record,
)
from seq2serve.server.core.documents.queueing import Progress
from seq2serve.server.core.errors import (
    ErrorKind,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
)

ORDER = Order(name="a.txt", target_language="de", source_language="en")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def upper(gate: asyncio.Event | None = None) -> Callable[[Order, bytes, Progress],
                                                          Awaitable[Outcome]]:
    """A runner that "translates" to upper case, reporting progress per line; it waits
    for `gate` (if given) after the first line."""

    async def run(order: Order, data: bytes, progress: Progress) -> Outcome:
        lines = data.decode().splitlines()
        progress(0, len(lines))
        for i, _ in enumerate(lines):
            progress(i + 1, len(lines))
            if gate is not None and i == 0:
                await gate.wait()
        return Outcome(data=data.upper(), name=order.name, billed_characters=len(data),
                       report=f"{len(lines)} lines")

    return run


def jobs_in(folder: Path, clock: Clock | None = None, max_bytes: int = 10**6,
            runner: Callable[..., Awaitable[Outcome]] | None = None) -> DocumentJobs:
    jobs = DocumentJobs(folder, max_bytes=max_bytes, ttl_s=60.0, workers=1,
                        clock=clock or Clock())
    jobs.attach(runner or upper())
    return jobs


async def first_line_done(jobs: DocumentJobs, job_id: str) -> None:
    """Until the job has translated a line (its state and upload are read off the
    event loop, in a thread): a bounded poll on its state."""
    for _ in range(2000):
        if jobs.view(job_id, "v1").done:
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"job {job_id} translated nothing: {jobs.view(job_id, 'v1')}")


def state_of(folder: Path, job_id: str) -> dict[str, object]:
    loaded: dict[str, object] = json.loads((folder / job_id / "state.json").read_text())
    return loaded


def test_a_job_runs_and_its_file_and_state_are_on_disk(tmp_path: Path) -> None:
    async def main() -> None:
        jobs = jobs_in(tmp_path)
        await jobs.start()
        record = await jobs.submit(ORDER, b"one\ntwo\n")
        assert state_of(tmp_path, record.id)["state"] == "queued"
        view = await jobs.wait(record.id, "v1")
        assert (view.state, view.done, view.total) == (JobState.DONE, 0, 0)  # live: gone
        assert view.billed_characters == 8 and view.report == "2 lines"
        assert await jobs.output(record.id, "v1") == (b"ONE\nTWO\n", "a.txt")
        assert state_of(tmp_path, record.id)["state"] == "done"
        assert not (tmp_path / record.id / "input").exists()  # only the output is kept
        with pytest.raises(NotFound):
            jobs.view(record.id, "deepl")  # another door's job is no job there
        await jobs.stop(0)

    asyncio.run(main())


def test_progress_and_an_estimate_while_translating(tmp_path: Path) -> None:
    async def main() -> None:
        clock, gate = Clock(), asyncio.Event()
        jobs = jobs_in(tmp_path, clock, runner=upper(gate))
        await jobs.start()
        record = await jobs.submit(ORDER, b"a\nb\nc\nd\n")
        await first_line_done(jobs, record.id)
        clock.now += 6.0  # one of four lines in 6 s: three more take about 18 s
        view = jobs.view(record.id, "v1")
        assert (view.state, view.done, view.total) == (JobState.TRANSLATING, 1, 4)
        assert view.seconds_remaining == 18
        gate.set()
        assert (await jobs.wait(record.id, "v1")).state is JobState.DONE
        await jobs.stop(0)

    asyncio.run(main())


def test_a_failed_run_is_an_error_with_its_reason(tmp_path: Path) -> None:
    async def refuse(order: Order, data: bytes, progress: Progress) -> Outcome:
        raise InvalidArgument("a.txt is not UTF-8 text (byte 0)")

    async def main() -> None:
        jobs = jobs_in(tmp_path, runner=refuse)
        await jobs.start()
        record = await jobs.submit(ORDER, b"\xff")
        view = await jobs.wait(record.id, "v1")
        assert (view.state, view.error_kind) == (JobState.ERROR, "INVALID_ARGUMENT")
        error = view.error()
        assert error.kind is ErrorKind.INVALID_ARGUMENT
        assert error.message == "a.txt is not UTF-8 text (byte 0)"
        with pytest.raises(NotFound):
            await jobs.output(record.id, "v1")
        await jobs.stop(0)

    asyncio.run(main())


def test_a_job_in_progress_at_a_stop_runs_again_at_the_next_start(tmp_path: Path) -> None:
    async def first() -> str:
        gate = asyncio.Event()  # never set: the stop comes mid-job
        jobs = jobs_in(tmp_path, runner=upper(gate))
        await jobs.start()
        record = await jobs.submit(ORDER, b"one\ntwo\n")
        queued = await jobs.submit(ORDER, b"three\n")  # never picked: one worker
        await first_line_done(jobs, record.id)
        await jobs.stop(0)
        assert state_of(tmp_path, record.id)["state"] == "translating"
        assert state_of(tmp_path, queued.id)["state"] == "queued"
        return record.id + " " + queued.id

    async def second(ids: str) -> None:
        jobs = jobs_in(tmp_path)
        await jobs.start()
        for job_id, out in zip(ids.split(), (b"ONE\nTWO\n", b"THREE\n"), strict=True):
            view = await jobs.wait(job_id, "v1")
            assert view.state is JobState.DONE
            assert (await jobs.output(job_id, "v1"))[0] == out
        assert any("stopped while translating" in n for n in jobs.view(ids.split()[0],
                                                                          "v1").notes)
        await jobs.stop(0)

    asyncio.run(second(asyncio.run(first())))


def test_a_job_that_stopped_the_server_each_time_is_failed_not_run_again(
        tmp_path: Path) -> None:
    jobs = jobs_in(tmp_path)
    record = asyncio.run(jobs.submit(ORDER, b"one\n"))
    record.state, record.attempts = JobState.TRANSLATING, MAX_ATTEMPTS
    jobs.store.save(record)
    jobs.close()
    again = jobs_in(tmp_path)
    view = again.view(record.id, "v1")
    assert view.state is JobState.ERROR
    assert f"stopped {MAX_ATTEMPTS} times" in view.error_message
    again.close()


def test_a_job_whose_upload_is_gone_is_failed_with_that_reason(tmp_path: Path) -> None:
    jobs = jobs_in(tmp_path)
    record = asyncio.run(jobs.submit(ORDER, b"one\n"))
    jobs.close()
    (tmp_path / record.id / "input").unlink()
    again = jobs_in(tmp_path)
    view = again.view(record.id, "v1")
    assert view.state is JobState.ERROR and "missing" in view.error_message
    again.close()


def test_the_byte_budget_refuses_a_job_naming_the_setting(tmp_path: Path) -> None:
    data = b"x" * 1000
    need = 2 * len(data) + JOB_OVERHEAD_BYTES
    jobs = jobs_in(tmp_path, max_bytes=2 * need - 1)
    asyncio.run(jobs.submit(ORDER, data))
    with pytest.raises(ResourceExhausted, match=r"holds \d+ bytes of its \d+ .*"
                                                r"--jobs-max-bytes"):
        asyncio.run(jobs.submit(ORDER, data))
    assert len(jobs.store.records) == 1  # nothing half-made
    jobs.close()


def test_finished_jobs_expire_after_their_time_to_live(tmp_path: Path) -> None:
    async def main() -> None:
        clock = Clock()
        jobs = jobs_in(tmp_path, clock)
        await jobs.start()
        record = await jobs.submit(ORDER, b"one\n")
        await jobs.wait(record.id, "v1")
        clock.now += 59.0
        await jobs.sweep()
        assert jobs.view(record.id, "v1").state is JobState.DONE
        clock.now += 1.0
        await jobs.sweep()
        with pytest.raises(NotFound):
            jobs.view(record.id, "v1")
        assert not (tmp_path / record.id).exists()
        await jobs.stop(0)

    asyncio.run(main())


def test_a_taken_file_is_downloadable_once(tmp_path: Path) -> None:
    async def main() -> None:
        jobs = jobs_in(tmp_path)
        await jobs.start()
        record = await jobs.submit(Order(name="a.txt", target_language="de", door="deepl"),
                                   b"a\n")
        await jobs.wait(record.id, "deepl")
        assert (await jobs.take(record.id, "deepl")) == (b"A\n", "a.txt")
        with pytest.raises(NotFound):
            await jobs.take(record.id, "deepl")
        assert jobs.view(record.id, "deepl").downloaded  # the state stays until it expires
        assert not (tmp_path / record.id / "output").exists()
        await jobs.stop(0)

    asyncio.run(main())


def test_one_folder_serves_one_server(tmp_path: Path) -> None:
    jobs = jobs_in(tmp_path)
    with pytest.raises(OSError, match="in use by another server"):
        jobs_in(tmp_path)
    jobs.close()
    jobs_in(tmp_path).close()  # free again


def test_a_cancelled_job_leaves_the_folder(tmp_path: Path) -> None:
    async def main() -> None:
        jobs = jobs_in(tmp_path, runner=upper(asyncio.Event()))
        await jobs.start()
        record = await jobs.submit(ORDER, b"one\ntwo\n")
        await first_line_done(jobs, record.id)
        jobs.cancel(record.id)
        with pytest.raises(NotFound):
            jobs.view(record.id, "v1")  # at once; its folder goes off the event loop
        await asyncio.gather(*jobs._deleting)
        assert not (tmp_path / record.id).exists()
        assert jobs.store.held_bytes() == 0
        later = await jobs.submit(ORDER, b"x\n")  # the worker is free again
        jobs.attach(upper())
        assert (await jobs.wait(later.id, "v1")).state is JobState.DONE
        await jobs.stop(0)

    asyncio.run(main())


def _store_with_a_job(tmp_path: Path) -> tuple[JobStore, Record, Path]:
    store = JobStore(tmp_path / "jobs", 1 << 20)
    record = store.create(Order("a.txt", "de"), b"hello", now=1.0)
    return store, record, tmp_path / "jobs" / record.id


def test_a_state_write_that_fails_before_its_rename_leaves_the_old_state(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Whole or not at all: a failure between the write and the rename (injected at
    os.replace) leaves the last state readable, and no temporary file behind."""
    store, record, folder = _store_with_a_job(tmp_path)
    before = (folder / "state.json").read_bytes()

    def fail(source: object, destination: object) -> None:
        raise OSError("injected between write and rename")

    monkeypatch.setattr(durable.os, "replace", fail)
    record.state = JobState.TRANSLATING
    with pytest.raises(OSError, match="injected"):
        store.save(record)
    monkeypatch.undo()
    assert (folder / "state.json").read_bytes() == before
    assert sorted(p.name for p in folder.iterdir()) == ["input", "state.json"]
    store.close()
    again = JobStore(tmp_path / "jobs", 1 << 20)
    assert again.records[record.id].state is JobState.QUEUED
    again.close()


def test_a_state_write_reaches_the_disk_before_and_after_its_rename(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The new bytes are fsynced before os.replace makes them state.json, and the
    job's folder after it (so the rename itself survives a power loss)."""
    store, record, folder = _store_with_a_job(tmp_path)
    events: list[tuple[str, str]] = []
    fsync, replace = durable.os.fsync, durable.os.replace

    def record_fsync(fd: int) -> None:
        mode = os.fstat(fd).st_mode
        events.append(("fsync", "folder" if stat.S_ISDIR(mode) else
                       "file" if stat.S_ISREG(mode) else "other"))
        fsync(fd)

    def record_replace(source: str, destination: str) -> None:
        events.append(("replace", Path(destination).name))
        replace(source, destination)

    monkeypatch.setattr(durable.os, "fsync", record_fsync)
    monkeypatch.setattr(durable.os, "replace", record_replace)
    record.state = JobState.TRANSLATING
    store.save(record)
    assert events == [("fsync", "file"), ("replace", "state.json"), ("fsync", "folder")]
    assert json.loads((folder / "state.json").read_text("utf-8"))["state"] == "translating"
    store.close()


def test_the_model_that_served_a_job_is_kept_in_its_state(tmp_path: Path) -> None:
    """Named on the answers that carry the file (X-Seq2serve-Model), after a restart
    too: it is in state.json."""
    async def named(order: Order, data: bytes, progress: Progress) -> Outcome:
        return Outcome(data=data, name=order.name, billed_characters=0, report="",
                       model="opus-mt-en-de")

    async def main() -> str:
        jobs = jobs_in(tmp_path, runner=named)
        await jobs.start()
        record = await jobs.submit(ORDER, b"one\n")
        assert (await jobs.wait(record.id, "v1")).model == "opus-mt-en-de"
        await jobs.stop(0)
        return record.id

    job_id = asyncio.run(main())
    assert state_of(tmp_path, job_id)["model"] == "opus-mt-en-de"
    again = jobs_in(tmp_path)
    assert again.view(job_id, "v1").model == "opus-mt-en-de"
    again.close()


def test_a_durable_write_leaves_the_event_loop_free_and_the_job_unseen_until_done(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The upload's and the state's fsyncs (up to 32 MB) run in a thread: while one is
    held, other coroutines run; the id comes back only once the job is on disk."""
    entered, release = threading.Event(), threading.Event()
    jobs = jobs_in(tmp_path)
    write_new = jobs.store.write_new

    def held(record: Record, data: bytes, state: bytes) -> None:
        entered.set()
        assert release.wait(30), "never released"  # a hang guard only
        write_new(record, data, state)

    monkeypatch.setattr(jobs.store, "write_new", held)

    async def main() -> None:
        submit = asyncio.ensure_future(jobs.submit(ORDER, b"one\n"))
        assert await asyncio.to_thread(entered.wait, 30)
        other = asyncio.ensure_future(asyncio.sleep(0, result="answered"))
        assert await other == "answered"  # the loop runs while the write is held
        assert not submit.done()  # not durable yet: no id handed out
        release.set()
        record = await submit
        assert state_of(tmp_path, record.id)["state"] == "queued"
        assert (tmp_path / record.id / "input").read_bytes() == b"one\n"

    try:
        asyncio.run(main())
    finally:
        release.set()
        jobs.close()


def test_the_workers_state_writes_leave_the_event_loop_free(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A running job's state writes (translating, done) are in a thread too."""

    entered, release = threading.Event(), threading.Event()

    async def main() -> None:
        jobs = jobs_in(tmp_path)
        record = await jobs.submit(ORDER, b"one\n")
        write_state = jobs.store.write_state

        def held(job_id: str, state: bytes) -> None:
            entered.set()
            assert release.wait(30), "never released"  # a hang guard only
            write_state(job_id, state)

        monkeypatch.setattr(jobs.store, "write_state", held)
        await jobs.start()
        assert await asyncio.to_thread(entered.wait, 30)
        assert await asyncio.ensure_future(asyncio.sleep(0, result="answered")) == "answered"
        assert state_of(tmp_path, record.id)["state"] == "queued"  # the write is held
        release.set()
        assert (await jobs.wait(record.id, "v1")).state is JobState.DONE
        assert state_of(tmp_path, record.id)["state"] == "done"
        await jobs.stop(0)

    try:
        asyncio.run(main())
    finally:
        release.set()


@pytest.mark.parametrize("failures", [1, 2], ids=["state-write", "and-its-failure-write"])
def test_a_failed_state_write_fails_that_job_and_the_worker_goes_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failures: int) -> None:
    """Disk full at a job's state write: that job is failed with the reason (on disk
    too where the failure itself can be written); the one worker runs the next job."""

    async def main() -> None:
        jobs = jobs_in(tmp_path)
        first = await jobs.submit(ORDER, b"one\n")
        second = await jobs.submit(ORDER, b"two\n")
        write_state, left = jobs.store.write_state, [failures]

        def full(job_id: str, state: bytes) -> None:
            if job_id == first.id and left[0]:
                left[0] -= 1
                raise OSError(28, "No space left on device")
            write_state(job_id, state)

        monkeypatch.setattr(jobs.store, "write_state", full)
        await jobs.start()
        # A hang guard only: before the fix the worker was gone and this never ended.
        view = await asyncio.wait_for(jobs.wait(second.id, "v1"), 30)
        assert view.state is JobState.DONE
        failed = jobs.view(first.id, "v1")
        assert failed.state is JobState.ERROR and failed.error_kind == "INTERNAL"
        assert "in its jobs folder (No space left on device)" in failed.error_message
        on_disk = state_of(tmp_path, first.id)
        assert on_disk["state"] == ("error" if failures == 1 else "queued")
        await jobs.stop(0)

    asyncio.run(main())


def test_a_sweep_deletes_off_the_event_loop_and_serves_the_job_no_more(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An expired job's folder (its output: up to the byte budget) is deleted in a
    thread: while that is held, other coroutines run, the job is no longer served, and
    its bytes stay counted in the budget until the folder is gone."""
    entered, release = threading.Event(), threading.Event()
    clock = Clock()

    async def main() -> None:
        jobs = jobs_in(tmp_path, clock)
        await jobs.start()
        record = await jobs.submit(ORDER, b"one\n")
        await jobs.wait(record.id, "v1")
        held_before = jobs.store.held_bytes()
        delete = jobs.store.delete

        def held(job_id: str) -> None:
            entered.set()
            assert release.wait(30), "never released"  # a hang guard only
            delete(job_id)

        monkeypatch.setattr(jobs.store, "delete", held)
        clock.now += 60.0
        sweep = asyncio.ensure_future(jobs.sweep())
        assert await asyncio.to_thread(entered.wait, 30)
        assert await asyncio.ensure_future(asyncio.sleep(0, result="answered")) == "answered"
        assert not sweep.done()
        with pytest.raises(NotFound):
            jobs.view(record.id, "v1")  # expired: not served while its folder goes
        with pytest.raises(NotFound):
            await jobs.output(record.id, "v1")
        assert (tmp_path / record.id / "output").exists()  # the deletion is held
        assert jobs.store.held_bytes() == held_before  # still on disk, still counted
        release.set()
        await sweep
        assert not (tmp_path / record.id).exists()
        assert jobs.store.held_bytes() == 0
        await jobs.stop(0)

    try:
        asyncio.run(main())
    finally:
        release.set()


@pytest.mark.parametrize("swept", [False, True], ids=["whole", "swept-meanwhile"])
def test_a_download_reads_off_the_event_loop(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, swept: bool) -> None:
    """The output is read in a thread: while that is held, other coroutines run; the
    download answers the whole file, or NotFound where the job expired meanwhile."""
    entered, release = threading.Event(), threading.Event()
    clock = Clock()

    async def main() -> None:
        jobs = jobs_in(tmp_path, clock)
        await jobs.start()
        record = await jobs.submit(ORDER, b"one\ntwo\n")
        await jobs.wait(record.id, "v1")
        output = jobs.store.output

        def held(held_record: Record) -> bytes:
            entered.set()
            assert release.wait(30), "never released"  # a hang guard only
            return output(held_record)

        monkeypatch.setattr(jobs.store, "output", held)
        download = asyncio.ensure_future(jobs.output(record.id, "v1"))
        assert await asyncio.to_thread(entered.wait, 30)
        assert await asyncio.ensure_future(asyncio.sleep(0, result="answered")) == "answered"
        assert not download.done()
        if swept:
            clock.now += 60.0
            await jobs.sweep()  # its deletion runs in another thread of the executor
            release.set()
            with pytest.raises(NotFound):
                await download
        else:
            release.set()
            assert await download == (b"ONE\nTWO\n", "a.txt")
        await jobs.stop(0)

    try:
        asyncio.run(main())
    finally:
        release.set()
