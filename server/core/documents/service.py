"""A document's texts through the application core's `Translator`: the HTTP door's way.

Each chunk is an ordinary core request (`Translator.translate`): placeholders,
markup and glossary terms are protected as in any request, the response cache
answers texts it has seen, and the pieces of every chunk in flight batch
together in the model's scheduler. `DocumentRunner` is what runs a document job
(`jobs.py`): the upload read within the limits, its source language found, its
texts translated, the file written.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable, Sequence

from seq2serve.server.config import setting_names
from seq2serve.server.core.documents import Limits, read_document
from seq2serve.server.core.documents.base import Document
from seq2serve.server.core.documents.jobs import Outcome
from seq2serve.server.core.documents.jobstore import Order
from seq2serve.server.core.documents.queueing import Progress, translate_document
from seq2serve.server.core.errors import InvalidArgument, NotFound, ResourceExhausted
from seq2serve.server.core.options import DecodingOptions
from seq2serve.server.core.requests import Call, TranslateRequest
from seq2serve.server.core.translator import Translator

# A sample of the file's text, the language of which is the file's (source "auto").
DetectSource = Callable[[str], Awaitable[str]]
SAMPLE_TEXTS, SAMPLE_CHARS = 50, 2000


async def translate_with_core(document: Document, translator: Translator,
                              template: TranslateRequest, call: Call,
                              progress: Progress | None = None,
                              sent: list[int] | None = None) -> bytes:
    """`document` translated by `template`'s model and settings (its texts replaced by
    each chunk's), written back; `sent` (if given) gets the characters of each chunk
    sent to the models."""

    async def translate(texts: Sequence[str]) -> list[str]:
        result = await translator.translate(dataclasses.replace(template, texts=tuple(texts)),
                                            call)
        if sent is not None:
            sent.append(sum(len(text) for text in texts))
        return [t.hypotheses[0].text for t in result.translations]

    return await translate_document(document, translate,
                                    chunk_size=translator.max_texts_per_request,
                                    max_chars=translator.max_text_chars, progress=progress,
                                    busy=lambda e: isinstance(e, ResourceExhausted),
                                    limit_setting=setting_names("max_text_chars"))


class DocumentRunner:
    """Runs one document job: `detect` names the language of a sample of the file's
    text where the order's source is "auto" and the file says none."""

    def __init__(self, translator: Translator, limits: Limits, detect: DetectSource) -> None:
        self.translator, self.limits, self.detect = translator, limits, detect

    async def __call__(self, order: Order, data: bytes, progress: Progress) -> Outcome:
        document = await asyncio.get_running_loop().run_in_executor(
            None, lambda: read_document(order.name, data, order.target_language,
                                        order.overwrite, self.limits))
        source = order.source_language
        if source == "auto":
            source = document.source_language.replace("_", "-").split("-")[0]
        if not source or source == "auto":
            source = await self.detect(" ".join(document.texts[:SAMPLE_TEXTS])[:SAMPLE_CHARS])
        try:
            self.translator.route(source, order.target_language)
        except NotFound as e:  # the file's language: the client's input, not the server's
            raise InvalidArgument(e.message) from None
        template = TranslateRequest(texts=(), model="", source_language=source,
                                    target_language=order.target_language,
                                    options=DecodingOptions(),
                                    protect_placeholders=order.protect_placeholders,
                                    glossary=order.glossary, terms=order.terms,
                                    do_not_translate=order.do_not_translate)
        sent: list[int] = []
        call = Call()  # it hears the model that serves the file's texts
        output = await translate_with_core(document, self.translator, template, call,
                                           progress, sent)
        return Outcome(data=output, name=document.name, billed_characters=sum(sent),
                       report=document.tally.describe(), model=call.model or "")
