"""A document's texts through the application core's `Translator`: the HTTP door's way.

Each chunk is an ordinary core request (`Translator.translate`): placeholders,
markup and glossary terms are protected as in any request, the response cache
answers texts it has seen, and the pieces of every chunk in flight batch
together in the model's scheduler.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from seq2serve.server.config import setting_names
from seq2serve.server.core.documents.base import Document
from seq2serve.server.core.documents.queueing import translate_document
from seq2serve.server.core.errors import ResourceExhausted
from seq2serve.server.core.requests import Call, TranslateRequest
from seq2serve.server.core.translator import Translator


async def translate_with_core(document: Document, translator: Translator,
                              template: TranslateRequest, call: Call) -> bytes:
    """`document` translated by `template`'s model and settings (its texts replaced by
    each chunk's), written back."""

    async def translate(texts: Sequence[str]) -> list[str]:
        result = await translator.translate(dataclasses.replace(template, texts=tuple(texts)),
                                            call)
        return [t.hypotheses[0].text for t in result.translations]

    return await translate_document(document, translate,
                                    chunk_size=translator.max_texts_per_request,
                                    max_chars=translator.max_text_chars,
                                    busy=lambda e: isinstance(e, ResourceExhausted),
                                    limit_setting=setting_names("max_text_chars"))
