"""Document jobs over HTTP, for the page and `seq2serve translate-file --http`:

    POST /v1/jobs        the /translate_file form (file, source, target, api_key, ...)
                         -> 202 and the job as GET answers it
    GET  /v1/jobs/{id}   where the job stands: {"id", "name", "state" (queued,
                         translating, done, error), "progress": {"done", "total"}
                         (texts), "secondsRemaining" (an estimate while translating),
                         "billedCharacters", "notes", and "translatedFileUrl",
                         "outputName", "report" once done or "error" once failed}

The id is the capability, as a LibreTranslate download link is: 128 random bits that
only the submitter learns. The file is downloaded from /download_file, as
/translate_file's.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from seq2serve.server.api.http.libretranslate import JOBS_DOOR, LibreTranslateApi
from seq2serve.server.api.http.model_headers import served_by
from seq2serve.server.core.documents.jobs import DocumentJobs, JobView
from seq2serve.server.core.documents.jobstore import JobState


class JobsApi:
    def __init__(self, jobs: DocumentJobs, libre: LibreTranslateApi) -> None:
        self.jobs, self.libre = jobs, libre

    async def submit(self, request: Request) -> Response:
        """Queue a file for translation: the /translate_file form; 202 with the job."""
        order, data = await self.libre.file_order(request)
        record = await self.jobs.submit(order, data)
        return JSONResponse(self._body(request, self.jobs.view(record.id, JOBS_DOOR)),
                            status_code=202)

    async def status(self, request: Request) -> Response:
        """Where a document job stands (404 once it has expired)."""
        view = self.jobs.view(request.path_params["job_id"], JOBS_DOOR)
        return JSONResponse(self._body(request, view))

    def _body(self, request: Request, view: JobView) -> dict[str, Any]:
        body: dict[str, Any] = {
            "id": view.id, "name": view.name, "state": view.state.value,
            "progress": {"done": view.done, "total": view.total},
            "secondsRemaining": view.seconds_remaining,
            "billedCharacters": view.billed_characters, "notes": list(view.notes)}
        if view.state is JobState.DONE:
            served_by(view.model)  # the answer that carries the file's address
            body["report"] = view.report
            body["outputName"] = view.output_name
            body["translatedFileUrl"] = self.libre.download_url(request, view.id,
                                                                view.output_name)
        if view.state is JobState.ERROR:
            body["error"] = view.error_message
        return body
