"""The HTTP app: routes, error bodies, CORS, limits, metrics, the page.

FastAPI (on Starlette) because it is the Python ecosystem's convention for an
ASGI API with an OpenAPI description and interactive docs; uvicorn serves it
inside the gRPC server's event loop (server.py), so both front doors share one
process, one application core, one metrics registry.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from prometheus_client import Counter, Histogram
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from swagger_ui_bundle import swagger_ui_path

from seq2serve.server.api.http import model_headers
from seq2serve.server.api.http.access import Access
from seq2serve.server.api.http.body import BodyLimit
from seq2serve.server.api.http.deepl import IGNORED_HEADER, DeepLApi
from seq2serve.server.api.http.deepl_auth import DeepLAccess
from seq2serve.server.api.http.deepl_documents import DeepLDocuments
from seq2serve.server.api.http.errors import (  # noqa: F401 - HTTP_STATUS: the table's name here too
    HTTP_STATUS,
    RETRY_AFTER_S,
    retry_after,
    status_of,
)
from seq2serve.server.api.http.jobs_api import JobsApi
from seq2serve.server.api.http.libretranslate import (
    TRUNCATED_HEADER,
    LibreSettings,
    LibreTranslateApi,
)
from seq2serve.server.api.http.proto_json import ProtoJsonApi
from seq2serve.server.api.proto_api import ProtoApi
from seq2serve.server.api.routing import MODEL_HEADER, PAIR_HEADER, served_value
from seq2serve.server.core.documents.jobs import DocumentJobs
from seq2serve.server.core.documents.service import DocumentRunner
from seq2serve.server.core.errors import DeadlineExceeded, ServiceError
from seq2serve.server.core.glossary import GlossaryStore
from seq2serve.server.core.translator import Translator
from seq2serve.server.core.usage import UsageLedger
from seq2serve.server.metrics import NAMESPACE, REQUEST_BUCKETS, Metrics

log = logging.getLogger("seq2serve.server.http")
STATIC = Path(__file__).resolve().parent / "static"

FORM_SLACK_BYTES = 64 * 1024
# Every asset comes from this server; no inline script or style.
CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
       "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'")
# The interactive docs (Swagger UI from the swagger-ui-bundle wheel, served here too)
# start with an inline script: their page alone allows that.
DOCS_CSP = CSP.replace("script-src 'self'", "script-src 'self' 'unsafe-inline'")


@dataclass(frozen=True)
class HttpSettings:
    libre: LibreSettings
    max_body_bytes: int
    cors_origins: tuple[str, ...]
    timeout_s: float | None = None  # per request; None: no limit


class HttpMetrics:
    def __init__(self, metrics: Metrics) -> None:
        r = metrics.registry
        self.requests = Counter(f"{NAMESPACE}_http_requests", "HTTP requests answered, by "
                                "route and status code", ["route", "status"], registry=r)
        self.duration = Histogram(f"{NAMESPACE}_http_request_duration_seconds",
                                  "HTTP request duration from arrival to answer", ["route"],
                                  buckets=REQUEST_BUCKETS, registry=r)


def error_response(error: BaseException) -> JSONResponse:
    """LibreTranslate's error body: {"error": message}, with the status the one table
    gives (errors.py)."""
    status = status_of(error)
    if status is None:
        log.error("unhandled error in an HTTP request", exc_info=error)
        return JSONResponse({"error": "internal error (logged on the server)"},
                            status_code=500)
    message = error.message if isinstance(error, ServiceError) else str(error)
    return JSONResponse({"error": message}, status_code=status,
                        headers=retry_after(error, status))


def _retry_after(status: int) -> dict[str, str] | None:
    return {"Retry-After": str(RETRY_AFTER_S)} if status == 503 else None


Handler = Callable[[Request], Awaitable[Response]]
CLIENT_CLOSED = 499  # nginx's code for a client that left before the answer


Encoder = Callable[[BaseException], Response]


async def until_client_leaves(request: Request, handler: Handler,
                              timeout_s: float | None = None,
                              encode: Encoder = error_response) -> Response:
    """Run the handler; if the client disconnects first, or it takes longer than
    `timeout_s` (504), cancel it, so that its texts leave the queue and their batches
    at once (as a cancelled or expired gRPC call's do)."""
    try:
        await request.body()  # read whole (and kept) here: what follows on the stream is the end
    except ClientDisconnect:  # gone before it finished sending (or past the body limit)
        return Response(status_code=CLIENT_CLOSED)
    work = asyncio.ensure_future(handler(request))
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({work, gone}, timeout=timeout_s,
                           return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:  # the listener is stopping: so does the work
        work.cancel()
        raise
    finally:
        left = gone.done()
        gone.cancel()
    if work.done():
        return work.result()
    work.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await work
    if left:
        return Response(status_code=CLIENT_CLOSED)
    # The client is still there: the time limit ended it.
    return encode(DeadlineExceeded(
        f"the request took longer than this server's limit of {timeout_s:g} s "
        "(--http-timeout-s)"))


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


def build_app(translator: Translator, proto_api: ProtoApi, settings: HttpSettings,
              metrics: Metrics, serving: Callable[[], bool], access: Access,
              glossaries: GlossaryStore, jobs: DocumentJobs | None = None,
              usage: UsageLedger | None = None) -> FastAPI:
    """The whole HTTP front door; `serving()` is the health state the gRPC health
    service reports (False while loading and draining). Files are translated as
    `jobs`' document jobs (none: no file translation), which this door runs. DeepL's
    characters are counted in `usage` (none: in memory, from 0)."""
    app = FastAPI(title="seq2serve", summary="Translation and summarization: LibreTranslate's "
                  "API, DeepL's API v2 and the seq2serve.v1 .proto as JSON", version="1",
                  docs_url=None, redoc_url=None)
    observed = HttpMetrics(metrics)
    libre = LibreTranslateApi(translator, access, settings.libre, proto_api.texts, jobs)
    if jobs is not None:
        jobs.attach(DocumentRunner(translator, settings.libre.document_limits,
                                   libre.detect_source))
    proto = ProtoJsonApi(proto_api, access)
    # One DeepL key ledger for every DeepL route: a document's characters count in
    # /v2/usage as a text's do.
    deepl_access = DeepLAccess(access, usage)
    deepl = DeepLApi(libre.texts, deepl_access, glossaries)

    def route(path: str, handler: Handler, methods: list[str], name: str | None = None,
              doc: str = "", encode: Encoder = error_response) -> None:
        """`encode`: the dialect's error answer (LibreTranslate's by default)."""
        async def endpoint(request: Request) -> Response:
            started = time.perf_counter()
            with model_headers.collecting() as served:
                try:
                    response = await until_client_leaves(request, handler, settings.timeout_s,
                                                         encode)
                except Exception as error:  # noqa: BLE001 - every error becomes a status + body
                    response = encode(error)
            if models := served_value(served):  # which model answered (api/routing.py)
                response.headers[MODEL_HEADER] = models
            observed.requests.labels(path, str(response.status_code)).inc()
            observed.duration.labels(path).observe(time.perf_counter() - started)
            return response

        endpoint.__doc__ = doc or handler.__doc__
        # One route per method, so that each has its own OpenAPI operation id (DeepL's
        # routes take GET and POST alike).
        for method in methods:
            app.add_api_route(path, endpoint, methods=[method], name=name or handler.__name__,
                              response_class=JSONResponse, summary=doc or None,
                              operation_id=f"{name or handler.__name__}_{method.lower()}"
                              if len(methods) > 1 else None)

    async def health(request: Request) -> Response:
        if serving():
            return JSONResponse({"status": "ok"})
        return JSONResponse({"status": "unavailable"}, status_code=503,
                            headers=_retry_after(503))

    async def index(request: Request) -> Response:
        return FileResponse(STATIC / "index.html", media_type="text/html")

    route("/translate", libre.translate, ["POST"], doc="Translate text (LibreTranslate)")
    route("/languages", libre.languages, ["GET"], doc="Supported languages (LibreTranslate)")
    route("/detect", libre.detect, ["POST"], doc="Detect the language of a text (LibreTranslate)")
    route("/translate_file", libre.translate_file, ["POST"],
          doc="Translate a file: .txt, .html, gettext .po/.pot, XLIFF, .srt, .docx, "
          ".pptx, .odt, .odp, .epub")
    route("/download_file/{filename}", libre.download_file, ["GET"], name="download_file",
          doc="Download a translated file")
    route("/frontend/settings", libre.frontend_settings, ["GET"], doc="Page settings")
    route("/suggest", libre.suggest, ["POST"], doc="Suggestions (disabled)")
    route("/summarize", libre.summarize, ["POST"], doc="Summarize English text")
    route("/health", health, ["GET"], doc="200 while serving, 503 while loading or draining")
    proto.register(route)
    deepl.register(route)
    if jobs is not None:
        jobs_api = JobsApi(jobs, libre)
        route("/v1/jobs", jobs_api.submit, ["POST"], name="submit_job",
              doc="Queue a file for translation (the /translate_file form): a document job")
        route("/v1/jobs/{job_id}", jobs_api.status, ["GET"], name="job_status",
              doc="A document job's state, progress and estimate")
        DeepLDocuments(jobs, deepl_access, translator).register(route)
    async def docs(request: Request) -> Response:
        return get_swagger_ui_html(openapi_url="/openapi.json", title="seq2serve API",
                                   swagger_js_url="/swagger/swagger-ui-bundle.js",
                                   swagger_css_url="/swagger/swagger-ui.css",
                                   swagger_favicon_url="/swagger/favicon-32x32.png")

    app.add_api_route("/", index, methods=["GET"], include_in_schema=False)
    app.add_api_route("/docs", docs, methods=["GET"], include_in_schema=False)
    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    app.mount("/swagger", StaticFiles(directory=swagger_ui_path), name="swagger")

    app.add_middleware(CORSMiddleware, allow_origins=list(settings.cors_origins),
                       allow_methods=["GET", "POST", "DELETE"],
                       allow_headers=["Authorization", "Content-Type", MODEL_HEADER,
                                      PAIR_HEADER],
                       expose_headers=["Authorization", TRUNCATED_HEADER, MODEL_HEADER,
                                       IGNORED_HEADER],
                       max_age=60 * 60 * 24 * 20)
    # A document upload has a limit of its own (images in it are copied byte for byte);
    # the slack is the multipart form around the file and the other fields.
    upload = settings.libre.document_limits.file_bytes + FORM_SLACK_BYTES
    app.add_middleware(BodyLimit, limit=settings.max_body_bytes,
                       paths={path: upload for path in ("/translate_file", "/v1/jobs",
                                                        "/v2/document")})
    app.add_middleware(SecurityHeaders)
    return app


class SecurityHeaders:
    """ASGI middleware: the Content-Security-Policy and two hardening headers on
    every answer that does not set its own (the 413 of BodyLimit and CORS
    preflights included). Plain ASGI, not Starlette's BaseHTTPMiddleware, which
    runs each request in a task group with memory streams: with it, HTTP served
    0.87-0.93x of gRPC's texts/s at 32 clients on one server, 0.94-0.96x without
    (docs/benchmarks.md)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        added = _SECURITY_HEADERS_DOCS if scope["path"] == "/docs" else _SECURITY_HEADERS

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                present = {name.lower() for name, _ in headers}
                headers.extend(h for h in added if h[0] not in present)
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, with_headers)


def _security_headers(policy: str) -> tuple[tuple[bytes, bytes], ...]:
    return ((b"content-security-policy", policy.encode()),
            (b"x-content-type-options", b"nosniff"), (b"referrer-policy", b"no-referrer"))


_SECURITY_HEADERS = _security_headers(CSP)
_SECURITY_HEADERS_DOCS = _security_headers(DOCS_CSP)
