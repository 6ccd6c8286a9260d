"""What a request of texts means, whichever door it came through (LibreTranslate's
/translate, DeepL's /v2/translate, gRPC's Translate with `source_language: "auto"` or a
format): the source given or detected per text (texts grouped by detected language,
one core request per group), the text's format (plain; HTML or XML, whose text blocks
alone go to the model, core/markup.py), alternatives (a beam wide enough for them),
glossary and terms, formality and sentence splitting. A door converts its fields to a
`TextsRequest` and the `TextAnswer`s back; nothing of this lives in a door.
"""

from __future__ import annotations

import asyncio
import bisect
import dataclasses
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from seq2serve.server.core.catalog import Catalog, Pair
from seq2serve.server.core.detect import Detection
from seq2serve.server.core.errors import InvalidArgument, echo
from seq2serve.server.core.markup import HTML_RULES, Rules, extract
from seq2serve.server.core.options import DecodingOptions
from seq2serve.server.core.pieces import Joined, TooLongForOnePiece
from seq2serve.server.core.requests import Call, TranslateRequest
from seq2serve.server.core.segment import Splitting
from seq2serve.server.core.translator import Translator, off_loop

AUTO = "auto"


class TextFormat(str, Enum):
    TEXT = "text"
    HTML = "html"
    XML = "xml"


# DeepL's formality values. No served model offers formality: every value is accepted
# and ignored, as DeepL treats a language without formality.
FORMALITIES = ("default", "more", "less", "prefer_more", "prefer_less")


@dataclass(frozen=True)
class TextsRequest:
    texts: tuple[str, ...]
    source_language: str  # AUTO: each text's own, detected
    target_language: str
    text_format: TextFormat = TextFormat.TEXT
    markup: Rules = HTML_RULES  # the markup's rules (XML's from the request)
    alternatives: int = 0  # beyond the best; plain text only (markup: none, as LibreTranslate)
    protect_placeholders: bool = True
    glossary: str = ""
    terms: tuple[tuple[str, str], ...] = ()
    do_not_translate: tuple[str, ...] = ()
    formality: str = "default"
    # Where texts (a markup's blocks) are cut into pieces: core/segment.py.
    splitting: Splitting = Splitting.ON
    # gRPC's: a model by name (the Translator checks its languages) and decoding
    # options of the request's own (None: the model's, widened for `alternatives`).
    model: str = ""
    options: DecodingOptions | None = None


@dataclass(frozen=True)
class TextAnswer:
    """One text's n-best (best first; markup: one, its blocks' bests rendered, cut or
    repaired where any block was), the models that served it, its source language
    (given: confidence 100) and the detector's confidence in it."""

    hypotheses: tuple[Joined, ...]
    models: tuple[str, ...]
    source_language: str
    confidence: float

    @property
    def best(self) -> str:
        return self.hypotheses[0].text

    @property
    def translations(self) -> tuple[str, ...]:
        """The best, then each alternative that differs from every one before it."""
        return tuple(_distinct([h.text for h in self.hypotheses]))

    @property
    def repaired(self) -> bool:
        return self.hypotheses[0].repaired

    @property
    def cut(self) -> bool:
        return self.hypotheses[0].finish_reason == "length"


class TextService:
    """Translate and detect texts for every door, over the Translator and the Catalog."""

    def __init__(self, translator: Translator, catalog: Catalog | None = None) -> None:
        self.translator = translator
        self.catalog = catalog or Catalog(translator)

    async def detect(self, texts: Sequence[str]) -> list[list[Detection]]:
        """Each text's served languages, best first ([]: none can be seen)."""
        detector = self.catalog.detector()
        return await off_loop(lambda: [detector.detect(text) for text in texts])

    async def sources(self, texts: Sequence[str], source: str) -> list[tuple[str, float]]:
        """Each text's source language (as given: the core routes it; else the
        detected one, a listed code) and the confidence in it (100 when given). A text
        in which no served language can be seen goes as the first served source."""
        if source != AUTO:
            self.catalog.check_source(source)
            return [(source, 100.0)] * len(texts)
        found = await self.detect(texts)
        sources = self.catalog.listing().sources
        default = sources[0] if sources else "en"
        return [(d[0].language, float(d[0].confidence)) if d else (default, 0.0)
                for d in found]

    async def translate(self, request: TextsRequest, call: Call | None = None
                        ) -> list[TextAnswer]:
        """Every text's answer; one core request per source language (one in all
        unless `auto` found several), all in flight together."""
        check(request)
        call = call or Call()
        detected = await self.sources(request.texts, request.source_language)
        groups: dict[str, list[int]] = {}
        for i, (source, _) in enumerate(detected):
            groups.setdefault(source, []).append(i)
        pairs = [self.catalog.pair(source, request.target_language) if not request.model
                 else Pair(source, request.target_language, ()) for source in groups]
        results = await asyncio.gather(*[
            self._group(pair, members, request, call)
            for pair, members in zip(pairs, groups.values(), strict=True)])
        out: list[TextAnswer | None] = [None] * len(request.texts)
        for members, (models, answers) in zip(groups.values(), results, strict=True):
            for i, hypotheses in zip(members, answers, strict=True):
                out[i] = TextAnswer(tuple(hypotheses), models, *detected[i])
        return [a for a in out if a is not None]

    async def _group(self, pair: Pair, members: Sequence[int], request: TextsRequest,
                     call: Call) -> tuple[tuple[str, ...], list[list[Joined]]]:
        """The group's models and each text's hypotheses (`members`: the texts' indices
        in the request)."""
        texts = [request.texts[i] for i in members]
        options = request.options or self.options(pair.last, request.alternatives)
        if request.text_format is TextFormat.TEXT:
            try:
                result = await self.translator.translate(
                    self._request(pair, texts, options, request), call)
            except TooLongForOnePiece as e:
                raise e.at(members[e.index]) from None
            return result.models, [list(t.hypotheses) for t in result.translations]
        # Markup: only the text blocks go to the model (a sentence with its inline tags
        # as tag pairs, core/markup.py), all documents' blocks in one request.
        documents = [extract(text, request.markup) for text in texts]
        runs = [run for document in documents for run in document.texts]
        bests: list[Joined] = []
        models = pair.models
        if runs:
            one = dataclasses.replace(options, num_hypotheses=None) if request.options else \
                DecodingOptions()
            try:
                result = await self.translator.translate(
                    self._request(pair, runs, one, request), call)
            except TooLongForOnePiece as e:  # a block: the text it is in
                ends = list(itertools.accumulate(len(d.texts) for d in documents))
                raise e.at(members[bisect.bisect_right(ends, e.index)]) from None
            bests = [t.hypotheses[0] for t in result.translations]
            models = result.models
        out, start = [], 0
        for document in documents:
            end = start + len(document.texts)
            mine = bests[start:end]
            out.append([Joined(
                document.render([b.text for b in mine]), None, None, None,
                "length" if any(b.finish_reason == "length" for b in mine) else "eos",
                any(b.repaired for b in mine))])
            start = end
        return models, out  # no alternatives for markup, as LibreTranslate

    @staticmethod
    def _request(pair: Pair, texts: Sequence[str], options: DecodingOptions,
                 request: TextsRequest) -> TranslateRequest:
        return TranslateRequest(texts=tuple(texts), model=request.model,
                                source_language=pair.source,
                                target_language=pair.target, options=options,
                                protect_placeholders=request.protect_placeholders,
                                glossary=request.glossary, terms=request.terms,
                                do_not_translate=request.do_not_translate,
                                splitting=request.splitting)

    def options(self, model: str, alternatives: int) -> DecodingOptions:
        """Alternatives as decoding: the model's beam, widened to hold them."""
        if alternatives == 0:
            return DecodingOptions()
        beam = next((b for m in self.catalog.listing().models if m.name == model
                     and isinstance(b := m.defaults.get("beam_size"), int)), 1)
        return DecodingOptions(beam_size=max(beam, alternatives + 1),
                               num_hypotheses=alternatives + 1)


def check(request: TextsRequest) -> None:
    """The request's own values (the texts and languages are checked where they are
    used: the Translator, the Catalog)."""
    if request.alternatives < 0:
        raise InvalidArgument(f"alternatives must be at least 0, got {request.alternatives}")
    if request.formality not in FORMALITIES:
        raise InvalidArgument(f"formality must be one of {', '.join(FORMALITIES)}, got "
                              f"{echo(request.formality)}")


def _distinct(texts: Sequence[str]) -> list[str]:
    """The best, then each alternative that differs from every one before it."""
    out: list[str] = []
    for text in texts:
        if text not in out:
            out.append(text)
    return out


__all__ = ["AUTO", "FORMALITIES", "Splitting", "TextAnswer", "TextFormat", "TextService",
           "TextsRequest"]
