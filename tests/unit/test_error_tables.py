"""Each door's one table from the core's error kinds: every kind in both, and a size
limit (TOO_LARGE) is HTTP 413 and gRPC RESOURCE_EXHAUSTED, not a 400."""

from __future__ import annotations

import grpc

from seq2serve.server.api.grpc_errors import STATUS, status_of
from seq2serve.server.api.http.app import HTTP_STATUS, error_response
from seq2serve.server.core.documents import DocumentTooLarge
from seq2serve.server.core.errors import ErrorKind


def test_every_kind_has_a_status_at_each_door() -> None:
    assert set(HTTP_STATUS) == set(ErrorKind) == set(STATUS)


def test_a_file_past_a_limit_is_413_and_resource_exhausted() -> None:
    error = DocumentTooLarge("a.docx unpacks to 9 bytes; the limit is 8 bytes")
    response = error_response(error)
    assert response.status_code == 413
    assert response.body == b'{"error":"a.docx unpacks to 9 bytes; the limit is 8 bytes"}'
    assert status_of(error) == (grpc.StatusCode.RESOURCE_EXHAUSTED, error.message)
