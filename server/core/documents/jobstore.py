"""Document jobs on disk: one folder per job under the jobs folder, so that a restart
loses none.

    JOBS_DIR/.lock               held (flock) by the one server that uses the folder
    JOBS_DIR/<id>/state.json     the order and where the job stands (`Record`)
    JOBS_DIR/<id>/input          the uploaded file, until the job ends
    JOBS_DIR/<id>/output         the translated file, until it expires (or, for DeepL's
                                 door, until its one download)

Every write is whole or not at all (a temporary file in the same folder, flushed and
fsynced, then `os.replace`, then the folder fsynced), so a server stopped at any
moment, or a machine that loses power, leaves each job's last state. The folder has a byte budget: a
new job reserves its upload twice (the upload, and an output about its size) and is
refused (ResourceExhausted) where that would pass the budget.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import re
import secrets
import shutil
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import IO, Any

from seq2serve.server.core.durable import lock_exclusively
from seq2serve.server.core.durable import sync_folder as _sync_folder
from seq2serve.server.core.durable import write_atomically as _write
from seq2serve.server.core.errors import ResourceExhausted

log = logging.getLogger("seq2serve.server.jobs")

FORMAT = 1  # of state.json
# What a job's folder and state file cost beside the upload and the output: a block each.
JOB_OVERHEAD_BYTES = 8192
_ID = re.compile(r"[0-9A-F]{32}")


class JobState(str, Enum):
    QUEUED = "queued"  # waiting for a worker (also after a restart, to be run again)
    TRANSLATING = "translating"
    DONE = "done"
    ERROR = "error"

    @property
    def finished(self) -> bool:
        return self in (JobState.DONE, JobState.ERROR)


@dataclass(frozen=True)
class Order:
    """What a job translates and how: the door's request, converted to the core's terms."""

    name: str  # the file's name: its suffix says the format
    target_language: str
    source_language: str = "auto"  # "auto": what the file says, else detected
    overwrite: bool = False
    protect_placeholders: bool = True
    glossary: str = ""
    terms: tuple[tuple[str, str], ...] = ()
    do_not_translate: tuple[str, ...] = ()
    door: str = "v1"  # whose endpoints see the job: "v1" (LibreTranslate's, /v1/jobs), "deepl"
    key_digest: str = ""  # sha256 of the DeepL document_key ("" for the other door)
    # Whose characters it is (DeepL's door: deepl_auth.account, a key kept as its SHA-256
    # only), kept with the job so that a document finished across a restart is billed.
    account: str = ""


@dataclass
class Record:
    """One job as state.json holds it."""

    id: str
    order: Order
    state: JobState
    created: float  # seconds since the epoch
    input_bytes: int
    started: float | None = None
    finished: float | None = None
    attempts: int = 0  # runs started: a restart during a run counts one
    output_name: str = ""
    output_bytes: int = 0
    billed_characters: int = 0  # characters of the texts sent to the models
    report: str = ""  # what the translation did (Tally.describe)
    error_kind: str = ""  # an ErrorKind name, or "INTERNAL"
    error_message: str = ""
    downloaded: bool = False  # DeepL's door: its one download is done
    billed: bool = False  # DeepL's door: its characters are counted on `order.account`
    # The model that served it (a chain's joined by "+"; "" where none did), named on
    # the answers that carry its file (X-Seq2serve-Model), as every answer names its own.
    model: str = ""
    notes: list[str] = field(default_factory=list)  # what happened to it across restarts

    def held_bytes(self) -> int:
        """What the job holds of the budget: the upload until it ends, the output
        (reserved at the upload's size until written) until it expires or is taken."""
        held = JOB_OVERHEAD_BYTES
        if not self.state.finished:
            return held + 2 * self.input_bytes
        if self.state is JobState.DONE and not self.downloaded:
            held += self.output_bytes
        return held

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, **dataclasses.asdict(self), "state": self.state.value}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Record:
        if data.get("format") != FORMAT:
            raise ValueError(f"state format {data.get('format')!r}, expected {FORMAT}")
        values = {k: v for k, v in data.items() if k != "format"}
        order = dict(values.pop("order"))
        order["terms"] = tuple(tuple(pair) for pair in order.get("terms", ()))
        order["do_not_translate"] = tuple(order.get("do_not_translate", ()))
        return cls(**{**values, "order": Order(**order), "state": JobState(values["state"])})


def new_id() -> str:
    """A job's id: 128 random bits, which only its submitter learns."""
    return secrets.token_hex(16).upper()


class JobStore:
    """The jobs folder: `records` is every job found there or created since. One server
    at a time: a second one on the same folder is refused (OSError naming it)."""

    def __init__(self, folder: Path, max_bytes: int) -> None:
        self.folder = folder
        self.max_bytes = max_bytes
        folder.mkdir(parents=True, exist_ok=True)
        self._lock: IO[bytes] | None = lock_exclusively(folder / ".lock")
        if self._lock is None:
            raise OSError(f"the jobs folder {folder} is in use by another server "
                          "(--jobs-dir: one folder per server)")
        self.records: dict[str, Record] = {}
        # Jobs forgotten (no longer served) whose folders are still being deleted, off
        # the event loop: what they hold stays counted in the budget until they are gone.
        self.leaving: dict[str, Record] = {}
        for path in sorted(folder.iterdir()):
            if path.is_dir() and _ID.fullmatch(path.name):
                self._load(path)

    def _load(self, path: Path) -> None:
        try:
            record = Record.from_json(json.loads((path / "state.json").read_text("utf-8")))
        except (OSError, ValueError, TypeError, KeyError) as e:
            # Written whole or not at all: only a hand-made change gets here.
            log.error("jobs folder: %s has no readable state.json (%s); left as it is", path, e)
            return
        self.records[record.id] = record

    def close(self) -> None:
        if self._lock is not None:
            self._lock.close()  # releases the flock
            self._lock = None

    def held_bytes(self) -> int:
        return sum(record.held_bytes()
                   for records in (self.records, self.leaving) for record in records.values())

    def create(self, order: Order, data: bytes, now: float) -> Record:
        """A new queued job holding `data`; ResourceExhausted past the byte budget."""
        record = self.admit(order, len(data), now)
        try:
            self.write_new(record, data, self.encode(record))
        except BaseException:
            self.remove(record)
            raise
        return record

    def admit(self, order: Order, input_bytes: int, now: float) -> Record:
        """A new queued job, counted in the budget (ResourceExhausted past it) and not
        yet on disk: `write_new` puts it there (the event loop admits, a thread writes)."""
        record = Record(id=new_id(), order=order, state=JobState.QUEUED, created=now,
                        input_bytes=input_bytes)
        held, need = self.held_bytes(), record.held_bytes()
        if held + need > self.max_bytes:
            raise ResourceExhausted(
                f"the jobs folder holds {held} bytes of its {self.max_bytes} and this file "
                f"needs {need} (its upload and room for its output); try again when jobs "
                "finish or expire (the server's --jobs-max-bytes, --job-ttl-s)")
        self.records[record.id] = record
        return record

    def write_new(self, record: Record, data: bytes, state: bytes) -> None:
        """An admitted job's folder, upload and state (`encode`'s) on disk, durably."""
        folder = self.folder / record.id
        folder.mkdir()
        _sync_folder(self.folder)  # the job's folder itself survives a power loss
        _write(folder / "input", data)
        self.write_state(record.id, state)

    @staticmethod
    def encode(record: Record) -> bytes:
        """The job's state.json, taken now (where it stands when it is asked)."""
        return json.dumps(record.to_json(), ensure_ascii=False).encode("utf-8")

    def write_state(self, job_id: str, state: bytes) -> None:
        _write(self.folder / job_id / "state.json", state)

    def save(self, record: Record) -> None:
        self.write_state(record.id, self.encode(record))

    def input(self, record: Record) -> bytes:
        return (self.folder / record.id / "input").read_bytes()

    def finish(self, record: Record, output: bytes | None) -> None:
        """The job ended (its state set by the caller): the output written, the upload
        dropped, the state saved, in that order, so a stop between them re-runs it."""
        if output is not None:
            self.write_output(record.id, output)
            record.output_bytes = len(output)
        self.save(record)
        self.drop_input(record.id)

    def write_output(self, job_id: str, output: bytes) -> None:
        _write(self.folder / job_id / "output", output)

    def drop_input(self, job_id: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            (self.folder / job_id / "input").unlink()

    def output(self, record: Record) -> bytes:
        return (self.folder / record.id / "output").read_bytes()

    def drop_output(self, job_id: str) -> None:
        """The output's file gone (the record says `downloaded`, saved first)."""
        with contextlib.suppress(FileNotFoundError):
            (self.folder / job_id / "output").unlink()

    def remove(self, record: Record) -> None:
        self.records.pop(record.id, None)
        self.delete(record.id)

    def forget(self, record: Record) -> None:
        """The job no longer served (`records` loses it), its folder still on disk
        until `delete` (a thread's work) and `deleted` (the loop's)."""
        if self.records.pop(record.id, None) is not None:
            self.leaving[record.id] = record

    def delete(self, job_id: str) -> None:
        shutil.rmtree(self.folder / job_id, ignore_errors=True)

    def deleted(self, job_id: str) -> None:
        """A forgotten job's folder is gone: its bytes leave the budget."""
        self.leaving.pop(job_id, None)
