"""DeepL's API v2 (and the v3 glossary endpoints the current official clients call) over
the application core, so that the tools and libraries that speak it (the `deepl`
Python library, deepl-node, Weblate, CAT-tool plugins) work against this server with
its URL: /v2/translate, /v2/languages, /v2/usage, /v2/glossary-language-pairs,
/v2/glossaries, /v3/glossaries. Documents (/v2/document) are served by their own module.

This door only converts: DeepL's fields to the core's `TextsRequest` (core/texts.py),
language codes to the served ones and back (regional targets EN-GB, PT-BR, ZH-HANT...
to what the served models have, listed as DeepL lists them), glossaries to the core's
store (core/glossary.py). Callers and errors are DeepL's (deepl_auth.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response

from seq2serve.server.api.http.body import Fields, JsonValue, read_fields
from seq2serve.server.api.http.deepl_auth import DeepLAccess
from seq2serve.server.core.catalog import UnsupportedLanguage
from seq2serve.server.core.errors import InvalidArgument, NotFound, echo
from seq2serve.server.core.glossary import (
    Dictionary,
    GlossaryStore,
    StoredGlossary,
    parse_entries,
)
from seq2serve.server.core.markup import HTML_RULES, xml_rules
from seq2serve.server.core.pieces import TooLongForOnePiece
from seq2serve.server.core.texts import (
    AUTO,
    Splitting,
    TextFormat,
    TextService,
    TextsRequest,
)

# The regional targets DeepL lists instead of their language (its clients refuse a bare
# EN or PT target), with DeepL's names for them.
VARIANTS: dict[str, tuple[tuple[str, str], ...]] = {
    "en": (("EN-GB", "English (British)"), ("EN-US", "English (American)")),
    "pt": (("PT-BR", "Portuguese (Brazilian)"), ("PT-PT", "Portuguese (European)")),
    "zh": (("ZH-HANS", "Chinese (simplified)"), ("ZH-HANT", "Chinese (traditional)")),
}
_SPLITTING = {"0": Splitting.OFF, "1": Splitting.ON, "nonewlines": Splitting.NO_NEWLINES}
# On a /v2/translate answer: the fields it was given that nothing here acts on
# (formality: no served model offers it; context).
IGNORED_HEADER = "X-Seq2serve-Ignored"


def deepl_code(code: str) -> str:
    """A served code as DeepL spells a language: upper case (en -> EN, zh-Hant -> ZH-HANT)."""
    return code.replace("_", "-").upper()


class DeepLApi:
    def __init__(self, texts: TextService, access: DeepLAccess, store: GlossaryStore) -> None:
        self.texts = texts
        self.catalog = texts.catalog
        self.access = access
        self.store = store

    def register(self, route: Callable[..., None]) -> None:
        """Add the endpoints with `route(path, handler, methods, doc=..., encode=...)`."""
        from seq2serve.server.api.http.deepl_auth import error_response as encode

        for path, handler, methods, doc in (
            ("/v2/translate", self.translate, ["POST"], "Translate text (DeepL API v2)"),
            ("/v2/languages", self.languages, ["GET", "POST"], "Languages (DeepL API v2)"),
            ("/v2/usage", self.usage, ["GET", "POST"], "Characters used (DeepL API v2)"),
            ("/v2/glossary-language-pairs", self.glossary_pairs, ["GET"],
             "Glossary language pairs (DeepL API v2)"),
            ("/v2/glossaries", self.create_v2, ["POST"], "Create a glossary (DeepL API v2)"),
            ("/v2/glossaries", self.list_v2, ["GET"], "List glossaries (DeepL API v2)"),
            ("/v2/glossaries/{glossary_id}", self.get_v2, ["GET"], "A glossary (DeepL v2)"),
            ("/v2/glossaries/{glossary_id}", self.delete, ["DELETE"],
             "Delete a glossary (DeepL API v2)"),
            ("/v2/glossaries/{glossary_id}/entries", self.entries_v2, ["GET"],
             "A glossary's entries as TSV (DeepL API v2)"),
            ("/v3/glossaries", self.create_v3, ["POST"], "Create a glossary (DeepL API v3)"),
            ("/v3/glossaries", self.list_v3, ["GET"], "List glossaries (DeepL API v3)"),
            ("/v3/glossaries/{glossary_id}", self.get_v3, ["GET"], "A glossary (DeepL v3)"),
            ("/v3/glossaries/{glossary_id}", self.delete, ["DELETE"],
             "Delete a glossary (DeepL API v3)"),
            ("/v3/glossaries/{glossary_id}/entries", self.entries_v3, ["GET"],
             "A glossary dictionary's entries (DeepL API v3)"),
        ):
            route(path, handler, methods, name=f"deepl_{handler.__name__}", doc=doc,
                  encode=encode)

    # -- translate -------------------------------------------------------------------

    async def translate(self, request: Request) -> Response:
        fields = await read_fields(request)
        texts = _texts(fields)
        caller = self.access.admit(request, fields, cost=len(texts))
        target = _text(fields, "target_lang")
        if not target:
            raise InvalidArgument("Parameter 'target_lang' not specified.")
        source = _text(fields, "source_lang")
        tag_handling = (_text(fields, "tag_handling") or "").lower()
        if tag_handling not in ("", "html", "xml"):
            raise InvalidArgument(f"Value for 'tag_handling' not supported: {echo(tag_handling)}"
                                  "; html or xml")
        glossary = _text(fields, "glossary_id")
        if glossary and not source:
            raise InvalidArgument("Use of a glossary requires the source_lang parameter to "
                                  "be specified.")
        splitting = _text(fields, "split_sentences") or ("nonewlines" if tag_handling else "1")
        if splitting not in _SPLITTING:
            raise InvalidArgument(f"Value for 'split_sentences' not supported: "
                                  f"{echo(splitting)}; 0, 1 or nonewlines")
        markup = HTML_RULES
        if tag_handling == "xml":
            markup = xml_rules(frozenset(_tags(fields, "ignore_tags")),
                               frozenset(_tags(fields, "non_splitting_tags")),
                               frozenset(_tags(fields, "splitting_tags")),
                               fields.boolean("outline_detection", True))
        fields.boolean("preserve_formatting", False)  # checked; the core keeps every space
        formality = (_text(fields, "formality") or "default").lower()
        if source:
            self._check_code(source, "source")
        if glossary:
            self._check_glossary(glossary, source or "", target)
        characters = sum(len(t) for t in texts)
        reserved = self.access.reserve(caller, characters)
        try:
            answers = await self.texts.translate(TextsRequest(
                texts=tuple(texts), source_language=source.lower() if source else AUTO,
                target_language=target.lower(),
                text_format=TextFormat(tag_handling or "text"), markup=markup,
                glossary=glossary or "", formality=formality,
                splitting=_SPLITTING[splitting]))
        except UnsupportedLanguage as e:
            self.access.refund(reserved)
            raise InvalidArgument(f"Value for '{e.role}_lang' not supported.") from None
        except TooLongForOnePiece as e:
            self.access.refund(reserved)
            what = (f"its intermediate translation into {e.pivot} (the second leg's "
                    "input) is" if e.pivot else "it is")
            raise InvalidArgument(
                f"Value for 'split_sentences' 0 cannot be kept for text[{e.index}]: {what} "
                f"{e.tokens} tokens and one piece may have at most {e.limit} (what the "
                "model reads, within its output limit, so that the answer is whole); "
                "send split_sentences 1 or nonewlines, or a shorter text") from None
        except BaseException:
            self.access.refund(reserved)
            raise
        billed = fields.boolean("show_billed_characters", False)
        # Accepted as DeepL accepts them, but nothing here acts on them: said, not silent.
        ignored = [name for name, given in (
            ("formality", formality != "default"), ("context", bool(_text(fields, "context"))))
            if given]
        return JSONResponse({"translations": [
            {"detected_source_language": deepl_code(a.source_language), "text": a.best,
             **({"billed_characters": len(text)} if billed else {})}
            for a, text in zip(answers, texts, strict=True)]},
            headers={IGNORED_HEADER: ", ".join(ignored)} if ignored else None)

    def _check_code(self, code: str, role: str) -> None:
        listing = self.catalog.listing()
        served = listing.sources if role == "source" else listing.targets
        if self.catalog.code(code.lower()) not in served:
            raise InvalidArgument(f"Value for '{role}_lang' not supported.")

    def _check_glossary(self, glossary_id: str, source: str, target: str) -> None:
        stored = self.store.get(glossary_id)
        if stored is None:
            raise NotFound(f"Glossary not found: {echo(glossary_id)}")
        pair = (self.catalog.code(source.lower()), self.catalog.code(target.lower()))
        if stored.dictionary(*pair) is None:
            raise InvalidArgument(f"The glossary's language pairs ({_pairs(stored)}) do not "
                                  f"include {deepl_code(pair[0])}->{deepl_code(pair[1])}")

    # -- languages, usage ------------------------------------------------------------

    async def languages(self, request: Request) -> Response:
        fields = await read_fields(request)
        self.access.admit(request, fields)
        kind = (_text(fields, "type") or "source").lower()
        if kind not in ("source", "target"):
            raise InvalidArgument(f"Value for 'type' not supported: {echo(kind)}; source or "
                                  "target")
        listing = self.catalog.listing()
        if kind == "source":
            return JSONResponse([{"language": deepl_code(c), "name": self.catalog.name(c)}
                                 for c in listing.sources])
        out: list[dict[str, JsonValue]] = []
        for code in listing.targets:
            variants = VARIANTS.get(code.replace("_", "-").split("-")[0].lower())
            named = [(v, n) for v, n in variants or ()
                     if self.catalog.code(v.lower()) == code] if variants else []
            for language, name in named or [(deepl_code(code), self.catalog.name(code))]:
                # No served model offers formality (DeepL's `formality` is accepted and
                # ignored here, as DeepL does for languages without it).
                out.append({"language": language, "name": name, "supports_formality": False})
        return JSONResponse(out)

    async def usage(self, request: Request) -> Response:
        fields = await read_fields(request)
        count = self.access.usage(self.access.admit(request, fields))
        return JSONResponse({"character_count": count.character_count,
                             "character_limit": count.character_limit})

    # -- glossaries ------------------------------------------------------------------

    async def glossary_pairs(self, request: Request) -> Response:
        self.access.admit(request, await read_fields(request))
        return JSONResponse({"supported_languages": [
            {"source_lang": s.lower(), "target_lang": t.lower()}
            for s, t in sorted(self.catalog.listing().pairs)]})

    async def create_v2(self, request: Request) -> Response:
        fields = await read_fields(request)
        self.access.admit(request, fields)
        dictionary = self._dictionary(fields.values, "")
        stored = self.store.create(_text(fields, "name") or "", [dictionary])
        return JSONResponse(_v2_info(stored), status_code=201)

    async def create_v3(self, request: Request) -> Response:
        fields = await read_fields(request)
        self.access.admit(request, fields)
        dictionaries = fields.values.get("dictionaries")
        if not isinstance(dictionaries, list) or not all(isinstance(d, dict)
                                                          for d in dictionaries):
            raise InvalidArgument("dictionaries must be a list of objects with source_lang, "
                                  "target_lang, entries and entries_format")
        made = [self._dictionary(d, f"dictionaries[{i}].")
                for i, d in enumerate(dictionaries) if isinstance(d, dict)]
        stored = self.store.create(_text(fields, "name") or "", made)
        return JSONResponse(_v3_info(stored), status_code=201)

    def _dictionary(self, values: Mapping[str, JsonValue], prefix: str) -> Dictionary:
        get = {k: v for k, v in values.items() if isinstance(v, str)}
        source, target = get.get("source_lang", ""), get.get("target_lang", "")
        if not source or not target:
            raise InvalidArgument(f"{prefix}source_lang and {prefix}target_lang are required")
        pair = (self.catalog.code(source.lower()), self.catalog.code(target.lower()))
        if pair not in self.catalog.listing().pairs:
            raise InvalidArgument(f"Unsupported glossary language pair: {deepl_code(source)}"
                                  f"->{deepl_code(target)}; GET /v2/glossary-language-pairs")
        entries = parse_entries(get.get("entries", ""), get.get("entries_format", "tsv"))
        return Dictionary(pair[0], pair[1], tuple(entries))

    def _stored(self, request: Request) -> StoredGlossary:
        glossary_id = request.path_params["glossary_id"]
        stored = self.store.get(glossary_id)
        if stored is None:
            raise NotFound(f"Glossary not found: {echo(glossary_id)}")
        return stored

    async def list_v2(self, request: Request) -> Response:
        self.access.admit(request, await read_fields(request))
        return JSONResponse({"glossaries": [_v2_info(g) for g in self.store.list()
                                            if len(g.dictionaries) == 1]})

    async def list_v3(self, request: Request) -> Response:
        self.access.admit(request, await read_fields(request))
        return JSONResponse({"glossaries": [_v3_info(g) for g in self.store.list()]})

    async def get_v2(self, request: Request) -> Response:
        self.access.admit(request, await read_fields(request))
        return JSONResponse(_v2_info(self._stored(request)))

    async def get_v3(self, request: Request) -> Response:
        self.access.admit(request, await read_fields(request))
        return JSONResponse(_v3_info(self._stored(request)))

    async def entries_v2(self, request: Request) -> Response:
        self.access.admit(request, await read_fields(request))
        stored = self._stored(request)
        return PlainTextResponse(_tsv(stored.dictionaries[0].entries),
                                 media_type="text/tab-separated-values")

    async def entries_v3(self, request: Request) -> Response:
        fields = await read_fields(request)
        self.access.admit(request, fields)
        stored = self._stored(request)
        source, target = _text(fields, "source_lang"), _text(fields, "target_lang")
        chosen = [d for d in stored.dictionaries
                  if (not source or d.source_language == self.catalog.code(source.lower()))
                  and (not target or d.target_language == self.catalog.code(target.lower()))]
        if not chosen:
            raise NotFound(f"The glossary has no dictionary {source or '*'}->{target or '*'}; "
                           f"it has {_pairs(stored)}")
        return JSONResponse({"dictionaries": [
            {"source_lang": d.source_language, "target_lang": d.target_language,
             "entries": _tsv(d.entries), "entries_format": "tsv"} for d in chosen]})

    async def delete(self, request: Request) -> Response:
        self.access.admit(request, await read_fields(request))
        if not self.store.delete(self._stored(request).glossary_id):
            raise NotFound("Glossary not found")
        return Response(status_code=204)


def _v2_info(stored: StoredGlossary) -> dict[str, JsonValue]:
    first = stored.dictionaries[0]
    return {"glossary_id": stored.glossary_id, "name": stored.name, "ready": True,
            "source_lang": first.source_language, "target_lang": first.target_language,
            "creation_time": stored.created, "entry_count": len(first.entries)}


def _v3_info(stored: StoredGlossary) -> dict[str, JsonValue]:
    return {"glossary_id": stored.glossary_id, "name": stored.name,
            "creation_time": stored.created, "dictionaries": [
                {"source_lang": d.source_language, "target_lang": d.target_language,
                 "entry_count": len(d.entries)} for d in stored.dictionaries]}


def _pairs(stored: StoredGlossary) -> str:
    return ", ".join(f"{deepl_code(d.source_language)}->{deepl_code(d.target_language)}"
                     for d in stored.dictionaries)


def _tsv(entries: Sequence[tuple[str, str]]) -> str:
    return "\n".join(f"{s}\t{t}" for s, t in entries)


def _text(fields: Fields, name: str) -> str | None:
    value = fields.values.get(name)
    if isinstance(value, list) and value and not fields.is_json:
        value = value[0]  # a repeated form field: the first, as DeepL's form parser
    if value is None or isinstance(value, str):
        return value or None
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)  # JSON's split_sentences: 0
    raise InvalidArgument(f"Value for '{name}' must be a string, got {echo(value)}")


def _texts(fields: Fields) -> list[str]:
    """`text`: one string or several (a JSON list, a repeated form field)."""
    value = fields.values.get("text")
    if value is None or value == [] or value == "":
        raise InvalidArgument("Parameter 'text' not specified.")
    values = value if isinstance(value, list) else [value]
    if not all(isinstance(v, str) for v in values):
        raise InvalidArgument("Parameter 'text' must be a string or a list of strings.")
    return [v for v in values if isinstance(v, str)]


def _tags(fields: Fields, name: str) -> list[str]:
    """A list of tags: a JSON list, a repeated form field, or comma-separated."""
    value = fields.values.get(name)
    values = value if isinstance(value, list) else [] if value is None else [value]
    if not all(isinstance(v, str) for v in values):
        raise InvalidArgument(f"Value for '{name}' must be a list of tags")
    return [tag.strip() for v in values if isinstance(v, str) for tag in v.split(",")
            if tag.strip()]


