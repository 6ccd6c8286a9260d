"""Request bodies as LibreTranslate reads them: JSON, or form fields (urlencoded
or multipart), under a size limit, with LibreTranslate's error messages."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from starlette.datastructures import UploadFile
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from seq2serve.server.core.errors import InvalidArgument

JsonValue = str | int | float | bool | None | list["JsonValue"] | dict[str, "JsonValue"]


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
    kind = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if kind == "application/json" or kind.endswith("+json"):
        raw = await request.body()
        try:
            data = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
            raise invalid("Invalid JSON format") from None
        if not isinstance(data, dict):
            raise invalid("Invalid JSON format")
        return Fields(values=data, files={}, is_json=True)
    if kind in ("application/x-www-form-urlencoded", "multipart/form-data"):
        try:
            form = await request.form(max_files=1, max_fields=100)
        except (UnicodeDecodeError, ValueError, KeyError) as error:
            raise invalid(f"Invalid form data: {str(error)[:64]}") from None
        values: dict[str, JsonValue] = {}
        files: dict[str, UploadFile] = {}
        for name, value in form.multi_items():
            if isinstance(value, UploadFile):
                files[name] = value
            elif name in values:  # a repeated field is a list, as `q=a&q=b`
                previous = values[name]
                values[name] = [*previous, value] if isinstance(previous, list) else \
                    [previous, value]
            else:
                values[name] = value
        return Fields(values=values, files=files, is_json=False)
    if kind == "":
        return Fields(values=dict(request.query_params), files={}, is_json=False)
    raise invalid(f"Invalid request: content type {kind[:64]!r} is not supported; send JSON or "
                  "form fields")


class BodyLimit:
    """ASGI middleware: a body over `limit` bytes is answered 413 before it is read
    whole, whether it announced its length or not."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        length = headers.get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.limit:
            await self._refuse(send)
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
                if seen > self.limit:
                    over = True
                    return {"type": "http.disconnect"}
            return message

        async def checked_send(message: Message) -> None:
            if not over:
                await send(message)

        await self.app(scope, limited_receive, checked_send)
        if over:
            await self._refuse(send)

    async def _refuse(self, send: Send) -> None:
        body = json.dumps({"error": f"Request body too large: the limit is {self.limit} "
                                    "bytes"}).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

