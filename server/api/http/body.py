"""Request fields as LibreTranslate reads them: a JSON body, or form fields
(urlencoded or multipart) together with the query string; bodies under a size
limit; LibreTranslate's error messages."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from starlette.datastructures import UploadFile
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from seq2serve.server.core.errors import InvalidArgument, check_unicode

JsonValue = str | int | float | bool | None | list["JsonValue"] | dict[str, "JsonValue"]


# DeepL's API (api/http/deepl.py and its document endpoints) lives under these.
DEEPL_PATHS = ("/v2/", "/v3/")

_BOOLEANS = {"true": True, "1": True, "yes": True, "on": True,
             "false": False, "0": False, "no": False, "off": False}


def invalid(message: str) -> InvalidArgument:
    return InvalidArgument(message)


def missing(name: str) -> InvalidArgument:
    return invalid(f"Invalid request: missing {name} parameter")


@dataclass(frozen=True)
class Fields:
    """A request's fields: JSON values, or form values (strings and files)."""

    values: Mapping[str, JsonValue]
    files: Mapping[str, UploadFile]
    is_json: bool

    def text(self, name: str, default: str | None = None) -> str | None:
        value = self.values.get(name, default)
        if value is None or isinstance(value, str):
            return value
        raise invalid(f"Invalid request: {name} must be a string, got {json.dumps(value)[:64]}")

    def integer(self, name: str, default: int) -> int:
        value = self.values.get(name)
        if value is None or value == "":
            return default
        if isinstance(value, bool):
            raise invalid(f"Invalid request: {name} parameter is not a number")
        if isinstance(value, int):
            return value
        if isinstance(value, str):
            try:
                return int(value.strip())
            except ValueError:
                pass
        raise invalid(f"Invalid request: {name} parameter is not a number")

    def boolean(self, name: str, default: bool) -> bool:
        value = self.values.get(name)
        if value is None or value == "":
            return default
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in _BOOLEANS:
            return _BOOLEANS[value.strip().lower()]
        raise invalid(f"Invalid request: {name} must be true or false, got "
                      f"{json.dumps(value)[:64]}")

    def strings(self, name: str) -> list[str]:
        """A list of strings: a JSON list, a repeated form field, or one string
        holding one per line."""
        value = self.values.get(name)
        if value is None or value == "":
            return []
        if isinstance(value, str):
            return [line for line in value.splitlines() if line.strip()]
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return [v for v in value if isinstance(v, str)]
        raise invalid(f"Invalid request: {name} must be a list of strings, got "
                      f"{json.dumps(value)[:64]}")

    def term_pairs(self, name: str) -> list[tuple[str, str]]:
        """Source term -> target term: a JSON object, or a list of
        {"source": ..., "target": ...}; a form field holds that JSON as text."""
        value = self.values.get(name)
        if value is None or value == "":
            return []
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except (json.JSONDecodeError, RecursionError):
                raise invalid(f"Invalid request: {name} must be a JSON object of source "
                              "term -> target term") from None
        if isinstance(value, dict) and all(isinstance(v, str) for v in value.values()):
            return [(k, v) for k, v in value.items() if isinstance(v, str)]
        if isinstance(value, list):
            pairs = []
            for i, item in enumerate(value):
                if not (isinstance(item, dict) and isinstance(item.get("source"), str)
                        and isinstance(item.get("target"), str)):
                    raise invalid(f"Invalid request: {name}[{i}] must be an object with "
                                  "string fields source and target")
                pairs.append((str(item["source"]), str(item["target"])))
            return pairs
        raise invalid(f"Invalid request: {name} must be an object of source term -> target "
                      f"term, got {json.dumps(value)[:64]}")

    def texts(self, name: str = "q") -> tuple[list[str], bool]:
        """`q` as a list of texts and whether it came as a list (list in, list out)."""
        value = self.values.get(name)
        if value is None or value == "" or value == []:
            raise missing(name)
        if isinstance(value, str):
            # Form values keep the browser's CRLF; LibreTranslate counts LF only.
            return ["\n".join(value.splitlines())] if not self.is_json else [value], False
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return [v for v in value if isinstance(v, str)], True
        raise invalid(f"Invalid request: {name} must be a string or a list of strings")


async def read_fields(request: Request) -> Fields:
    """The fields as LibreTranslate reads them: a JSON body alone (its `request.is_json`
    branch), else the query string and the form together (Flask's `request.values`), the
    query string's value winning a name both carry, as Werkzeug's lookup does."""
    kind = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if kind == "application/json" or kind.endswith("+json"):
        fields = Fields(values=await _json_values(request), files={}, is_json=True)
    elif kind in ("application/x-www-form-urlencoded", "multipart/form-data"):
        values, files = await _form_values(request)
        fields = Fields(values={**values, **_repeated(request.query_params.multi_items())},
                        files=files, is_json=False)
    elif kind == "":
        fields = Fields(values=_repeated(request.query_params.multi_items()), files={},
                        is_json=False)
    else:
        raise invalid(f"Invalid request: content type {kind[:64]!r} is not supported; send "
                      "JSON or form fields")
    check_fields_unicode(fields)
    return fields


async def _json_values(request: Request) -> dict[str, JsonValue]:
    raw = await request.body()
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        raise invalid("Invalid JSON format") from None
    if not isinstance(data, dict):
        raise invalid("Invalid JSON format")
    return data


async def _form_values(request: Request) -> tuple[dict[str, JsonValue], dict[str, UploadFile]]:
    try:
        form = await request.form(max_files=1, max_fields=100)
    except (UnicodeDecodeError, ValueError, KeyError) as error:
        raise invalid(f"Invalid form data: {str(error)[:64]}") from None
    files = {name: value for name, value in form.multi_items()
             if isinstance(value, UploadFile)}
    return _repeated((name, value) for name, value in form.multi_items()
                     if isinstance(value, str)), files


def _repeated(items: Iterable[tuple[str, str]]) -> dict[str, JsonValue]:
    """Name -> value; a repeated name is a list, as `q=a&q=b`."""
    values: dict[str, JsonValue] = {}
    for name, value in items:
        previous = values.get(name)
        if previous is None:
            values[name] = value
        else:
            values[name] = [*previous, value] if isinstance(previous, list) else \
                [previous, value]
    return values


def check_fields_unicode(fields: Fields) -> None:
    """Refuse a field that is not valid Unicode, naming it (`q[2]`, `terms["disk"]`).

    JSON's `\\ud800` escape decodes to a lone surrogate, and so does a multipart part in a
    charset such as `unicode_escape`; such a text would fail as an internal error where it
    is first encoded (segmentation, the answer, an error message that echoes it). Walked
    with a stack, not recursion: JSON nests as deep as its parser allowed."""
    stack: list[tuple[str, JsonValue]] = [(_bounded(name), value)
                                          for name, value in fields.values.items()]
    for name in (*fields.values, *fields.files):
        check_unicode("a field name", name)
    for name, upload in fields.files.items():
        check_unicode(f"{_bounded(name)} (its file name)", upload.filename or "")
    while stack:
        path, value = stack.pop()
        if isinstance(value, str):
            check_unicode(path, value)
        elif isinstance(value, list):
            stack.extend((f"{path}[{i}]", item) for i, item in enumerate(value))
        elif isinstance(value, dict):
            for key, item in value.items():
                check_unicode(f"a key of {path}", key)
                stack.append((f"{path}[{json.dumps(_bounded(key))}]", item))


def _bounded(name: str, limit: int = 32) -> str:
    """A client-chosen name as an error message may echo it."""
    return name if len(name) <= limit else f"{name[:limit]}..."


class BodyLimit:
    """ASGI middleware: a body over `limit` bytes (`paths` may give a path a limit of
    its own: /translate_file's uploads) is answered 413 before it is read whole,
    whether it announced its length or not."""

    def __init__(self, app: ASGIApp, limit: int, paths: Mapping[str, int] | None = None,
                 setting: str = "max_message_bytes",
                 path_setting: str = "max_document_bytes") -> None:
        self.app = app
        self.limit = limit
        self.paths = dict(paths or {})
        self.setting, self.path_setting = setting, path_setting

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        limit = self.paths.get(path, self.limit)
        setting = self.path_setting if path in self.paths else self.setting
        headers = dict(scope.get("headers") or [])
        length = headers.get(b"content-length")
        if length is not None and length.isdigit() and int(length) > limit:
            await self._refuse(send, limit, setting, path)
            return
        seen = 0
        over = False

        async def limited_receive() -> Message:
            # Past the limit the app hears that the client left: it stops reading
            # and whatever it answers is replaced by the 413 below.
            nonlocal seen, over
            if over:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    over = True
                    return {"type": "http.disconnect"}
            return message

        async def checked_send(message: Message) -> None:
            if not over:
                await send(message)

        await self.app(scope, limited_receive, checked_send)
        if over:
            await self._refuse(send, limit, setting, path)

    @staticmethod
    async def _refuse(send: Send, limit: int, setting: str, path: str) -> None:
        # The dialect's error body: DeepL's {"message"} under its paths, else
        # LibreTranslate's {"error"}.
        key = "message" if path.startswith(DEEPL_PATHS) else "error"
        body = json.dumps({key: f"Request body too large: the limit is {limit} bytes "
                                f"({setting})"}).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
