"""DeepL's document endpoints over the document jobs (core/documents/jobs.py):

    POST /v2/document               multipart: file, target_lang, source_lang, filename,
                                    output_format -> {document_id, document_key}
    POST /v2/document/{id}          document_key -> {document_id, status (queued,
                                    translating, done, error), seconds_remaining (while
                                    translating), billed_characters, error_message}
    POST /v2/document/{id}/result   document_key -> the file, downloadable once (then 404)

Every format /translate_file takes, within the same limits (413 past them). Callers
are admitted and errors answered as the rest of DeepL's API (deepl_auth.py); a
document's characters count against its key's limit when its job is done (456 at
upload once the key is past it). A wrong document_key is answered as an unknown
document (404), so that a document id alone tells nothing.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Awaitable, Callable
from pathlib import PurePath

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from seq2serve.server.api.http.body import Fields, read_fields
from seq2serve.server.api.http.deepl_auth import (
    DeepLAccess,
    QuotaExceeded,
    account,
    error_response,
)
from seq2serve.server.api.http.libretranslate import content_disposition
from seq2serve.server.api.http.model_headers import served_by
from seq2serve.server.core.documents import SUFFIXES, media_type
from seq2serve.server.core.documents.jobs import DocumentJobs
from seq2serve.server.core.documents.jobstore import JobState, Order, Record
from seq2serve.server.core.errors import InvalidArgument, NotFound
from seq2serve.server.core.translator import Translator

DOOR = "deepl"
Handler = Callable[[Request], Awaitable[Response]]
Route = Callable[..., None]  # app.py's route(path, handler, methods, name=, doc=, encode=)
# Suffixes that name one format (DeepL's output_format "htm" for an .html upload).
_SAME = {".htm": ".html", ".xlf": ".xliff", ".pot": ".po"}


def _digest(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


class DeepLDocuments:
    def __init__(self, jobs: DocumentJobs, access: DeepLAccess, translator: Translator) -> None:
        self.jobs, self.access, self.translator = jobs, access, translator

    def register(self, route: Route) -> None:
        route("/v2/document", self.upload, ["POST"], name="deepl_document_upload",
              doc="Upload a document to translate (DeepL)", encode=error_response)
        route("/v2/document/{document_id}", self.status, ["POST", "GET"],
              name="deepl_document_status", doc="A document's status (DeepL)",
              encode=error_response)
        route("/v2/document/{document_id}/result", self.result, ["POST", "GET"],
              name="deepl_document_result",
              doc="Download a translated document, once (DeepL)", encode=error_response)

    async def upload(self, request: Request) -> Response:
        """A document queued for translation: {document_id, document_key}."""
        fields = await read_fields(request)
        caller = self.access.admit(request, fields)
        usage = self.access.usage(caller)
        if usage.character_count >= usage.character_limit:
            raise QuotaExceeded(f"Quota exceeded: this key has used {usage.character_count} "
                                f"of its {usage.character_limit} characters")
        upload = fields.files.get("file")
        if upload is None:
            raise InvalidArgument("Parameter 'file' not specified.")
        name = PurePath(fields.text("filename") or upload.filename or "").name
        suffix = PurePath(name).suffix.lower()
        if suffix not in SUFFIXES:
            raise InvalidArgument(f"Invalid file data: file type {suffix[:16] or name[:64]!r} "
                                  f"is not supported; supported: {', '.join(SUFFIXES)}")
        wanted = fields.text("output_format")
        if wanted and _SAME.get("." + wanted.lower().lstrip("."), "." + wanted.lower()
                                .lstrip(".")) != _SAME.get(suffix, suffix):
            raise InvalidArgument(f"Value for 'output_format' not supported: this server "
                                  f"writes a {suffix} file as {suffix}, not {wanted[:16]}")
        target = fields.text("target_lang")
        if not target:
            raise InvalidArgument("Parameter 'target_lang' not specified.")
        source = fields.text("source_lang") or "auto"
        self._check_pair(source, target)
        # As the served models list them (DeepL's "DE", "EN-GB"): what the file is marked
        # with (a catalog's Language header, a document's language).
        target = self.translator.language_code(target)
        source = source if source == "auto" else self.translator.language_code(source)
        # A glossary of the core's (--glossary-dir) by its id; `formality` is accepted and
        # has no effect, as DeepL does for a language without formality.
        glossary = fields.text("glossary_id") or ""
        if glossary and self.translator.glossaries.get(glossary) is None:
            raise InvalidArgument(f"Value for 'glossary_id' not found: this server has no "
                                  f"glossary {glossary[:64]!r}")
        data = await upload.read()
        if not data:
            raise InvalidArgument("Invalid file data: the file is empty")
        key = secrets.token_hex(32).upper()
        # Whose key its characters count on is kept in the job (a restart keeps it).
        record = await self.jobs.submit(
            Order(name=name, target_language=target, source_language=source,
                  glossary=glossary, door=DOOR, key_digest=_digest(key),
                  account=account(caller)), data)
        return JSONResponse({"document_id": record.id, "document_key": key})

    async def status(self, request: Request) -> Response:
        record, fields = await self._document(request)
        view = self.jobs.view(record.id, DOOR)
        await self._bill(record)
        body: dict[str, object] = {"document_id": record.id, "status": view.state.value}
        if view.state is JobState.TRANSLATING and view.seconds_remaining is not None:
            body["seconds_remaining"] = view.seconds_remaining
        if view.state is JobState.DONE:
            body["billed_characters"] = view.billed_characters
        if view.state is JobState.ERROR:
            body["error_message"] = view.error_message
        return JSONResponse(body)

    async def result(self, request: Request) -> Response:
        record, _ = await self._document(request)
        if not record.state.finished:
            return JSONResponse({"message": "Document not ready: the translation is "
                                 f"{record.state.value}"}, status_code=503)
        if record.state is JobState.ERROR:
            raise NotFound(f"Document translation failed: {record.error_message}")
        if record.downloaded:
            raise NotFound("Document already downloaded: a translated document is "
                           "downloadable once")
        await self._bill(record)
        data, name = await self.jobs.take(record.id, DOOR)
        served_by(record.model)
        return Response(data, media_type=media_type(name),
                        headers={"Content-Disposition": content_disposition(name)})

    async def _document(self, request: Request) -> tuple[Record, Fields]:
        fields = await read_fields(request)
        self.access.admit(request, fields)
        key = fields.text("document_key") or ""
        try:
            record = self.jobs.record(request.path_params["document_id"], DOOR)
        except NotFound:
            record = None
        if record is None or not hmac.compare_digest(_digest(key), record.order.key_digest):
            raise NotFound("Document not found (or the document_key is not this "
                           "document's)")
        return record, fields

    async def _bill(self, record: Record) -> None:
        """Count a done document's characters on its uploader's account, once: all of
        them, up to the key's limit as it is now (the work is done; the key's next upload
        gets 456). Kept in the job's state, so a restart neither forgets nor repeats it."""
        if not record.state.finished or record.billed:
            return
        record.billed = True  # before any wait: one count however many ask at once
        if record.state is JobState.DONE and record.order.account:
            self.access.charge(record.order.account, record.billed_characters)
        await self.jobs.save(record)

    def _check_pair(self, source: str, target: str) -> None:
        """400 now for a language no model serves (DeepL's words), not a failed job."""
        routes = self.translator.list_routes()
        targets = {r.target_language for r in routes}
        sources = {r.source_language for r in routes}
        if self.translator.language_code(target) not in targets:
            raise InvalidArgument("Value for 'target_lang' not supported.")
        if source != "auto":
            if self.translator.language_code(source) not in sources:
                raise InvalidArgument("Value for 'source_lang' not supported.")
            self.translator.route(source, target)
