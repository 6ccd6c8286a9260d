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
    error = DocumentTooLarge("a.docx unpacks to 9 bytes; the limit is 8 bytes",
                             "unpacked_bytes")
    response = error_response(error)
    assert response.status_code == 413
    assert response.body == b'{"error":"a.docx unpacks to 9 bytes; the limit is 8 bytes"}'
    assert status_of(error) == (grpc.StatusCode.RESOURCE_EXHAUSTED, error.message)


def test_libretranslate_and_deepl_spell_one_status_their_own_way() -> None:
    """One table (api/http/errors.py), two bodies: LibreTranslate's {"error"}, DeepL's
    {"message"}; DeepL answers a missing key 403 (LibreTranslate 400) and a quota 456."""
    import json

    from seq2serve.server.api.http import deepl_auth
    from seq2serve.server.api.http.access import KeyRequired, RateLimited
    from seq2serve.server.core.errors import ServiceError

    for kind, status in HTTP_STATUS.items():
        error = ServiceError(kind, "why")
        libre, deepl = error_response(error), deepl_auth.error_response(error)
        assert libre.status_code == deepl.status_code == status
        assert json.loads(libre.body) == {"error": "why"}
        assert json.loads(deepl.body) == {"message": "why"}
        assert (libre.headers.get("retry-after") is not None) == (status == 503)
        assert (deepl.headers.get("retry-after") is not None) == (status == 503)
    assert error_response(KeyRequired("k")).status_code == 400
    assert deepl_auth.error_response(KeyRequired("k")).status_code == 403
    assert deepl_auth.error_response(deepl_auth.QuotaExceeded("q")).status_code == 456
    limited = deepl_auth.error_response(RateLimited("slow", retry_after_s=7))
    assert limited.status_code == 429 and limited.headers["retry-after"] == "7"
