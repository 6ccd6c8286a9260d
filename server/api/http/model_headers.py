"""The HTTP door's side of routing by model (api/routing.py): the model or pair a
request's headers name, and the models that served it, collected for the answer's
X-Seq2serve-Model header.

Every core call a handler makes is a `door_call()`: it tells the request's
collector (set by the app's route wrapper around each request, and seen by the
handler's task, which copies the context it starts in) which model serves it,
so no handler needs to pass anything down for the header."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar

from starlette.requests import Request

from seq2serve.server.api.routing import MODEL_HEADER, PAIR_HEADER, Named
from seq2serve.server.core.requests import Call

_SERVED: ContextVar[list[str] | None] = ContextVar("seq2serve_served_models", default=None)


@contextlib.contextmanager
def collecting() -> Iterator[list[str]]:
    """The models the core calls made inside this block were served by, in order."""
    served: list[str] = []
    token = _SERVED.set(served)
    try:
        yield served
    finally:
        _SERVED.reset(token)


def door_call(timeout: float | None = None) -> Call:
    """A core Call whose served model goes to the current request's collector."""
    served = _SERVED.get()
    return Call(timeout, on_model=None if served is None else served.append)


def served_by(model: str) -> None:
    """Tell the current request's collector that `model` served it ("" : none did):
    a document job's model, which served the job apart from the request that answers
    with its result."""
    served = _SERVED.get()
    if served is not None and model:
        served.append(model)


def named(request: Request) -> Named:
    """The model or pair this request's headers name."""
    return Named.read(request.headers.get, MODEL_HEADER, PAIR_HEADER)
