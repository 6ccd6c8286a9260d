"""`seq2serve translate-file`: translate a whole file on a running server.

    seq2serve translate-file po/de.po --to de
    seq2serve translate-file messages.pot --to de -o po/de.po
    seq2serve translate-file app.xlf --to de --overwrite -o app.de.xlf
    seq2serve translate-file book.docx --to de --http http://localhost:5000

The file is read here (core/documents/: gettext .po/.pot, XLIFF 1.2 and 2.x,
.srt, .txt, .html, .docx, .pptx, .xlsx, .odt, .odp, .ods, .epub) and its texts go to the server
over gRPC as `seq2serve translate` sends them: in chunks of the server's
`max_texts_per_request`, a few chunks in flight at once so that they batch with
each other there. Entries already translated are kept byte for byte
(`--overwrite` retranslates them); machine translations are marked for review
(`fuzzy`, XLIFF's review states). A progress bar counts the texts on standard
error when it is a terminal.

The file is read within the document limits `seq2serve serve` has, with its flags,
variables and defaults (`--max-document-characters`, `SEQ2SERVE_MAX_DOCUMENT_CHARACTERS`,
…: server/document_settings.py), so that a translator can raise them for a large book
and an operator lower them for a batch job; a file past one is refused naming it.

With `--http URL` the file goes to the server's HTTP door as a document job instead
(file_job.py): the server reads, translates and writes it and keeps the job on disk;
the bar shows the job's progress and the time the server estimates is left. The
server's own document limits apply then: a limit given here is refused, not ignored.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
from tqdm import tqdm  # type: ignore[import-untyped]  # tqdm ships no type information

from seq2serve.server import document_settings
from seq2serve.server.cli.file_job import JobFailed, translate_on_server
from seq2serve.server.client import (
    ModelInfo,
    Seq2ServeClient,
    add_model_arguments,
    add_server_arguments,
    add_software_arguments,
    report_rpc_error,
    software_text,
)
from seq2serve.server.core.documents import (
    SUFFIXES,
    Document,
    DocumentError,
    DocumentTooLarge,
    Limits,
    read_document,
)
from seq2serve.server.core.documents.limits import SETTINGS
from seq2serve.server.core.documents.queueing import DEFAULT_WINDOW, translate_document
from seq2serve.server.settings import SettingsError, env_name, flag_name

PROG = "seq2serve translate-file"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", metavar="FILE",
                        help=f"the file to translate ({', '.join(SUFFIXES)})")
    parser.add_argument("--to", dest="target_language", metavar="LANG", required=True,
                        help="target language")
    parser.add_argument("--from", dest="source_language", metavar="LANG",
                        help="source language: any the server translates from to --to, "
                        "directly or through English (default: what the file says, else "
                        "the server's model for --to; a .po's msgids say nothing: a German "
                        ".po needs --from de)")
    parser.add_argument("-o", "--output", metavar="OUT",
                        help='where to write the translated file, "-" for standard output '
                        "(default: NAME.LANG.SUFFIX beside FILE; a .pot gives NAME.LANG.po)")
    parser.add_argument("--overwrite", action="store_true",
                        help="retranslate entries that are translated already (default: "
                        "keep them byte for byte)")
    add_model_arguments(parser)
    add_server_arguments(parser)
    add_software_arguments(parser)
    parser.add_argument("--no-progress", action="store_true",
                        help="no progress bar (it shows only on a terminal anyway)")
    parser.add_argument("--http", metavar="URL",
                        help="send the file to the server's HTTP door as a document job "
                        "(http://HOST:PORT): read and written there, within the server's "
                        "own document limits (the options below are refused then, their "
                        "variables not read), its progress polled; --model and --beam are "
                        "not taken then")
    parser.add_argument("--api-key", metavar="KEY",
                        help="with --http: the API key (the server's --api-keys)")
    document_settings.add_arguments(parser.add_argument_group(
        "document limits", "What FILE may hold, read here: the limits `seq2serve serve` "
        "has, with its flags, variables and defaults. A file past one is refused, naming "
        "it. Not taken with --http: the server's own limits apply there."))


def run(args: argparse.Namespace) -> int:
    path = Path(args.file)
    try:
        args.software = software_text(args)
    except ValueError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    if args.http:
        return _run_job(args, path)
    try:
        limits = Limits.of(document_settings.from_args(args, os.environ))
    except SettingsError as e:  # in `seq2serve serve`'s words
        for message in e.messages:
            print(f"{PROG}: error: {message}", file=sys.stderr)
        return 2
    try:
        data = path.read_bytes()
        document = read_document(path.name, data, args.target_language, args.overwrite,
                                 limits)
    except OSError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 1
    except DocumentTooLarge as e:
        print(f"{PROG}: error: {e.message} ({_past(e.bound, limits)})", file=sys.stderr)
        return 1
    except DocumentError as e:
        print(f"{PROG}: error: {e.message}", file=sys.stderr)
        return 1
    source = args.source_language or document.source_language.replace("_", "-").split("-")[0]
    try:
        with Seq2ServeClient(args.server, args.timeout) as client:
            if args.wait > 0:
                client.wait_until_serving(args.wait)
            model = _model(client.list_models(), args.model, source, args.target_language,
                           client.list_routes())
            if model is None:
                print(f"{PROG}: error: this server has no translation model "
                      f"{args.model or ''} for {source or '*'} -> {args.target_language}",
                      file=sys.stderr)
                return 1
            output = asyncio.run(_translate(client, document, model, args, source))
    except grpc.RpcError as error:
        return report_rpc_error(PROG, error)
    except (TimeoutError, DocumentError) as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return 1
    written = _write(output, args.output or str(_default_output(path, document,
                                                                args.target_language)))
    print(f"{PROG}: {written}: {document.tally.describe()}", file=sys.stderr)
    return 0


def _run_job(args: argparse.Namespace, path: Path) -> int:
    """The file as a document job on the server's HTTP door (file_job.py)."""
    if given := document_settings.given(args):
        print(f"{PROG}: error: {given[0]} is not taken with --http: the server reads the "
              "file within its own document limits (its --max-document-* settings)",
              file=sys.stderr)
        return 2
    if args.model or args.beam is not None:
        print(f"{PROG}: error: --model and --beam are not taken with --http (the server "
              "routes the pair and decodes with its model's defaults)", file=sys.stderr)
        return 2
    try:
        translated = translate_on_server(args, path)
    except (OSError, JobFailed) as e:  # the file unreadable, the server's refusal
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 1
    default = (path.with_name(translated.name) if translated.name != path.name
               else path.with_name(f"{path.stem}.{args.target_language}{path.suffix}"))
    written = _write(translated.data, args.output or str(default))
    print(f"{PROG}: {written}: {translated.report}", file=sys.stderr)
    return 0


def _past(bound: str, limits: Limits) -> str:
    """The setting a file went past, its value here and how to raise it."""
    name = SETTINGS[bound]
    return (f"{flag_name(name)} {getattr(limits, bound)}; raise it, or {env_name(name)}, "
            "to read this file")


def _model(models: Sequence[ModelInfo], name: str | None, source: str, target: str,
           routes: Sequence[tuple[str, str, tuple[str, ...]]] = ()) -> ModelInfo | None:
    """The model the server will pick: by name, else by language pair (a
    multilingual model's too); for a pair served through English, the chain's last
    model (its limits apply to the texts)."""
    translators = [m for m in models if m.task == "translate"]
    if name:
        return next((m for m in translators if m.name == name), None)
    if source:
        for route_source, route_target, names in routes:
            if (route_source, route_target) == (source, target) and names:
                return next((m for m in translators if m.name == names[-1]), None)
        # Codes the routes do not list as written (zh-TW, iw, en-US) may still reach a
        # model's languages: the server routes the pair by its rule (or refuses it), and
        # the limits read here are the server's, the same for every model.
        return translators[0] if translators else None
    return next((m for m in translators if m.target_language == target
                 and source in ("", m.source_language)), None)


async def _translate(client: Seq2ServeClient, document: Document, model: ModelInfo,
                     args: argparse.Namespace, source: str) -> bytes:
    # A pair is asked for as such (the server routes it: a chain through English, a
    # multilingual model's languages); a named model by its name.
    by_pair = bool(source) and not args.model
    loop = asyncio.get_running_loop()
    with ThreadPoolExecutor(DEFAULT_WINDOW) as pool, \
            tqdm(unit="text", desc=Path(args.file).name, file=sys.stderr,
                 disable=True if args.no_progress else None) as bar:

        def call(texts: Sequence[str]) -> list[str]:
            answers = client.translate(
                list(texts), args.model or (None if by_pair else model.name),
                source_language=source or None,
                target_language=args.target_language,
                software=args.software, beam_size=args.beam)
            return [nbest[0].text for nbest in answers]

        async def translate(texts: Sequence[str]) -> list[str]:
            return await loop.run_in_executor(pool, call, texts)

        def progress(done: int, total: int) -> None:
            bar.total = total
            bar.update(done - bar.n)

        limits = model.limits
        return await translate_document(
            document, translate, progress=progress,
            chunk_size=max(1, int(limits.get("max_texts_per_request", 32))),
            max_chars=int(limits["max_text_chars"]) if "max_text_chars" in limits else None,
            busy=lambda e: (isinstance(e, grpc.Call)
                            and e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED))


def _default_output(path: Path, document: Document, target: str) -> Path:
    if document.name != path.name:  # a .pot: NAME.LANG.po
        return path.with_name(document.name)
    return path.with_name(f"{path.stem}.{target}{path.suffix}")


def _write(data: bytes, output: str) -> str:
    if output == "-":
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
        return "standard output"
    target = Path(output)
    # Whole or not at all: a failed write never leaves half a catalog behind. mkstemp
    # makes the file 0600: give it the mode the file it replaces had, else the one a
    # plain open() would (0666 less the umask), as a translator's other files have.
    mode = target.stat().st_mode & 0o7777 if target.exists() else 0o666 & ~_umask()
    fd, temporary = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.chmod(temporary, mode)
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return str(target)


def _umask() -> int:
    current = os.umask(0)  # the only way to read it: set, then restore at once
    os.umask(current)
    return current
