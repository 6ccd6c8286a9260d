"""DeepL's document endpoints with DeepL's own Python client (`deepl`, unmodified,
pointed at the server) on the shipped en-de: every format /translate_file takes comes
back translated as /translate_file translates it (one job runner behind both doors);
the client's status, not-ready and failure paths; a result downloadable once; and a
job that outlives a server killed mid-job (SIGKILL, then a new process on the same
--jobs-dir)."""

from __future__ import annotations

import io
import json
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import closing
from pathlib import Path

import deepl
import httpx
import pytest
from office_files import (
    book_file,
    odp_file,
    odt_file,
    slides_file,
    spreadsheet_file,
    word_file,
    workbook_file,
)
from serving import (
    RunningServer,
    ServeProcess,
    free_port,
    serve_env,
    server_config,
    wait_serving,
)
from translate.storage import pypo, xliff2

from seq2serve.server.core.documents import read_document

SHIPPED = Path(__file__).resolve().parents[2] / "models" / "en-de"
CATALOGS = Path(__file__).resolve().parents[1] / "fixtures" / "catalogs"
KEY = "any-key:fx"  # keys are off on these servers: any key is let in, as LibreTranslate's

pytestmark = pytest.mark.skipif(not SHIPPED.is_dir(), reason="the shipped models/en-de")


def text_file() -> bytes:
    return b"Open the file.\n\nThe disk is almost full.\n"


def html_file() -> bytes:
    return (b"<html><body><p>Please <b>open the file</b> and save it.</p>"
            b"<p>The disk is almost full.</p></body></html>")


def subtitles() -> bytes:
    return (b"1\n00:00:01,000 --> 00:00:03,500\nThe disk is almost full.\n\n"
            b"2\n00:00:04,000 --> 00:00:05,250\nOpen the file.\n")


FORMATS: dict[str, Callable[[], bytes]] = {
    "notes.txt": text_file, "page.html": html_file, "film.srt": subtitles,
    "guide.docx": word_file, "talk.pptx": slides_file, "guide.odt": odt_file,
    "talk.odp": odp_file, "book.epub": book_file, "figures.xlsx": workbook_file,
    "figures.ods": spreadsheet_file,
    "ark.de.po": lambda: (CATALOGS / "ark.de.po").read_bytes(),
    "ark.de.xlf": lambda: (CATALOGS / "ark.de.xlf").read_bytes(),
}


class _QuickTime:
    """The client polls a document's status every 5 s; here every 0.1 s."""

    time = staticmethod(time.time)

    @staticmethod
    def sleep(seconds: float) -> None:
        time.sleep(min(seconds, 0.1))


@pytest.fixture(autouse=True)
def quick_client(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(deepl.translator, "time", _QuickTime)
    monkeypatch.setattr(deepl.http_client, "max_network_retries", 1)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    root = tmp_path_factory.mktemp("models")
    (root / "en-de").symlink_to(SHIPPED)
    running = RunningServer(server_config(root, http_port=free_port(), threads=1,
                                          jobs_dir=tmp_path_factory.mktemp("jobs"),
                                          max_document_bytes=1024 * 1024))
    yield running
    running.stop()


@pytest.fixture
def client(server: RunningServer) -> Iterator[deepl.Translator]:
    translator = deepl.Translator(KEY, server_url=server.http_url)
    yield translator
    translator.close()


def libre_translation(http: httpx.Client, name: str, raw: bytes) -> bytes:
    answer = http.post("/translate_file", data={"source": "en", "target": "de"},
                       files={"file": (name, raw)})
    assert answer.status_code == 200, answer.text
    return http.get(answer.json()["translatedFileUrl"]).content


def content(name: str, data: bytes) -> list[str]:
    """What a translation changes: a catalog's targets (its sources stay), else the
    texts the file reads as."""
    if name.endswith(".po"):
        return [str(u.target) for u in pypo.pofile(data).units if not u.isheader()]
    if name.endswith(".xlf"):
        return [str(u.target or "") for u in xliff2.Xliff2File(data).units]
    return list(read_document(name, data, "de").texts)


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_every_format_through_the_deepl_client(client: deepl.Translator, http: httpx.Client,
                                               name: str) -> None:
    raw = FORMATS[name]()
    out = io.BytesIO()
    status = client.translate_document(raw, out, source_lang="EN",
                                       target_lang="DE", filename=name)
    assert status.done and status.billed_characters and status.billed_characters > 0
    before, after = content(name, raw), content(name, out.getvalue())
    assert len(after) == len(before)
    changed = sum(a != b for a, b in zip(before, after, strict=True))
    assert changed >= (1 if name.endswith((".po", ".xlf")) else len(before) // 2)
    # What the LibreTranslate door's /translate_file gives for the same file.
    assert after == content(name, libre_translation(http, name, raw))


def test_without_a_source_language_the_file_is_detected(client: deepl.Translator) -> None:
    out = io.BytesIO()
    client.translate_document(text_file(), out, target_lang="DE",
                              filename="notes.txt")
    assert b"Open the file" not in out.getvalue() and out.getvalue().strip()


def test_status_then_a_result_downloadable_once(client: deepl.Translator,
                                                http: httpx.Client) -> None:
    handle = client.translate_document_upload(word_file(), target_lang="DE",
                                              filename="guide.docx")
    assert len(handle.document_id) == 32 and len(handle.document_key) == 64
    status = client.translate_document_wait_until_done(handle)
    assert status.done and status.billed_characters
    first = io.BytesIO()
    client.translate_document_download(handle, first)
    assert read_document("guide.docx", first.getvalue(), "de").texts
    with pytest.raises(deepl.DeepLException, match="Not found") as again:
        client.translate_document_download(handle, io.BytesIO())
    assert again.value.http_status_code == 404
    # (The client reads no message from a download's answer: it is there.)
    answer = http.post(f"/v2/document/{handle.document_id}/result",
                       json={"document_key": handle.document_key},
                       headers={"Authorization": f"DeepL-Auth-Key {KEY}"})
    assert answer.status_code == 404 and "already downloaded" in answer.json()["message"]
    wrong = deepl.DocumentHandle(handle.document_id, "0" * 64)
    with pytest.raises(deepl.DeepLException, match="Document not found"):
        client.translate_document_get_status(wrong)


def test_a_result_asked_for_too_early_is_not_ready(client: deepl.Translator,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    # Many distinct lines: the job is still queued or translating when asked.
    lines = "".join(f"Open the file number {i} and save it.\n" for i in range(200))
    handle = client.translate_document_upload(lines.encode(), target_lang="DE",
                                              filename="long.txt")
    monkeypatch.setattr(deepl.http_client, "max_network_retries", 0)
    with pytest.raises(deepl.DocumentNotReadyException):
        client.translate_document_download(handle, io.BytesIO())
    status = client.translate_document_get_status(handle)
    assert status.status.value in ("queued", "translating", "done")
    assert client.translate_document_wait_until_done(handle).done


def test_a_broken_file_is_a_failed_document(client: deepl.Translator) -> None:
    with pytest.raises(deepl.DocumentTranslationException,
                       match="guide.docx is not a Word document") as failed:
        client.translate_document(b"not a zip at all", io.BytesIO(),
                                  target_lang="DE", filename="guide.docx")
    assert failed.value.document_handle is not None


def test_refusals_at_upload(client: deepl.Translator, server: RunningServer) -> None:
    with pytest.raises(deepl.DeepLException, match="target_lang.* not supported"):
        client.translate_document_upload(b"Open the file.", target_lang="FR",
                                         filename="a.txt")
    with pytest.raises(deepl.DeepLException, match="not supported"):
        client.translate_document_upload(b"Open the file.", target_lang="DE",
                                         filename="a.pdf")
    with pytest.raises(deepl.DeepLException, match="output_format"):
        client.translate_document_upload(b"Open the file.", target_lang="DE",
                                         filename="a.docx", output_format="pdf")
    with pytest.raises(deepl.DeepLException) as large:
        client.translate_document_upload(b"x" * (2 * 1024 * 1024), target_lang="DE",
                                         filename="big.txt")
    assert large.value.http_status_code == 413


def test_a_job_outlives_a_server_killed_mid_job(tmp_path: Path) -> None:
    """SIGKILL while the document translates (or waits): a new server on the same jobs
    folder runs it again from its upload, and the client's handle still works."""
    models = tmp_path / "models"
    models.mkdir()
    (models / "en-de").symlink_to(SHIPPED)
    jobs = tmp_path / "jobs"
    lines = "".join(f"Open the file number {i} and save it.\n" for i in range(150)).encode()

    def start() -> tuple[ServeProcess, str, str]:
        port, http_port = free_port(), free_port()
        proc = ServeProcess(serve_env(models, port, http_port=http_port, jobs_dir=jobs,
                                      max_documents_in_flight=1))
        wait_serving(f"127.0.0.1:{port}", proc)
        return proc, f"127.0.0.1:{port}", f"http://127.0.0.1:{http_port}"

    proc, _, url = start()
    try:
        client = deepl.Translator(KEY, server_url=url)
        first = client.translate_document_upload(lines, target_lang="DE", filename="a.txt")
        second = client.translate_document_upload(b"Open the file.\n", target_lang="DE",
                                                  filename="b.txt")
        proc.signal(signal.SIGKILL)
        proc.finish(60)
    finally:
        proc.kill()
    # The second waited behind the first (one document at a time): unfinished.
    states = {h.document_id: (jobs / h.document_id / "state.json").read_text()
              for h in (first, second)}
    assert '"state": "queued"' in states[second.document_id]
    proc, _, url = start()
    try:
        client = deepl.Translator(KEY, server_url=url)
        for handle, name, raw in ((first, "a.txt", lines), (second, "b.txt",
                                                            b"Open the file.\n")):
            status = client.translate_document_wait_until_done(handle)
            assert status.done, status.error_message
            out = io.BytesIO()
            client.translate_document_download(handle, out)
            before = read_document(name, raw, "de").texts
            after = read_document(name, out.getvalue(), "de").texts
            assert len(after) == len(before) and not set(before) & set(after)
        proc.signal(signal.SIGTERM)
        assert proc.finish(120) == 0
    finally:
        proc.kill()


def test_keys_and_a_key_s_character_limit(tmp_path: Path) -> None:
    """A wrong key is the client's AuthorizationException; a document's characters
    count on its key once done, and a key past its limit gets QuotaExceededException;
    a glossary of the server's applies by its id."""
    models = tmp_path / "models"
    models.mkdir()
    (models / "en-de").symlink_to(SHIPPED)
    keys = tmp_path / "keys"
    keys.write_text("small 20\nbig\n")
    glossaries = tmp_path / "glossaries"
    glossaries.mkdir()
    (glossaries / "office.tsv").write_text("file\tAkte\n")
    server = RunningServer(server_config(models, http_port=free_port(), api_keys=keys,
                                         require_api_key=True, jobs_dir=tmp_path / "jobs",
                                         glossary_dir=glossaries))
    try:
        with closing(deepl.Translator("wrong", server_url=server.http_url)) as wrong, \
                pytest.raises(deepl.AuthorizationException):
            wrong.translate_document_upload(text_file(), target_lang="DE",
                                            filename="a.txt")
        with closing(deepl.Translator("small", server_url=server.http_url)) as small:
            status = small.translate_document(text_file(), io.BytesIO(), target_lang="DE",
                                              filename="a.txt")
            assert status.billed_characters == len("Open the file.The disk is almost full.")
            with pytest.raises(deepl.QuotaExceededException):
                small.translate_document_upload(text_file(), target_lang="DE",
                                                filename="a.txt")
        with closing(deepl.Translator("big", server_url=server.http_url)) as big:
            out = io.BytesIO()
            assert big.translate_document(text_file(), out, target_lang="DE",
                                          filename="a.txt").done
            assert b"Akte" not in out.getvalue()
            # A glossary of the server's by its id.
            out = io.BytesIO()
            big.translate_document(text_file(), out, source_lang="EN", target_lang="DE",
                                   filename="a.txt", glossary="office")
            assert b"Akte" in out.getvalue()
            with pytest.raises(deepl.DeepLException, match="glossary_id"):
                big.translate_document_upload(text_file(), source_lang="EN", target_lang="DE",
                                              filename="a.txt", glossary="nothing")
    finally:
        server.stop()


def test_a_document_finished_before_a_restart_is_billed_after_it(tmp_path: Path) -> None:
    """Whose key a document counts on is kept in its job (as the key's SHA-256, never
    the key): a document done before a restart and asked for after it counts on its
    key, against the limit the key file gives then, once."""
    models = tmp_path / "models"
    models.mkdir()
    (models / "en-de").symlink_to(SHIPPED)
    keys, jobs = tmp_path / "keys", tmp_path / "jobs"
    keys.write_text("owner 1000000\n")
    text = b"The house is small.\n" * 5

    def start() -> RunningServer:
        return RunningServer(server_config(models, http_port=free_port(), api_keys=keys,
                                           require_api_key=True, jobs_dir=jobs,
                                           usage_file=tmp_path / "usage.json"))

    server = start()
    try:
        with closing(deepl.Translator("owner", server_url=server.http_url)) as client:
            handle = client.translate_document_upload(text, target_lang="DE",
                                                      filename="a.txt")
        state = jobs / handle.document_id / "state.json"
        for _ in range(1200):  # done on disk, and nobody asked for its status
            if json.loads(state.read_text())["state"] == "done":
                break
            time.sleep(0.05)
        assert json.loads(state.read_text())["state"] == "done"
        assert "owner" not in state.read_text()
    finally:
        server.stop()
    keys.write_text("owner 5000\n")  # the limit as it is at billing time
    server = start()
    try:
        with closing(deepl.Translator("owner", server_url=server.http_url)) as client:
            assert client.get_usage().character.count == 0
            status = client.translate_document_get_status(handle)
            assert status.done and status.billed_characters
            usage = client.get_usage().character
            assert (usage.count, usage.limit) == (status.billed_characters, 5000)
            out = io.BytesIO()
            client.translate_document_download(handle, out)
            assert out.getvalue()
            client.translate_document_get_status(handle)
            assert client.get_usage().character.count == status.billed_characters  # once
    finally:
        server.stop()
