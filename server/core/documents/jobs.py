"""Documents as jobs: a queue whose state is on disk (`jobstore.py`), so that a large
document neither holds an HTTP request open nor is lost by a restart.

A door submits an `Order` with the uploaded bytes and gets the job's id at once; up
to `workers` jobs run at a time (the server's --max-documents-in-flight: each holds
its parsed file, up to about 100 MB), the others wait in the queue, bounded by the
jobs folder's byte budget rather than refused. A run reads the file, translates its
texts through the core and writes the output (`runner`, documents/service.py).

At start every job the folder holds is taken up again: one queued or in progress when
the server stopped is run again from its stored upload (a note says so), unless it
was started `MAX_ATTEMPTS` times already (a file that stops the server each time it
is read), which ends it as failed with that reason. None vanishes: a job leaves the
folder only `ttl_s` after it ended (and its output, for DeepL's door, once
downloaded). As a lifecycle part (BACK, after the models): start() after the models
are loaded, stop() leaves the jobs in progress as they are on disk.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from seq2serve.server.core.documents.jobstore import JobState, JobStore, Order, Record
from seq2serve.server.core.documents.queueing import Progress
from seq2serve.server.core.errors import ErrorKind, NotFound, ServiceError
from seq2serve.server.core.translator import off_loop

log = logging.getLogger("seq2serve.server.jobs")

MAX_ATTEMPTS = 3  # runs a job may start (restarts included) before it is failed
INTERNAL = "INTERNAL"  # error_kind of a failure that is the server's, not the file's
_NO_OUTPUT = "the document job has no translated file to download"


@dataclass(frozen=True)
class Outcome:
    """What a run made: the file, its name, and what it cost."""

    data: bytes
    name: str
    billed_characters: int
    report: str
    model: str = ""  # the model that served it ("" where none did: nothing to translate)


Runner = Callable[[Order, bytes, Progress], Awaitable[Outcome]]


@dataclass(frozen=True)
class JobView:
    """Where a job stands, for a door to answer with."""

    id: str
    name: str  # the uploaded file's
    state: JobState
    done: int  # texts translated
    total: int  # texts to translate (0 until the file is read)
    seconds_remaining: int | None  # an estimate while translating, else None
    billed_characters: int
    output_name: str
    report: str
    error_kind: str
    error_message: str
    downloaded: bool
    notes: tuple[str, ...]
    model: str = ""  # the model that served it, once done

    def error(self) -> ServiceError:
        """The job's failure as the error a synchronous answer raises."""
        kind = (ErrorKind(self.error_kind) if self.error_kind in ErrorKind.__members__
                else ErrorKind.UNAVAILABLE)
        return ServiceError(kind, self.error_message)


@dataclass
class _Live:
    """A running job's progress, kept in memory only (a restart runs it again)."""

    started: float
    done: int = 0
    total: int = 0


class DocumentJobs:
    """The queue of document jobs over a `JobStore` (see the module docstring)."""

    def __init__(self, folder: Path | None, *, max_bytes: int, ttl_s: float, workers: int,
                 clock: Callable[[], float] = time.time) -> None:
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        # Without a folder: a temporary one, removed at stop (jobs do not survive a restart).
        self._temporary = folder is None
        path = Path(tempfile.mkdtemp(prefix="seq2serve-jobs-")) if folder is None else folder
        self.store = JobStore(path, max_bytes)
        self.ttl_s, self.workers, self.clock = ttl_s, workers, clock
        self.runner: Runner | None = None
        self._queue: asyncio.Queue[str] = asyncio.Queue()
        self._live: dict[str, _Live] = {}
        self._ended: dict[str, asyncio.Event] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._running: dict[str, asyncio.Task[Outcome]] = {}
        self._deleting: set[asyncio.Future[None]] = set()  # folders being deleted
        self._stopping = False
        # One state.json write at a time, each taken when its turn comes: a later
        # save never lands under an earlier one's older state.
        self._saving = asyncio.Lock()
        self._recover()

    @property
    def folder(self) -> Path:
        return self.store.folder

    def attach(self, runner: Runner) -> None:
        """What runs a job (the HTTP door gives it: it knows how `auto` is detected)."""
        self.runner = runner

    # -- lifecycle -----------------------------------------------------------------

    def _recover(self) -> None:
        for record in sorted(self.store.records.values(), key=lambda r: r.created):
            if record.state.finished:
                continue
            if not (self.store.folder / record.id / "input").is_file():
                self._fail(record, INTERNAL, "the uploaded file is missing from the jobs "
                           "folder after a restart")
            elif record.state is JobState.TRANSLATING and record.attempts >= MAX_ATTEMPTS:
                self._fail(record, INTERNAL, f"the server stopped {record.attempts} times "
                           "while translating this document; it is not tried again")
            else:
                if record.state is JobState.TRANSLATING:
                    record.notes.append("the server stopped while translating it: run "
                                        "again from its upload")
                record.state = JobState.QUEUED
                self.store.save(record)
                self._queue.put_nowait(record.id)
        if self._queue.qsize():
            log.info("jobs: %d document(s) taken up again from %s", self._queue.qsize(),
                     self.folder)

    async def start(self) -> None:
        if self.runner is None:
            raise RuntimeError("document jobs have no runner (attach one first)")
        self._stopping = False
        self._tasks = [asyncio.create_task(self._work()) for _ in range(self.workers)]
        self._tasks.append(asyncio.create_task(self._sweep_every(min(60.0, self.ttl_s))))
        where = "a temporary folder: jobs do not survive a restart (--jobs-dir)" \
            if self._temporary else str(self.folder)
        log.info("document jobs in %s", where)

    async def stop(self, grace: float) -> None:
        """The jobs in progress end now; on disk they stay in progress, so the next
        start runs them again."""
        self._stopping = True
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        await asyncio.gather(*self._deleting)  # before a temporary folder goes
        self.close()

    def close(self) -> None:
        """Let go of the folder (a temporary one is removed)."""
        self.store.close()
        if self._temporary:
            shutil.rmtree(self.folder, ignore_errors=True)

    # -- what a door calls ---------------------------------------------------------

    async def submit(self, order: Order, data: bytes) -> Record:
        """A new queued job, on disk before this returns (the disk work off the event
        loop); ResourceExhausted past the folder's byte budget."""
        await self.sweep()
        record = self.store.admit(order, len(data), self.clock())
        state = self.store.encode(record)
        write = asyncio.ensure_future(off_loop(lambda: self.store.write_new(record, data,
                                                                            state)))
        try:
            await asyncio.shield(write)  # a write is never left half-way by a cancel
        except asyncio.CancelledError:
            # Nobody learns its id: it goes once the write has ended.
            write.add_done_callback(lambda _: self._discard([record]))
            raise
        except BaseException:
            self._discard([record])
            raise
        self._queue.put_nowait(record.id)
        return record

    async def save(self, record: Record) -> None:
        """The job's state as it stands now, on disk (off the event loop)."""
        async with self._saving:
            state = self.store.encode(record)
            await off_loop(lambda: self.store.write_state(record.id, state))

    def record(self, job_id: str, door: str) -> Record:
        """The job `job_id` of `door`; NotFound for any other id (expired, another
        door's, never made)."""
        record = self.store.records.get(job_id)
        if record is None or record.order.door != door:
            raise NotFound("no such document job (finished jobs are kept for "
                           f"{self.ttl_s:g} s)")
        return record

    def view(self, job_id: str, door: str) -> JobView:
        record = self.record(job_id, door)
        live = self._live.get(record.id)
        done, total, remaining = 0, 0, None
        if live is not None:
            done, total = live.done, live.total
            if 0 < live.done < live.total:
                elapsed = max(0.0, self.clock() - live.started)
                remaining = round(elapsed * (live.total - live.done) / live.done)
        return JobView(id=record.id, name=record.order.name, state=record.state, done=done,
                       total=total, seconds_remaining=remaining,
                       billed_characters=record.billed_characters,
                       output_name=record.output_name, report=record.report,
                       error_kind=record.error_kind, error_message=record.error_message,
                       downloaded=record.downloaded, notes=tuple(record.notes),
                       model=record.model)

    async def wait(self, job_id: str, door: str) -> JobView:
        """Once the job has ended, where it stands."""
        record = self.record(job_id, door)
        if not record.state.finished:
            await self._ended.setdefault(job_id, asyncio.Event()).wait()
        return self.view(job_id, door)

    async def output(self, job_id: str, door: str) -> tuple[bytes, str]:
        """The translated file (read off the event loop) and its name; NotFound unless
        it is there, also where the job expired while it was read."""
        record = self.record(job_id, door)
        if record.state is not JobState.DONE or record.downloaded:
            raise NotFound(_NO_OUTPUT)
        return await self._read_output(record), record.output_name

    async def _read_output(self, record: Record) -> bytes:
        """The output is whole once the job is done (written before its state said so);
        a job swept while it was read is not served."""
        try:
            data = await off_loop(lambda: self.store.output(record))
        except FileNotFoundError:
            data = None
        if data is None or self.store.records.get(record.id) is not record:
            raise NotFound(_NO_OUTPUT)
        return data

    async def take(self, job_id: str, door: str) -> tuple[bytes, str]:
        """The translated file, downloadable once: the output is dropped after."""
        record = self.record(job_id, door)
        if record.state is not JobState.DONE or record.downloaded:
            raise NotFound(_NO_OUTPUT)
        record.downloaded = True  # before any wait: a second download finds it taken
        data = await self._read_output(record)
        await self.save(record)
        await off_loop(lambda: self.store.drop_output(record.id))
        return data, record.output_name

    def cancel(self, job_id: str) -> None:
        """The job ends and leaves the folder (its submitter no longer wants it)."""
        record = self.store.records.get(job_id)
        if record is None:
            return
        running = self._running.get(job_id)
        if running is not None:
            running.cancel()
        self._discard([record])
        self._wake(job_id)

    async def sweep(self) -> None:
        """Remove the jobs that ended more than `ttl_s` ago: no longer served from
        now, their folders deleted before this returns."""
        now = self.clock()
        expired = [record for record in self.store.records.values()
                   if record.finished is not None and record.finished + self.ttl_s <= now]
        if expired:
            await asyncio.shield(self._discard(expired))  # a cancel leaves it running

    def _discard(self, records: list[Record]) -> asyncio.Future[None]:
        """`records` no longer served, at once; their folders (an upload, an output:
        up to the byte budget) deleted off the event loop, counted in the budget
        until they are gone."""
        for record in records:
            self.store.forget(record)
        ids = [record.id for record in records]

        def delete() -> None:
            for job_id in ids:
                self.store.delete(job_id)

        def deleted(done: asyncio.Future[None]) -> None:
            if not done.cancelled():
                done.exception()  # seen: rmtree ignores its errors, so none is expected
            for job_id in ids:
                self.store.deleted(job_id)
            self._deleting.discard(done)

        # Its callback runs before any awaiter's: the budget is freed when they resume.
        deletion = asyncio.ensure_future(off_loop(delete))
        deletion.add_done_callback(deleted)
        self._deleting.add(deletion)
        return deletion

    # -- running -------------------------------------------------------------------

    async def _sweep_every(self, period: float) -> None:
        while True:
            await asyncio.sleep(max(1.0, period))
            await self.sweep()

    async def _work(self) -> None:
        while True:
            job_id = await self._queue.get()
            record = self.store.records.get(job_id)
            if record is None or record.state is not JobState.QUEUED:
                continue  # cancelled while it waited
            await self._run(record)

    async def _run(self, record: Record) -> None:
        try:
            await self._attempt(record)
        except OSError as e:  # the jobs folder's (disk full, EIO): the job fails, not the worker
            if record.id not in self.store.records:
                return  # cancelled by its submitter while it was written: already removed
            log.error("document job %s: cannot write to the jobs folder %s", record.id,
                      self.folder, exc_info=e)
            self._failed(record, INTERNAL, "the server could not read or write this job "
                         f"in its jobs folder ({e.strerror or type(e).__name__})")
            try:
                await self._finish(record)
            except OSError as again:
                log.error("document job %s: cannot write its failure either; it stays "
                          "failed until a restart runs it again", record.id, exc_info=again)
        finally:
            self._running.pop(record.id, None)
            self._live.pop(record.id, None)
        self._wake(record.id)

    async def _attempt(self, record: Record) -> None:
        assert self.runner is not None
        record.state, record.started = JobState.TRANSLATING, self.clock()
        record.attempts += 1
        await self.save(record)
        live = self._live[record.id] = _Live(started=record.started)

        def progress(done: int, total: int) -> None:
            live.done, live.total = done, total

        data = await off_loop(lambda: self.store.input(record))  # OSError: _run fails it
        try:
            run = self._running[record.id] = asyncio.ensure_future(
                self.runner(record.order, data, progress))
            outcome = await run
        except asyncio.CancelledError:
            if self._stopping:
                raise  # left as it is on disk: the next start runs it again
            return  # cancelled by its submitter: already removed
        except Exception as e:  # noqa: BLE001 - a job's failure is its state, never a crash
            if self._stopping:  # the models stopping under it: run again at the next start
                return
            if isinstance(e, ServiceError):
                self._failed(record, e.kind.value, e.message)
            else:
                log.error("document job %s failed", record.id, exc_info=e)
                self._failed(record, INTERNAL, "internal error (logged on the server)")
            await self._finish(record)
        else:
            # The output on disk before the state says done, so a download finds it.
            await off_loop(lambda: self.store.write_output(record.id, outcome.data))
            record.state, record.finished = JobState.DONE, self.clock()
            record.output_name, record.report = outcome.name, outcome.report
            record.billed_characters = outcome.billed_characters
            record.model, record.output_bytes = outcome.model, len(outcome.data)
            await self._finish(record)

    async def _finish(self, record: Record) -> None:
        """The ended job's state saved, then its upload dropped (a stop between them
        runs it again)."""
        await self.save(record)
        await off_loop(lambda: self.store.drop_input(record.id))

    def _failed(self, record: Record, kind: str, message: str) -> None:
        record.state, record.finished = JobState.ERROR, self.clock()
        record.error_kind, record.error_message = kind, message

    def _fail(self, record: Record, kind: str, message: str) -> None:
        """Failed at recovery (before the loop runs): written here and now."""
        self._failed(record, kind, message)
        self.store.finish(record, None)

    def _wake(self, job_id: str) -> None:
        event = self._ended.pop(job_id, None)
        if event is not None:
            event.set()
