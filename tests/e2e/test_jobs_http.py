"""Documents as jobs through LibreTranslate's door on the shipped en-de: POST /v1/jobs
answers at once and GET /v1/jobs/{id} shows the job's progress until its file is
downloadable; `seq2serve translate-file --http` submits, shows the progress and writes
the file the server translated (the same as /translate_file's); a job whose client
left is ended; the byte budget queues nothing past it (429 naming the setting)."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from office_files import word_file
from serving import RunningServer, free_port, server_config

from seq2serve.server.core.documents import read_document

SHIPPED = Path(__file__).resolve().parents[2] / "models" / "en-de"
JOBS_MAX_BYTES = 256 * 1024

pytestmark = pytest.mark.skipif(not SHIPPED.is_dir(), reason="the shipped models/en-de")


@pytest.fixture(scope="module")
def jobs_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("jobs")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, jobs_dir: Path) -> Iterator[RunningServer]:
    root = tmp_path_factory.mktemp("models")
    (root / "en-de").symlink_to(SHIPPED)
    running = RunningServer(server_config(root, http_port=free_port(), threads=1,
                                          jobs_dir=jobs_dir, jobs_max_bytes=JOBS_MAX_BYTES))
    yield running
    running.stop()


def test_the_libretranslate_door_shows_a_job_s_progress(http: httpx.Client) -> None:
    lines = "".join(f"Please save the file number {i}.\n" for i in range(60))
    answer = http.post("/v1/jobs", data={"source": "en", "target": "de"},
                       files={"file": ("many.txt", lines.encode())})
    assert answer.status_code == 202, answer.text
    job = answer.json()
    assert job["state"] in ("queued", "translating", "done")
    seen = []
    for _ in range(3000):
        job = http.get(f"/v1/jobs/{job['id']}").json()
        seen.append((job["state"], job["progress"]["done"], job["progress"]["total"]))
        if job["state"] in ("done", "error"):
            break
        time.sleep(0.05)
    assert job["state"] == "done", job
    assert job["billedCharacters"] == len(lines) - 60  # the newlines are not sent
    translated = http.get(job["translatedFileUrl"]).text
    assert translated.count("\n") == 60 and "Please save" not in translated
    # Progress never goes back, and counts the file's texts.
    done = [d for state, d, _ in seen if state == "translating"]
    assert done == sorted(done)
    assert all(total in (0, 60) for _, _, total in seen)
    assert http.get("/v1/jobs/" + "0" * 32).status_code == 404


def test_the_cli_shows_a_job_and_writes_its_file(server: RunningServer, http: httpx.Client,
                                                 tmp_path: Path) -> None:
    raw = word_file()
    (tmp_path / "guide.docx").write_bytes(raw)
    result = subprocess.run(
        [sys.executable, "-m", "seq2serve.server.cli.main", "translate-file",
         str(tmp_path / "guide.docx"), "--to", "de", "--from", "en",
         "--http", str(server.http_url)],
        capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "entries translated" in result.stderr
    out = (tmp_path / "guide.de.docx").read_bytes()
    sync = http.post("/translate_file", data={"source": "en", "target": "de"},
                     files={"file": ("guide.docx", raw)})
    same = http.get(sync.json()["translatedFileUrl"]).content
    assert read_document("a.docx", out, "de").texts == read_document("a.docx", same, "de").texts
    assert read_document("a.docx", out, "de").texts != read_document("a.docx", raw, "de").texts
    refused = subprocess.run(
        [sys.executable, "-m", "seq2serve.server.cli.main", "translate-file",
         str(tmp_path / "guide.docx"), "--to", "xx", "--http", str(server.http_url)],
        capture_output=True, text=True, timeout=300)
    assert refused.returncode == 1 and "xx is not supported" in refused.stderr


def test_a_file_past_the_jobs_budget_is_refused_naming_it(http: httpx.Client) -> None:
    answer = http.post("/v1/jobs", data={"source": "en", "target": "de"},
                       files={"file": ("big.txt", b"Open the file.\n" * (JOBS_MAX_BYTES // 15))})
    assert answer.status_code == 429
    assert "--jobs-max-bytes" in answer.json()["error"]


def test_a_job_whose_client_left_is_ended(server: RunningServer, jobs_dir: Path) -> None:
    lines = "".join(f"Open the file number {i} and save it.\n" for i in range(300))
    before = {p.name for p in jobs_dir.iterdir()}
    with httpx.Client(base_url=str(server.http_url), timeout=1.0) as impatient:
        with pytest.raises(httpx.ReadTimeout):
            impatient.post("/translate_file", data={"source": "en", "target": "de"},
                           files={"file": ("long.txt", lines.encode())})
    for _ in range(200):
        if {p.name for p in jobs_dir.iterdir()} == before:
            break
        time.sleep(0.05)
    assert {p.name for p in jobs_dir.iterdir()} == before
