"""LibreTranslate's HTTP API over the application core, so that the tools that
speak it (Weblate, Mastodon, Discourse, browser extensions, libretranslatepy)
work unchanged: /translate, /languages, /detect, /translate_file,
/download_file, /frontend/settings, /suggest, plus /summarize in the same style.

A list `q` is one core request: its texts batch with every other request's
(LibreTranslate translates them one at a time).
"""

from __future__ import annotations

import asyncio
import json
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import PurePath
from typing import TypedDict
from urllib.parse import quote

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from seq2serve.server.api.http.access import Access
from seq2serve.server.api.http.body import Fields, invalid, missing, read_fields
from seq2serve.server.api.http.model_headers import door_call, named, served_by
from seq2serve.server.api.routing import Named, agree, pair_of
from seq2serve.server.config import setting_names
from seq2serve.server.core.documents import DEFAULT_LIMITS, SUFFIXES, Limits, media_type
from seq2serve.server.core.documents.jobs import DocumentJobs
from seq2serve.server.core.documents.jobstore import Order
from seq2serve.server.core.errors import InvalidArgument, NotFound, Unavailable
from seq2serve.server.core.texts import AUTO, TextFormat, TextService, TextsRequest
from seq2serve.server.core.translator import (
    SourceTooLong,
    SummarizeRequest,
    Translator,
)

# On a /summarize answer whose texts were cut to the model's input: how many were.
TRUNCATED_HEADER = "X-Seq2serve-Truncated"
# The door of the jobs this API submits (core/documents/jobstore.py: Order.door).
JOBS_DOOR = "v1"


@dataclass(frozen=True)
class LibreSettings:
    char_limit: int  # per text, as LibreTranslate's --char-limit
    batch_limit: int  # texts per request
    alternatives_limit: int  # the widest n-best beyond the best
    frontend_timeout_ms: int = 500
    suggestions: bool = False
    document_limits: Limits = DEFAULT_LIMITS  # one /translate_file upload's (413 past them)


class _Software(TypedDict):
    protect_placeholders: bool
    glossary: str
    terms: tuple[tuple[str, str], ...]
    do_not_translate: tuple[str, ...]


def _software(fields: Fields) -> _Software:
    """What a request protects (core/placeholders.py, core/glossary.py)."""
    return {"protect_placeholders": fields.boolean("protect_placeholders", True),
            "glossary": fields.text("glossary") or "",
            "terms": tuple(fields.term_pairs("terms")),
            "do_not_translate": tuple(fields.strings("do_not_translate"))}


class LibreTranslateApi:
    def __init__(self, translator: Translator, access: Access, settings: LibreSettings,
                 texts: TextService | None = None, jobs: DocumentJobs | None = None) -> None:
        self.translator = translator
        self.access = access
        self.settings = settings
        self.jobs = jobs  # documents (/translate_file) run as its jobs
        # One for every door: its detector holds each served language's model.
        self.texts = texts or TextService(translator)
        self.catalog = self.texts.catalog

    # -- languages -------------------------------------------------------------------

    async def languages(self, request: Request) -> Response:
        # LibreTranslate's fields (every target reachable from each language, through
        # English too, as LibreTranslate lists its pivoted pairs), then three of ours:
        # whether all its models are loaded now, the targets whose models are, and the
        # targets whose model an operator unloaded (refused until it is loaded again).
        return JSONResponse([
            {"code": language.code, "name": language.name, "targets": list(language.targets),
             "loaded": language.loaded, "loadedTargets": list(language.loaded_targets),
             "unavailableTargets": list(language.unavailable_targets)}
            for language in self.catalog.languages()])

    async def frontend_settings(self, request: Request) -> Response:
        targets = self.catalog.listing().targets
        target = targets[0] if targets else "en"
        return JSONResponse({
            "charLimit": self.settings.char_limit,
            "frontendTimeout": self.settings.frontend_timeout_ms,
            "apiKeys": self.access.uses_keys,
            "keyRequired": self.access.require_key,
            "suggestions": self.settings.suggestions,
            "filesTranslation": True,
            "supportedFilesFormat": list(SUFFIXES),
            "language": {"source": {"code": "auto", "name": "Auto Detect"},
                         "target": {"code": target, "name": self.catalog.name(target)}},
        })

    # -- translate -------------------------------------------------------------------

    async def translate(self, request: Request) -> Response:
        fields = await read_fields(request)
        texts, as_list = fields.texts("q")
        self._admit(request, fields, cost=len(texts))
        wanted = named(request)
        source, target = _source_target(fields, wanted)
        text_format = fields.text("format") or "text"
        if text_format not in ("text", "html"):
            raise invalid(f"{text_format[:64]} format is not supported")
        alternatives = fields.integer("alternatives", 0)
        if not 0 <= alternatives <= self.settings.alternatives_limit:
            raise invalid(f"Invalid request: alternatives parameter must be between 0 and "
                          f"{self.settings.alternatives_limit}, got {alternatives}")
        self._check_sizes(texts)
        if source != AUTO and wanted.model:
            self._check_pair(source, target, wanted)
        answers = await self.texts.translate(TextsRequest(
            texts=tuple(texts), source_language=source, target_language=target,
            text_format=TextFormat(text_format), alternatives=alternatives,
            **_software(fields)), door_call())
        repaired, cut = [a.repaired for a in answers], [a.cut for a in answers]
        models = [a.models for a in answers]
        best = [a.best for a in answers]
        body: dict[str, object] = {"translatedText": best if as_list else best[0]}
        if any(repaired):  # LibreTranslate's own answer otherwise, field for field
            body["placeholdersRepaired"] = repaired if as_list else repaired[0]
        if any(cut):  # a piece stopped at its length limit: said, never silent
            reasons = ["length" if c else "eos" for c in cut]
            body["finishReason"] = reasons if as_list else reasons[0]
        if any(len(m) > 1 for m in models):
            # Through English: which models served each text. Only then, so that a direct
            # answer stays LibreTranslate's, field for field (its clients read the keys
            # they know: libretranslatepy takes "translatedText" alone).
            body["models"] = [list(m) for m in models] if as_list else list(models[0])
        if alternatives > 0:
            alts = [list(a.translations[1:]) for a in answers]
            body["alternatives"] = alts if as_list else alts[0]
        if source == AUTO:
            found = [{"confidence": a.confidence, "language": a.source_language}
                     for a in answers]
            body["detectedLanguage"] = found if as_list else found[0]
        return JSONResponse(body)

    def _check_pair(self, source: str, target: str, wanted: Named) -> None:
        """The pair as the core routes it, or LibreTranslate's 400 (the catalog's).
        LibreTranslate's API names no model: a model the headers name must be the one
        that serves the pair (a chain's "a+b")."""
        self.catalog.check_source(source)  # "es is not supported", as LibreTranslate says
        pair = self.catalog.pair(source, target)
        if wanted.model and pair.models:
            agree("+".join(pair.models), wanted.model,
                  f"model for {source[:16]}->{target[:16]}", wanted.model_key)

    def _check_sizes(self, texts: Sequence[str]) -> None:
        # LibreTranslate's words, then the setting that raises the limit here.
        if len(texts) > self.settings.batch_limit:
            raise invalid(f"Invalid request: request ({len(texts)}) exceeds text limit "
                          f"({self.settings.batch_limit}); the limit is "
                          f"{setting_names('max_texts_per_request')}")
        for text in texts:
            if len(text) > self.settings.char_limit:
                raise invalid(f"Invalid request: request ({len(text)}) exceeds character "
                              f"limit ({self.settings.char_limit}); the limit is "
                              f"{setting_names('max_text_chars')}")

    # -- summarize, detect -----------------------------------------------------------

    async def summarize(self, request: Request) -> Response:
        """A text longer than the model reads is refused (400 naming `q` and the limit),
        as gRPC, /v1 and the CLI refuse it, unless `truncate` is set; then it is cut,
        and the answer says so: `truncated`, `tokensKept`, `tokensDropped` for every
        text, and the header `X-Seq2serve-Truncated` (how many texts were cut)."""
        fields = await read_fields(request)
        texts, as_list = fields.texts("q")
        self._admit(request, fields, cost=len(texts))
        self._check_sizes(texts)
        model = agree(fields.text("model") or "", named(request).model, "model",
                      named(request).model_key)
        truncate = fields.boolean("truncate", False)
        try:
            result = await self.translator.summarize(
                SummarizeRequest(texts=tuple(texts), model=model, truncate=truncate), door_call())
        except NotFound:
            names = [m.name for m in self.translator.list_models() if m.task == "summarize"]
            wanted = f"no summarize model {model[:64]!r}" if model else "no summarize model"
            raise InvalidArgument(f"this server has {wanted}; summarize models: "
                                  f"{', '.join(names) or 'none'}") from None
        except SourceTooLong as e:
            raise InvalidArgument(e.naming(f"q[{e.index}]" if as_list else "q",
                                           "truncate")) from None
        summaries = result.summaries

        def each(values: list[object]) -> object:
            return values if as_list else values[0]

        body = {"summary": each([s.hypotheses[0].text for s in summaries]),
                "truncated": each([s.truncated for s in summaries]),
                "tokensKept": each([s.kept_tokens for s in summaries]),
                "tokensDropped": each([s.source_tokens - s.kept_tokens for s in summaries])}
        cut = sum(s.truncated for s in summaries)
        return JSONResponse(body, headers={TRUNCATED_HEADER: str(cut)} if cut else None)

    async def detect(self, request: Request) -> Response:
        fields = await read_fields(request)
        texts, _ = fields.texts("q")
        self._admit(request, fields, cost=1)
        self._check_sizes(texts[:1])
        [found] = await self.texts.detect(texts[:1])
        if not found:  # nothing to go by (digits, symbols): as LibreTranslate answers
            sources = self.catalog.listing().sources
            return JSONResponse([{"confidence": 0.0, "language": sources[0] if sources
                                  else "en"}])
        return JSONResponse([{"confidence": float(d.confidence), "language": d.language}
                             for d in found])

    async def suggest(self, request: Request) -> Response:
        return JSONResponse({"error": "Suggestions are disabled on this server."},
                            status_code=403)

    # -- files -----------------------------------------------------------------------

    async def translate_file(self, request: Request) -> Response:
        """A whole file (core/documents/): .txt, .html, gettext .po/.pot, XLIFF, .srt,
        .docx, .pptx, .odt, .odp, .epub, read within `document_limits` (413 past them).
        The file is a document job (core/documents/jobs.py) that this answer waits for:
        its texts are queued together as ordinary core requests, so placeholders, markup
        and glossaries are protected as in /translate. `overwrite` (a seq2serve field)
        retranslates entries that are translated already. A client that leaves (or
        the server's --http-timeout-s) ends the job."""
        jobs = self._jobs()
        order, data = await self.file_order(request)
        record = await jobs.submit(order, data)
        try:
            view = await jobs.wait(record.id, JOBS_DOOR)
        except asyncio.CancelledError:
            jobs.cancel(record.id)
            raise
        if view.error_kind:
            raise view.error()
        served_by(view.model)
        return JSONResponse({"translatedFileUrl": self.download_url(request, record.id,
                                                                    view.output_name)})

    async def file_order(self, request: Request) -> tuple[Order, bytes]:
        """A /translate_file form (the caller admitted, the fields checked) as a job's
        order and the uploaded bytes: LibreTranslate's fields, and seq2serve's
        `overwrite` and software fields."""
        fields = await read_fields(request)
        self._admit(request, fields, cost=1)
        upload = fields.files.get("file")
        if upload is None:
            raise missing("file")
        wanted = named(request)
        source, target = _source_target(fields, wanted)
        name = PurePath(upload.filename or "file.txt").name
        if PurePath(name).suffix.lower() not in SUFFIXES:
            raise invalid("Invalid request: file format not supported")
        raw = await upload.read()
        if not raw:
            raise invalid("Invalid request: empty file")
        # The pair is checked now (LibreTranslate's 400s); what the file says and the
        # language detected where `source` is auto, by the job.
        if source != AUTO:
            self._check_pair(source, target, wanted)
        else:
            self.catalog.check_target(target)
        software = _software(fields)
        return Order(name=name, target_language=target, source_language=source,
                     overwrite=fields.boolean("overwrite", False),
                     protect_placeholders=software["protect_placeholders"],
                     glossary=software["glossary"], terms=software["terms"],
                     do_not_translate=software["do_not_translate"], door=JOBS_DOOR), raw

    async def detect_source(self, sample: str) -> str:
        """The language of a file's text (a sample of it), for a job whose source is
        auto: a served source language, as /translate's `source=auto` detects."""
        [(language, _)] = await self.texts.sources([sample], AUTO)
        return language

    @staticmethod
    def download_url(request: Request, job_id: str, name: str) -> str:
        # Any file name in one path segment (RFC 3986): spaces, "#", "?", "%", non-ASCII
        # letters percent-encoded, "/" too; Starlette decodes it on the way back in.
        return str(request.url_for("download_file",
                                   filename=quote(f"{job_id}.{name}", safe="")))

    async def download_file(self, request: Request) -> Response:
        """A finished job's file, until the job expires (--job-ttl-s)."""
        job_id, _, name = request.path_params["filename"].partition(".")
        jobs = self._jobs()
        try:
            model = jobs.record(job_id, JOBS_DOOR).model
            data, stored = await jobs.output(job_id, JOBS_DOOR)  # read off the event loop
        except NotFound:
            raise invalid("Invalid filename") from None
        if stored != name:
            raise invalid("Invalid filename")
        served_by(model)
        return Response(data, media_type=media_type(name),
                        headers={"Content-Disposition": content_disposition(name)})

    def _jobs(self) -> DocumentJobs:
        if self.jobs is None:
            raise Unavailable("this server translates no files (no document jobs)")
        return self.jobs

    # -- access ----------------------------------------------------------------------

    def _admit(self, request: Request, fields: Fields, cost: int) -> None:
        key = _api_key(fields) or request.headers.get("authorization", "").removeprefix(
            "Bearer ").strip() or None
        peer = request.client.host if request.client is not None else ""
        self.access.admit(peer, request.headers.get("x-forwarded-for"), key, cost)


def content_disposition(name: str) -> str:
    """An attachment named `name` as RFC 6266 says: `filename*` (RFC 8187: UTF-8,
    percent-encoded) for every client that reads it, beside a plain ASCII `filename`
    for those that do not: accents dropped ("für" -> "fur"), any other character that
    is not printable ASCII, and a quote or backslash, as "_"."""
    plain = "".join(c if c.isascii() and c.isprintable() and c not in '"\\' else "_"
                    for c in unicodedata.normalize("NFKD", name)
                    if not unicodedata.combining(c))
    encoded = quote(name, safe="")
    return f'attachment; filename="{plain or "file"}"; filename*=UTF-8\'\'{encoded}'


def _api_key(fields: Fields) -> str | None:
    """`api_key` as LibreTranslate takes it: any value, never a type error (a server
    without keys ignores it, whatever it is); a false one (absent, "", 0) is no key, as
    its `if ak`; another non-string is compared as its JSON text (`123`)."""
    value = fields.values.get("api_key")
    if isinstance(value, list) and not fields.is_json and value:
        value = value[0]  # a repeated field: Werkzeug's `values.get` takes the first
    if not value:
        return None
    return value if isinstance(value, str) else json.dumps(value)


def _source_target(fields: Fields, wanted: Named) -> tuple[str, str]:
    """`source` and `target`, each the body's or else the pair header's (a conflict
    is a 400 naming both); either missing from both is LibreTranslate's 400."""
    source, target = pair_of(fields.text("source") or "", fields.text("target") or "",
                             wanted, ("source", "target"))
    for name, value in (("source", source), ("target", target)):
        if not value:
            raise missing(name)
    return source, target
