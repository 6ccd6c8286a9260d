"""Routing by model for gateways: the names a request's model and pair travel under
outside its body, so that a proxy (deploy/nginx/seq2serve-by-model.conf) can send
each request to the replicas that hold its model, and the name of the model that
served an answer.

- A request may name its model or its pair in a header (HTTP) or metadata key
  (gRPC). Each fills the body's field where the body leaves it unset; where both
  are set and differ, the request is refused naming both (never one silently
  preferred). The body stays the request: the header is what a proxy reads.
- An answer names the model that served it: a gRPC trailing metadata key, an HTTP
  response header. A chain through English names both legs, in order, joined by
  "+" (`de-en+en-fr`), as the answer's `model` field and the metrics' label do;
  an HTTP answer served by several routes (LibreTranslate's `source: auto` with
  texts in several languages) lists each once, comma-separated (RFC 9110's list
  syntax). An answer no model served (source and target the same language) has none.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from urllib.parse import quote

from seq2serve.server.core.errors import InvalidArgument, echo
from seq2serve.server.core.requests import SummarizeRequest, TranslateRequest

# gRPC metadata keys (lowercase, as HTTP/2 carries them): on a request, the model or
# pair asked for; in an answer's trailing metadata, the model that served it.
MODEL_KEY = "seq2serve-model"
PAIR_KEY = "seq2serve-pair"
# The same for HTTP (nginx reads them as $http_x_seq2serve_model, $http_x_seq2serve_pair).
MODEL_HEADER = "X-Seq2serve-Model"
PAIR_HEADER = "X-Seq2serve-Pair"
# Model names are whatever a package's manifest says: in a header value, anything but
# printable ASCII, and the list's comma, is percent-encoded (RFC 3986).
_SAFE = "".join(chr(c) for c in range(0x21, 0x7F) if chr(c) not in '%,"\\')


@dataclass(frozen=True)
class Named:
    """What a request's headers name: a model, a pair ("" where a header is absent),
    and the headers' names as the door spells them (for error messages)."""

    model: str = ""
    source: str = ""
    target: str = ""
    model_key: str = MODEL_KEY
    pair_key: str = PAIR_KEY

    @classmethod
    def read(cls, get: Callable[[str], str | None], model_key: str, pair_key: str) -> Named:
        """From a door's headers (`get(name)`: the value, or None where absent)."""
        model = (get(model_key) or "").strip()
        pair = (get(pair_key) or "").strip()
        source, target = split_pair(pair, pair_key) if pair else ("", "")
        return cls(model, source, target, model_key, pair_key)

    @property
    def empty(self) -> bool:
        return not (self.model or self.source)


NOTHING = Named()  # a request whose headers name nothing


def split_pair(value: str, key: str) -> tuple[str, str]:
    """`en-de` -> ("en", "de"); `zh-Hant:en` -> ("zh-Hant", "en"): a code with a hyphen
    of its own needs the colon, which no language code holds."""
    separator = ":" if ":" in value else "-"
    parts = value.split(separator)
    if len(parts) != 2 or not all(p.strip() for p in parts):
        raise InvalidArgument(
            f"{key} must be SOURCE-TARGET (en-de), or SOURCE:TARGET where a code has a "
            f"hyphen (zh-Hant:en), got {echo(value)}")
    return parts[0].strip(), parts[1].strip()


def agree(body: str, named: str, field: str, key: str, *, fold: bool = False) -> str:
    """The request's value: the body's, else the header's; a conflict is refused."""
    if not named:
        return body
    if not body:
        return named
    same = body.casefold() == named.casefold() if fold else body == named
    if not same:
        raise InvalidArgument(
            f"the request's {field} is {echo(body)} but its {key} header says "
            f"{echo(named)}: leave one out or make them agree")
    return body


def pair_of(source: str, target: str, named: Named, fields: tuple[str, str]
            ) -> tuple[str, str]:
    """A request's (source, target) with the pair header's filled in or checked;
    `fields`: the body's names for the two (the message names them)."""
    return (agree(source, named.source, fields[0], named.pair_key, fold=True),
            agree(target, named.target, fields[1], named.pair_key, fold=True))


def translate_request(request: TranslateRequest, named: Named) -> TranslateRequest:
    """The core's request with what the headers name (the .proto's field names)."""
    if named.empty:
        return request
    source, target = pair_of(request.source_language, request.target_language, named,
                             ("source_language", "target_language"))
    return dataclasses.replace(
        request, model=agree(request.model, named.model, "model", named.model_key),
        source_language=source, target_language=target)


def summarize_request(request: SummarizeRequest, named: Named) -> SummarizeRequest:
    if named.source:
        raise InvalidArgument(f"{named.pair_key} names a translation pair; a summary has "
                              f"none (name its model in {named.model_key}, or nothing)")
    if not named.model:
        return request
    return dataclasses.replace(
        request, model=agree(request.model, named.model, "model", named.model_key))


def served_value(models: Iterable[str]) -> str:
    """The answer's header value: each route's model (a chain's joined by "+") once,
    in the order served, comma-separated; "" where no model served it."""
    return ", ".join(quote(m, safe=_SAFE) for m in dict.fromkeys(m for m in models if m))
