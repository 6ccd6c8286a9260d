"""API keys and rate limits of the HTTP front door."""

from __future__ import annotations

from pathlib import Path

import pytest

from seq2serve.server.api.http.access import (
    Access,
    AccessDenied,
    KeyRequired,
    RateLimited,
    read_api_keys,
)
from seq2serve.server.config import ServerConfig


def test_keys_file_skips_comments_and_blank_lines(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text("# operators\nalpha-key\n\n  beta-key  # ci\n")
    assert read_api_keys(path) == ("alpha-key", "beta-key")


def test_a_wrong_key_is_refused_and_a_missing_one_only_when_required() -> None:
    open_door = Access(keys=["k1"])
    assert open_door.admit("10.0.0.1", None, None).key is None
    assert open_door.admit("10.0.0.1", None, "k1").key == "k1"
    with pytest.raises(AccessDenied, match="Invalid API key"):
        open_door.admit("10.0.0.1", None, "k2")
    locked = Access(keys=["k1"], require_key=True)
    with pytest.raises(KeyRequired, match="get an API key"):
        locked.admit("10.0.0.1", None, None)


@pytest.mark.parametrize("key", [None, "", "k1", "any-key", "an old key"])
def test_without_keys_any_key_is_ignored(key: str | None) -> None:
    """LibreTranslate's access_check looks at a key only when its key database is on
    (--api-keys): clients that always send one must work on a server without keys."""
    door = Access()
    assert door.uses_keys is False and door.require_key is False
    assert door.admit("10.0.0.1", None, key).key is None


def test_an_empty_keys_file_refuses_every_key_and_admits_none() -> None:
    """Keys are on with the file, even an empty one (LibreTranslate's empty database)."""
    door = Access(keys=[])
    assert door.uses_keys
    assert door.admit("10.0.0.1", None, None).key is None
    with pytest.raises(AccessDenied, match="Invalid API key"):
        door.admit("10.0.0.1", None, "k1")


def test_without_keys_the_budget_is_the_address_s_whatever_key_is_sent() -> None:
    door = Access(per_minute=2)
    door.admit("10.0.0.1", None, "k1")
    door.admit("10.0.0.1", None, "k2")
    with pytest.raises(RateLimited):  # a made-up key is no way around the limit
        door.admit("10.0.0.1", None, "k3")


def test_the_limit_is_per_client_and_a_list_costs_its_length() -> None:
    access = Access(per_minute=10)
    access.admit("10.0.0.1", None, None, cost=8)
    with pytest.raises(RateLimited, match=r"^Slowdown: 10 per 1 minute$"):
        access.admit("10.0.0.1", None, None, cost=3)
    access.admit("10.0.0.2", None, None, cost=10)  # another client has its own budget


def test_a_key_has_its_own_budget_whatever_the_address() -> None:
    access = Access(keys=["k1"], per_minute=2)
    access.admit("10.0.0.1", None, "k1")
    access.admit("10.0.0.2", None, "k1")
    with pytest.raises(RateLimited):
        access.admit("10.0.0.3", None, "k1")
    access.admit("10.0.0.1", None, None)  # the address's own budget is untouched


def test_forwarded_for_is_read_only_behind_a_trusted_proxy() -> None:
    networks = ServerConfig(trusted_proxies="127.0.0.1/32, 10.1.0.0/16").trusted_networks()
    access = Access(trusted_proxies=networks)
    # From a trusted proxy: the nearest hop it did not add.
    assert access.client_address("127.0.0.1", "203.0.113.7, 10.1.2.3") == "203.0.113.7"
    # From anyone else the header is the client's own claim: ignored.
    assert access.client_address("198.51.100.9", "203.0.113.7") == "198.51.100.9"
    assert access.client_address("127.0.0.1", None) == "127.0.0.1"


def test_a_key_s_character_limit_is_its_optional_second_column(tmp_path: Path) -> None:
    from seq2serve.server.api.http.access import KeyFileError, read_key_file

    path = tmp_path / "keys"
    path.write_text("alpha 500000  # trial\nbeta\n")
    found = read_key_file(path)
    assert found.keys == ("alpha", "beta") and dict(found.char_limits) == {"alpha": 500000}
    assert read_api_keys(path) == ("alpha", "beta")
    path.write_text("alpha lots\n")
    with pytest.raises(KeyFileError, match=r"keys:1: expected KEY or KEY CHARACTER_LIMIT"):
        read_key_file(path)


def test_deepl_usage_counts_a_key_s_characters_against_its_limit() -> None:
    from seq2serve.server.api.http.deepl_auth import DeepLAccess, QuotaExceeded

    door = DeepLAccess(Access(keys=["k1", "k2"], char_limits={"k1": 10}))
    k1 = door.access.admit("10.0.0.1", None, "k1")
    reserved = door.reserve(k1, 6)
    with pytest.raises(QuotaExceeded, match="used 6 of its 10 characters"):
        door.reserve(k1, 5)
    assert door.usage(k1).character_count == 6  # a refusal counts nothing
    door.refund(reserved)
    assert door.usage(k1).character_count == 0
    k2 = door.access.admit("10.0.0.1", None, "k2")
    door.reserve(k2, 10**9)  # no limit of its own
    assert door.usage(k2).character_limit > 10**9
