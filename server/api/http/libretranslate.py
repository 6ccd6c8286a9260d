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
from urllib.parse import quote

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from seq2serve.server.api.http.access import Access
from seq2serve.server.api.http.body import Fields, invalid, missing, read_fields
from seq2serve.server.api.http.model_headers import door_call, named
from seq2serve.server.api.routing import Named, agree, pair_of
from seq2serve.server.config import setting_names
from seq2serve.server.core.detect import Detector
from seq2serve.server.core.documents import DEFAULT_LIMITS, SUFFIXES, Limits, media_type
from seq2serve.server.core.documents.jobs import DocumentJobs
from seq2serve.server.core.documents.jobstore import Order
from seq2serve.server.core.errors import InvalidArgument, NotFound, Unavailable
from seq2serve.server.core.markup import extract
from seq2serve.server.core.options import DecodingOptions
from seq2serve.server.core.pieces import Joined
from seq2serve.server.core.translator import (
    ModelInfo,
    SourceTooLong,
    SummarizeRequest,
    TranslateRequest,
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


@dataclass(frozen=True)
class Software:
    """What a request protects (core/placeholders.py, core/glossary.py)."""

    protect_placeholders: bool = True
    glossary: str = ""
    terms: tuple[tuple[str, str], ...] = ()
    do_not_translate: tuple[str, ...] = ()

    @classmethod
    def from_fields(cls, fields: Fields) -> Software:
        return cls(protect_placeholders=fields.boolean("protect_placeholders", True),
                   glossary=fields.text("glossary") or "",
                   terms=tuple(fields.term_pairs("terms")),
                   do_not_translate=tuple(fields.strings("do_not_translate")))


@dataclass(frozen=True)
class Flags:
    """What a text's best translation says beyond its words: a placeholder the model
    lost was put back (`placeholdersRepaired`), a piece of it stopped at its length
    limit (`finishReason: "length"`)."""

    repaired: bool = False
    cut: bool = False

    @classmethod
    def of(cls, bests: Sequence[Joined]) -> Flags:
        """A text's flags from its best (or, for HTML, each of its blocks' best)."""
        return cls(any(b.repaired for b in bests), any(b.finish_reason == "length"
                                                        for b in bests))


@dataclass(frozen=True)
class Pair:
    """A pair as a request names it (`source`, `target`: the core routes it, by the
    rule of every door) and the models that serve it: one, two through English, or
    none (the same language, whose texts come back unchanged)."""

    source: str
    target: str
    models: tuple[str, ...]

    @property
    def last(self) -> str:
        """The model that writes the answer ("" for none)."""
        return self.models[-1] if self.models else ""


@dataclass
class Catalog:
    """What this door derives from the served models, for one registry generation
    (Translator.generation): rebuilt when the models change, never frozen at the
    first request."""

    generation: int
    models: list[ModelInfo]  # the translation models
    pairs: dict[tuple[str, str], Pair]
    names: dict[str, str]  # each listed language's English name, no name twice
    detector: Detector | None = None  # built on first use: its language models cost memory

    @property
    def languages(self) -> list[str]:
        return sorted({code for pair in self.pairs for code in pair})


class LibreTranslateApi:
    def __init__(self, translator: Translator, access: Access, settings: LibreSettings,
                 jobs: DocumentJobs | None = None) -> None:
        self.translator = translator
        self.access = access
        self.settings = settings
        self.jobs = jobs  # documents (/translate_file) run as its jobs
        self._catalog: Catalog | None = None

    # -- languages -------------------------------------------------------------------

    def catalog(self) -> Catalog:
        """The served models and pairs (direct or through English, core/registry.py)
        as they are now; Unavailable (503) while the models load."""
        generation = self.translator.generation()
        catalog = self._catalog
        if catalog is None or catalog.generation != generation:
            models = [m for m in self.translator.list_models() if m.task == "translate"]
            pairs = {(r.source_language, r.target_language):
                     Pair(r.source_language, r.target_language, r.models)
                     for r in self.translator.list_routes()}
            codes = sorted({code for pair in pairs for code in pair})
            catalog = self._catalog = Catalog(generation, models, pairs,
                                              self.translator.language_names(codes))
        return catalog

    def pairs(self) -> dict[tuple[str, str], Pair]:
        return self.catalog().pairs

    def _name(self, code: str) -> str:
        """A language's English name (CLDR's, with its script or region), else the code."""
        names = self.catalog().names
        return names.get(code) or self.translator.language_names([code])[code]

    def detector(self) -> Detector:
        catalog = self.catalog()
        if catalog.detector is None:
            # Every served language, so that a text in a language that is only a
            # target is named as such ("fr is not supported"), not mistaken for another.
            # (Those the identifier knows: a multilingual model's may include more.)
            catalog.detector = Detector([code for code in catalog.languages
                                         if Detector.can_identify(code)])
        return catalog.detector

    async def languages(self, request: Request) -> Response:
        # Every target reachable from each language, through English too (as
        # LibreTranslate lists its pivoted pairs); a language is not its own target.
        catalog = self.catalog()
        return JSONResponse([
            {"code": code, "name": self._name(code),
             "targets": sorted(t for s, t in catalog.pairs if s == code)}
            for code in catalog.languages])

    async def frontend_settings(self, request: Request) -> Response:
        pairs = self.pairs()
        target = sorted(t for _, t in pairs)[0] if pairs else "en"
        return JSONResponse({
            "charLimit": self.settings.char_limit,
            "frontendTimeout": self.settings.frontend_timeout_ms,
            "apiKeys": self.access.uses_keys,
            "keyRequired": self.access.require_key,
            "suggestions": self.settings.suggestions,
            "filesTranslation": True,
            "supportedFilesFormat": list(SUFFIXES),
            "language": {"source": {"code": "auto", "name": "Auto Detect"},
                         "target": {"code": target, "name": self._name(target)}},
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
        software = Software.from_fields(fields)
        self._check_sizes(texts)
        detected = await self._sources(texts, source)
        translated, flags, models = await self._translate_flagged(
            texts, [d[0] for d in detected], target, text_format, alternatives, software,
            wanted)
        repaired, cut = [f.repaired for f in flags], [f.cut for f in flags]
        best = [options[0] for options in translated]
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
            alts = [_unique(options[1:], options[0]) for options in translated]
            body["alternatives"] = alts if as_list else alts[0]
        if source == "auto":
            found = [{"confidence": confidence, "language": language}
                     for language, confidence in detected]
            body["detectedLanguage"] = found if as_list else found[0]
        return JSONResponse(body)

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

    async def _sources(self, texts: Sequence[str], source: str) -> list[tuple[str, float]]:
        """Each text's source language (as given: the core routes it; else the
        detected one, a listed code) and the confidence in it (100 when given)."""
        sources = {s for s, _ in self.pairs()}
        if source != "auto":
            if self.translator.language_code(source) not in sources:
                raise invalid(f"{source[:16]} is not supported")
            return [(source, 100.0)] * len(texts)
        detector = self.detector()
        found = await asyncio.get_running_loop().run_in_executor(
            None, lambda: [detector.detect(text) for text in texts])
        default = sorted(sources)[0] if sources else "en"
        return [(d[0].language, float(d[0].confidence)) if d else (default, 0.0)
                for d in found]

    def _pair(self, source: str, target: str, wanted: Named | None = None) -> Pair:
        """The pair as the core routes it (the rule of every door), or LibreTranslate's
        400 where nothing serves it. LibreTranslate's API names no model: a model the
        headers name must be the one that serves the pair (a chain's "a+b")."""
        try:
            route = self.translator.route(source, target)
        except NotFound:
            listed = self.translator.language_code(target)
            if listed not in {t for _, t in self.pairs()}:
                raise invalid(f"{target[:16]} is not supported") from None
            raise invalid(f"{self._name(listed)} ({target[:16]}) is not available as a target "
                          f"language from {self._name(self.translator.language_code(source))} "
                          f"({source[:16]})") from None
        if wanted is not None and route.models:
            agree("+".join(route.models), wanted.model,
                  f"model for {source[:16]}->{target[:16]}", wanted.model_key)
        return Pair(source, target, route.models)

    async def _translate_flagged(self, texts: Sequence[str], sources: Sequence[str],
                                 target: str, text_format: str, alternatives: int,
                                 software: Software, wanted: Named
                                 ) -> tuple[list[list[str]], list[Flags], list[tuple[str, ...]]]:
        """Every text's best translation and alternatives, what its best's flags say
        and the models that served it; one core request per source language (one in
        all unless `auto` found several)."""
        out: list[list[str]] = [[] for _ in texts]
        flags = [Flags()] * len(texts)
        models: list[tuple[str, ...]] = [() for _ in texts]
        groups: dict[str, list[int]] = {}
        for i, source in enumerate(sources):
            groups.setdefault(source, []).append(i)
        jobs = []
        pairs = []
        for source, members in groups.items():
            pairs.append(self._pair(source, target, wanted))
            jobs.append(self._translate_group(pairs[-1], [texts[i] for i in members],
                                              text_format, alternatives, software))
        for members, pair, results in zip(groups.values(), pairs, await asyncio.gather(*jobs),
                                           strict=True):
            for i, (result, flag) in zip(members, results, strict=True):
                out[i], flags[i], models[i] = result, flag, pair.models
        return out, flags, models

    async def _translate_group(self, pair: Pair, texts: Sequence[str], text_format: str,
                               alternatives: int,
                               software: Software) -> list[tuple[list[str], Flags]]:
        options = self._options(pair.last, alternatives)
        if text_format == "text":
            result = await self.translator.translate(
                self._request(pair, texts, options, software), door_call())
            return [([h.text for h in t.hypotheses], Flags.of([t.hypotheses[0]]))
                    for t in result.translations]
        # HTML: only the text blocks go to the model (a sentence with its inline tags as
        # tag pairs, core/markup.py), all documents' blocks in one request.
        documents = [extract(text) for text in texts]
        runs = [run for document in documents for run in document.texts]
        translated: list[str] = []
        bests: list[Joined] = []
        if runs:
            result = await self.translator.translate(
                self._request(pair, runs, self._options(pair.last, 0), software), door_call())
            bests = [t.hypotheses[0] for t in result.translations]
            translated = [best.text for best in bests]
        rendered, start = [], 0
        for document in documents:
            end = start + len(document.texts)
            rendered.append(([document.render(translated[start:end])],
                             Flags.of(bests[start:end])))
            start = end
        return rendered  # no alternatives for HTML, as LibreTranslate

    @staticmethod
    def _request(pair: Pair, texts: Sequence[str], options: DecodingOptions,
                 software: Software) -> TranslateRequest:
        return TranslateRequest(texts=tuple(texts), model="",
                                source_language=pair.source, target_language=pair.target,
                                options=options,
                                protect_placeholders=software.protect_placeholders,
                                glossary=software.glossary, terms=software.terms,
                                do_not_translate=software.do_not_translate)

    def _options(self, model: str, alternatives: int) -> DecodingOptions:
        if alternatives == 0:
            return DecodingOptions()
        beam = next((b for m in self.catalog().models if m.name == model
                     and isinstance(b := m.defaults.get("beam_size"), int)), 1)
        return DecodingOptions(beam_size=max(beam, alternatives + 1),
                               num_hypotheses=alternatives + 1)

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
        detector = self.detector()
        found = await asyncio.get_running_loop().run_in_executor(
            None, detector.detect, texts[0])
        if not found:  # nothing to go by (digits, symbols): as LibreTranslate answers
            sources = sorted({s for s, _ in self.pairs()})
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
        record = jobs.submit(order, data)
        try:
            view = await jobs.wait(record.id, JOBS_DOOR)
        except asyncio.CancelledError:
            jobs.cancel(record.id)
            raise
        if view.error_kind:
            raise view.error()
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
        if source != "auto":
            await self._sources([""], source)
            self._pair(source, target, wanted)
        elif self.translator.language_code(target) not in {t for _, t in self.pairs()}:
            raise invalid(f"{target[:16]} is not supported")
        software = Software.from_fields(fields)
        return Order(name=name, target_language=target, source_language=source,
                     overwrite=fields.boolean("overwrite", False),
                     protect_placeholders=software.protect_placeholders,
                     glossary=software.glossary, terms=software.terms,
                     do_not_translate=software.do_not_translate, door=JOBS_DOOR), raw

    async def detect_source(self, sample: str) -> str:
        """The language of a file's text (a sample of it), for a job whose source is
        auto: a served source language, as /translate's `source=auto` detects."""
        [(language, _)] = await self._sources([sample], "auto")
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
        try:
            data, stored = self._jobs().output(job_id, JOBS_DOOR)
        except NotFound:
            raise invalid("Invalid filename") from None
        if stored != name:
            raise invalid("Invalid filename")
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



def _unique(alternatives: Sequence[str], best: str) -> list[str]:
    seen = {best}
    out = []
    for text in alternatives:
        if text not in seen:
            seen.add(text)
            out.append(text)
    return out
