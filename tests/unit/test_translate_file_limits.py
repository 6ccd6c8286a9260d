"""`seq2serve translate-file` reads a file within the document limits `seq2serve serve`
has (server/document_settings.py declares them once): the same flags, variables,
defaults and refusals; a file past one is refused in one line naming the flag and its
value; with `--http` the server's own limits apply, and a limit given there is refused.
The server is a stand-in here (the texts come back upper-cased): what is tested is the
reading; tests/e2e/test_translate_file.py translates a book over a default limit on the
shipped model."""

from __future__ import annotations

import argparse
import dataclasses
import io
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from office_files import word_file

from seq2serve.server import config
from seq2serve.server.cli import translate_file
from seq2serve.server.cli.main import main
from seq2serve.server.client import ModelInfo
from seq2serve.server.core.documents import DEFAULT_LIMITS, Limits
from seq2serve.server.core.documents.limits import SETTINGS
from seq2serve.server.document_settings import FIELDS, DocumentLimitSettings
from seq2serve.server.settings import env_name, flag_name

PROG = "seq2serve translate-file"
TEXT = b"Hello world.\nThe disk is full.\nOpen the file.\n"  # 3 lines, 3 texts, 43 characters
FLAGS = [flag_name(f.name) for f in FIELDS]


class StandIn:
    """What translate-file asks of a server, over no network: one en-de model."""

    def __init__(self, target: str, timeout: float | None) -> None:
        pass

    def __enter__(self) -> StandIn:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def wait_until_serving(self, seconds: float) -> None:
        return None

    def list_models(self) -> list[ModelInfo]:
        return [ModelInfo("en-de", "translate", "en", "de", "fp32", "cpu", 512,
                          limits={"max_texts_per_request": 8, "max_text_chars": 10000})]

    def list_routes(self) -> list[tuple[str, str, tuple[str, ...]]]:
        return [("en", "de", ("en-de",))]

    def translate(self, texts: Sequence[str], model: str | None,
                  **options: Any) -> list[list[SimpleNamespace]]:
        return [[SimpleNamespace(text=text.upper())] for text in texts]


@pytest.fixture(autouse=True)
def stand_in(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(translate_file, "Seq2ServeClient", StandIn)
    for f in FIELDS:
        monkeypatch.delenv(env_name(f.name), raising=False)


def run(capsys: pytest.CaptureFixture[str], path: Path, *options: str) -> tuple[int, str]:
    code = main(["translate-file", str(path), "--to", "de", "--from", "en", "--no-progress",
                 *options])
    return code, capsys.readouterr().err


def archive_sizes(data: bytes) -> tuple[int, int]:
    infos = zipfile.ZipFile(io.BytesIO(data)).infolist()
    return len(infos), sum(info.file_size for info in infos)


WORD = word_file()
MEMBERS, UNPACKED = archive_sizes(WORD)
# (flag, the file, a value it is past, a value it is within): the .txt's at its exact
# counts, so that each limit is shown to be inclusive.
CASES: list[tuple[str, str, bytes, int, int]] = [
    ("--max-document-bytes", "a.txt", TEXT, len(TEXT) - 1, len(TEXT)),
    ("--max-document-elements", "a.txt", TEXT, 2, 3),
    ("--max-document-paragraphs", "a.txt", TEXT, 2, 3),
    ("--max-document-characters", "a.txt", TEXT, 42, 43),
    ("--max-document-members", "a.docx", WORD, MEMBERS - 1, MEMBERS),
    ("--max-document-unpacked-bytes", "a.docx", WORD, UNPACKED - 1, UNPACKED),
    ("--max-document-paragraphs", "a.docx", WORD, 2, 1000),
    ("--max-document-characters", "a.docx", WORD, 10, 100_000),
    ("--max-document-elements", "a.docx", WORD, 10, 100_000),
]


@pytest.mark.parametrize(("flag", "name", "data", "past", "within"), CASES,
                         ids=[f"{c[1]}{c[0]}" for c in CASES])
def test_a_file_past_a_lowered_limit_is_refused_naming_it_and_read_with_it_raised(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, flag: str, name: str,
        data: bytes, past: int, within: int) -> None:
    path = tmp_path / name
    path.write_bytes(data)
    code, err = run(capsys, path, flag, str(past))
    assert code == 1
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"{PROG}: error: {name} ") and f"({flag} {past}; raise it" in err
    assert not (tmp_path / f"a.de{path.suffix}").exists()
    code, err = run(capsys, path, flag, str(within))
    assert code == 0, err
    assert (tmp_path / f"a.de{path.suffix}").exists()


def test_a_book_over_a_default_limit_reads_with_it_raised_by_flag_or_variable(
        capsys: pytest.CaptureFixture[str], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "book.txt"
    path.write_bytes(b"Hello world.\n" + b"\n" * DEFAULT_LIMITS.elements + b"Open the file.\n")
    code, err = run(capsys, path)
    assert code == 1
    assert f"(--max-document-elements {DEFAULT_LIMITS.elements}; raise it, or " \
           "SEQ2SERVE_MAX_DOCUMENT_ELEMENTS, to read this file)" in err
    code, err = run(capsys, path, "--max-document-elements", str(DEFAULT_LIMITS.elements + 2))
    assert code == 0, err
    translated = (tmp_path / "book.de.txt").read_bytes()
    assert translated.startswith(b"HELLO WORLD.\n") and translated.endswith(b"OPEN THE FILE.\n")
    (tmp_path / "book.de.txt").unlink()
    monkeypatch.setenv("SEQ2SERVE_MAX_DOCUMENT_ELEMENTS", str(DEFAULT_LIMITS.elements + 2))
    code, err = run(capsys, path)
    assert code == 0, err
    # A flag beats the variable, as for `serve`.
    code, err = run(capsys, path, "--max-document-elements", "10")
    assert code == 1 and "(--max-document-elements 10;" in err


def serve_messages(argv: list[str], environ: dict[str, str], models: Path) -> list[str]:
    parser = argparse.ArgumentParser()
    config.add_arguments(parser)
    with pytest.raises(config.ConfigError) as refused:
        config.from_args(parser.parse_args(["--models-dir", str(models), *argv]), environ)
    return refused.value.messages


@pytest.mark.parametrize("flag", FLAGS)
@pytest.mark.parametrize("value", ["0", "-1"])
def test_a_bad_value_is_refused_in_the_words_serve_uses(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        flag: str, value: str) -> None:
    path = tmp_path / "a.txt"
    path.write_bytes(TEXT)
    expected = serve_messages([flag, value], {}, tmp_path)
    assert expected == [f"{flag[2:].replace('-', '_')} must be >= 1, got {value}"]
    code, err = run(capsys, path, flag, value)
    assert (code, err) == (2, f"{PROG}: error: {expected[0]}\n")
    variable = env_name(flag[2:].replace("-", "_"))
    for raw in (value, "many"):
        expected = serve_messages([], {variable: raw}, tmp_path)
        monkeypatch.setenv(variable, raw)
        code, err = run(capsys, path)
        assert (code, err) == (2, f"{PROG}: error: {expected[0]}\n")
    assert not (tmp_path / "a.de.txt").exists()


def test_a_value_that_is_no_number_is_refused_as_serve_refuses_it(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    def refusal(command: Callable[[], object]) -> str:
        with pytest.raises(SystemExit) as exit_info:
            command()
        assert exit_info.value.code == 2
        return capsys.readouterr().err.splitlines()[-1].split("error: ", 1)[1]

    serve = argparse.ArgumentParser()
    config.add_arguments(serve)
    said_by_serve = refusal(lambda: serve.parse_args(["--max-document-bytes", "1e6"]))
    assert said_by_serve == "argument --max-document-bytes: must be an integer, got '1e6'"
    assert refusal(lambda: main(["translate-file", str(tmp_path / "a.txt"), "--to", "de",
                                 "--max-document-bytes", "1e6"])) == said_by_serve


@pytest.mark.parametrize("flag", FLAGS)
def test_a_limit_is_refused_with_http_not_ignored(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        flag: str) -> None:
    def never(*args: object) -> None:
        raise AssertionError("the job was sent")

    monkeypatch.setattr(translate_file, "translate_on_server", never)
    path = tmp_path / "a.txt"
    path.write_bytes(TEXT)
    code, err = run(capsys, path, "--http", "http://127.0.0.1:9", flag, "1000")
    assert code == 2
    assert err == (f"{PROG}: error: {flag} is not taken with --http: the server reads the "
                   "file within its own document limits (its --max-document-* settings)\n")


def test_the_options_are_serve_s_and_the_help_says_http_takes_the_server_s() -> None:
    def helps(configure: Callable[[argparse.ArgumentParser], None]) -> dict[str, Any]:
        parser = argparse.ArgumentParser()
        configure(parser)
        return {a.option_strings[0]: (a.help, a.metavar, a.default) for a in parser._actions
                if a.option_strings and a.option_strings[0] in FLAGS}

    assert helps(translate_file.configure) == helps(config.add_arguments)
    assert len(helps(translate_file.configure)) == len(FLAGS) == 6
    parser = argparse.ArgumentParser()
    translate_file.configure(parser)
    text = " ".join(parser.format_help().split())
    assert "within the server's own document limits (the options below are refused then" in text
    assert "Not taken with --http: the server's own limits apply there." in text


def test_one_declaration_holds_the_server_s_settings_and_the_core_s_limits(
        tmp_path: Path) -> None:
    served = {f.name: f for f in dataclasses.fields(config.ServerConfig)}
    for f in FIELDS:
        assert (served[f.name].default, served[f.name].metadata) == (f.default, f.metadata)
    assert Limits.of(DocumentLimitSettings()) == Limits() == DEFAULT_LIMITS
    assert set(SETTINGS) == {f.name for f in dataclasses.fields(Limits)}
    assert set(SETTINGS.values()) == {f.name for f in FIELDS}
    server = config.ServerConfig(models_dir=tmp_path, max_document_characters=7)
    assert Limits.of(server.document_limits()).characters == 7
