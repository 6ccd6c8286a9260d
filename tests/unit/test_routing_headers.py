"""The headers a gateway routes on (server/api/routing.py): a pair's two spellings,
the body winning only when it agrees, and the served-model header's value."""

from __future__ import annotations

from urllib.parse import unquote

import pytest

from seq2serve.server.api.routing import (
    NOTHING,
    Named,
    served_value,
    split_pair,
    summarize_request,
    translate_request,
)
from seq2serve.server.core.errors import InvalidArgument
from seq2serve.server.core.requests import SummarizeRequest, TranslateRequest


def named(**headers: str) -> Named:
    return Named.read(headers.get, "model", "pair")


@pytest.mark.parametrize(("value", "pair"), [
    ("en-de", ("en", "de")), (" en - de ", ("en", "de")), ("zh-Hant:en", ("zh-Hant", "en")),
    ("por_Latn-deu_Latn", ("por_Latn", "deu_Latn")),
])
def test_a_pair_and_its_two_spellings(value: str, pair: tuple[str, str]) -> None:
    assert split_pair(value, "X-Seq2serve-Pair") == pair


@pytest.mark.parametrize("value", ["en", "pt-BR-en", "en-", ":de", "a:b:c"])
def test_an_ambiguous_or_half_pair_is_refused_naming_the_header(value: str) -> None:
    with pytest.raises(InvalidArgument, match="X-Seq2serve-Pair must be SOURCE-TARGET"):
        split_pair(value, "X-Seq2serve-Pair")


def test_headers_fill_what_the_body_leaves_unset() -> None:
    request = TranslateRequest(texts=("x",))
    assert translate_request(request, NOTHING) is request
    filled = translate_request(request, named(pair="en-fr", model="m"))
    assert (filled.model, filled.source_language, filled.target_language) == ("m", "en", "fr")
    # Agreeing with the body (codes in any case) changes nothing.
    body = TranslateRequest(texts=("x",), model="m", source_language="EN", target_language="fr")
    assert translate_request(body, named(pair="en-fr", model="m")) == body


@pytest.mark.parametrize(("body", "headers", "words"), [
    (TranslateRequest(texts=("x",), model="a"), {"model": "b"}, ["model", "'a'", "'b'"]),
    (TranslateRequest(texts=("x",), source_language="de"), {"pair": "en-fr"},
     ["source_language", "'de'", "'en'", "pair"]),
])
def test_a_conflict_names_both(body: TranslateRequest, headers: dict[str, str],
                               words: list[str]) -> None:
    with pytest.raises(InvalidArgument) as caught:
        translate_request(body, named(**headers))
    for word in words:
        assert word in caught.value.message


def test_a_summary_takes_a_model_header_and_refuses_a_pair() -> None:
    request = SummarizeRequest(texts=("x",))
    assert summarize_request(request, named(model="s")).model == "s"
    with pytest.raises(InvalidArgument, match="a summary has none"):
        summarize_request(request, named(pair="en-de"))


def test_the_served_value_lists_each_route_once_and_stays_a_header() -> None:
    assert served_value([]) == "" and served_value([""]) == ""
    assert served_value(["de-en+en-fr", "en-fr", "de-en+en-fr"]) == "de-en+en-fr, en-fr"
    odd = "modèle, v2"  # a manifest may name a model anything
    value = served_value([odd])
    assert value.isascii() and "," not in value and " " not in value
    assert unquote(value) == odd
