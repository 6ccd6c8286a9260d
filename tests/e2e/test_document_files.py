"""A document's way in and out over HTTP, on the shipped en-de: any file name comes back
as a download link that is one RFC 3986 path segment and a Content-Disposition of RFC
6266/8187 (read back by the standard library's RFC 2231 parser, fetched with a client
other than the one that uploaded, resolved as the page's script resolves it, and
written by `seq2serve translate-file` under its own name); an upload has a byte limit
of its own, larger than a request's; a hostile file is refused with a 413 naming the
limit it passed."""

from __future__ import annotations

import email.message
import io
import re
import subprocess
import sys
import urllib.request
import zipfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import system_tools
from hostile_files import empty_paragraphs_docx, empty_paragraphs_epub
from office_files import word_file
from serving import RunningServer, free_port, server_config

SHIPPED = Path(__file__).resolve().parents[2] / "models" / "en-de"
DOCUMENT_BYTES = 8 * 1024 * 1024  # this server's max_document_bytes; requests keep 4 MiB
REQUEST_BYTES = 4 * 1024 * 1024

pytestmark = pytest.mark.skipif(not SHIPPED.is_dir(), reason="the shipped models/en-de")

NAMES = ["Quarterly report 2026.txt", "report #2.txt", "50% done?.txt",
         "Bericht für Ärzte.txt", "a%2Fb.txt", "日本語のメモ.txt", 'it\'s; a=b & c.txt',
         "plain.txt"]
# What RFC 3986 allows in a URL unencoded (unreserved, the delimiters of this URL) and
# percent-encodings.
URL = re.compile(r"http://127\.0\.0\.1:\d+/download_file/(?:[A-Za-z0-9\-._~]|%[0-9A-F]{2})+")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    root = tmp_path_factory.mktemp("documents")
    (root / "en-de").symlink_to(SHIPPED)
    running = RunningServer(server_config(root, http_port=free_port(), threads=1,
                                          max_message_bytes=REQUEST_BYTES,
                                          max_document_bytes=DOCUMENT_BYTES))
    yield running
    running.stop()


@pytest.fixture(scope="module")
def links(http: httpx.Client) -> dict[str, str]:
    """Each name's download link, its file translated from "Open the file."."""
    out = {}
    for name in NAMES:
        answer = http.post("/translate_file", data={"source": "en", "target": "de"},
                           files={"file": (name, b"Open the file.\n")})
        assert answer.status_code == 200, (name, answer.text)
        out[name] = answer.json()["translatedFileUrl"]
    return out


def disposition_name(header: str) -> tuple[str | None, str]:
    """(the name `filename*` gives, as the standard library's RFC 2231 reader decodes
    it, the plain `filename`). RFC 6266: a client that reads `filename*` takes it."""
    plain = re.search(r'filename="((?:[^"\\]|\\.)*)"; ', header)
    assert plain is not None, header
    message = email.message.EmailMessage()
    # Only `filename*`: the email package would keep the first of two filenames.
    message["Content-Disposition"] = header.replace(plain.group(0), "")
    return message.get_filename(), plain.group(1)


@pytest.mark.parametrize("name", NAMES)
def test_any_file_name_comes_back_as_a_link_and_a_name(links: dict[str, str],
                                                       name: str) -> None:
    url = links[name]
    assert URL.fullmatch(url), url
    translated = None
    # urllib: another client than the upload's, which refuses a URL with a space or a
    # non-ASCII letter in it and would cut one at "#" or "?".
    with urllib.request.urlopen(url, timeout=60) as answer:
        translated = answer.read().decode("utf-8")
        header = answer.headers["Content-Disposition"]
    assert translated.strip() and "Open the file" not in translated
    decoded, plain = disposition_name(header)
    assert decoded == name
    assert plain.isascii() and plain.endswith(".txt")
    if name.isascii() and '"' not in name and "\\" not in name:
        assert plain == name
    assert header.startswith("attachment; ")


def test_a_link_to_no_file_is_refused(http: httpx.Client, links: dict[str, str]) -> None:
    url = links["a%2Fb.txt"]
    # The name decoded once is not the name: no such file.
    assert http.get(url.replace("a%252Fb", "a%2Fb")).status_code in (400, 404)


@pytest.mark.needs("node")
def test_the_page_resolves_each_link_to_itself(links: dict[str, str]) -> None:
    """The page's script (static/app.js) downloads `new URL(translatedFileUrl,
    location.href).href`: the WHATWG URL parser (node's, as the browser's) must leave
    every link as it came, nothing taken for a fragment or a query."""
    script = ("for (const u of process.argv.slice(1)) "
              "console.log(new URL(String(u), 'http://127.0.0.1:1/').href)")
    urls = [links[name] for name in NAMES]
    result = subprocess.run([system_tools.path("node"), "-e", script, *urls],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == urls


def test_the_cli_writes_any_file_name(server: RunningServer, tmp_path: Path) -> None:
    for name in ("Quarterly report 2026.txt", "50% done?.txt", "Bericht für Ärzte.txt"):
        (tmp_path / name).write_bytes(b"Open the file.\n")
        result = subprocess.run(
            [sys.executable, "-m", "seq2serve.server.cli.main", "translate-file",
             str(tmp_path / name), "--to", "de", "--from", "en", "--server", server.target],
            capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stderr
        written = tmp_path / name.replace(".txt", ".de.txt")
        assert written.read_text(encoding="utf-8").strip(), written


def with_photos(size: int) -> bytes:
    """python-docx's document with `size` bytes of incompressible "photos" beside it."""
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(word_file())) as source, \
            zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
        for info in source.infolist():
            archive.writestr(info, source.read(info))
        archive.writestr("word/media/photo.jpg", _noise(size))
    return out.getvalue()


def _noise(size: int) -> bytes:
    import random

    return random.Random(0).randbytes(size)


def test_a_document_with_photos_passes_the_request_limit(http: httpx.Client) -> None:
    data = with_photos(REQUEST_BYTES + 2 * 1024 * 1024)
    assert REQUEST_BYTES < len(data) < DOCUMENT_BYTES
    answer = http.post("/translate_file", data={"source": "en", "target": "de"},
                       files={"file": ("photos.docx", data)})
    assert answer.status_code == 200, answer.text
    out = http.get(answer.json()["translatedFileUrl"]).content
    with zipfile.ZipFile(io.BytesIO(out)) as written:
        assert written.read("word/media/photo.jpg") == _noise(REQUEST_BYTES + 2 * 1024 * 1024)
    # A request other than a document's keeps its own limit.
    big = http.post("/translate", json={"q": "x" * (REQUEST_BYTES + 10), "source": "en",
                                        "target": "de"})
    assert big.status_code == 413 and "max_message_bytes" in big.json()["error"]


def test_a_document_past_its_limit_is_refused_naming_it(http: httpx.Client) -> None:
    # Just past: the file's own bytes counted (the body may carry the form around it).
    answer = http.post("/translate_file", data={"source": "en", "target": "de"},
                       files={"file": ("photos.docx", with_photos(DOCUMENT_BYTES + 1024))})
    assert answer.status_code == 413
    assert answer.json()["error"].startswith("photos.docx is ")
    assert answer.json()["error"].endswith(f"the limit is {DOCUMENT_BYTES} bytes")
    # Far past: the body is refused before it is read whole.
    answer = http.post("/translate_file", data={"source": "en", "target": "de"},
                       files={"file": ("photos.docx", with_photos(DOCUMENT_BYTES + 2**20))})
    assert answer.status_code == 413
    assert "max_document_bytes" in answer.json()["error"]


def test_hostile_paragraph_files_get_their_413_naming_the_limit(http: httpx.Client) -> None:
    for name, data in (("hostile.docx", empty_paragraphs_docx(1_900_000)),
                       ("hostile.epub", empty_paragraphs_epub(1_000_000))):
        answer = http.post("/translate_file", data={"source": "en", "target": "de"},
                           files={"file": (name, data)})
        assert answer.status_code == 413, answer.text
        assert f"{name} has more than 50000 paragraphs" in answer.json()["error"]
        assert "the limit is 50000 paragraphs" in answer.json()["error"]
