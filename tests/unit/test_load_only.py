"""--load-only (server/assembly.py chosen_packages): model names, or language codes as
LibreTranslate's LT_LOAD_ONLY, choosing the shipped packages that serve them."""

from __future__ import annotations

from pathlib import Path

import pytest

from seq2serve.model.package.manifest import ModelPackage, load_package
from seq2serve.server.assembly import ModelLoadError, chosen_packages, find_packages
from tests.serving import server_config

SHIPPED = Path(__file__).resolve().parents[2] / "models"
PAIRS = ("de-en", "en-de", "en-fr", "fr-en", "summarize-en")

pytestmark = pytest.mark.skipif(not all((SHIPPED / p / "manifest.json").is_file()
                                        for p in PAIRS), reason="the shipped models")


@pytest.fixture(scope="module")
def packages() -> list[ModelPackage]:
    return [load_package(p) for p in find_packages(SHIPPED)]


def chosen(packages: list[ModelPackage], load_only: str) -> list[str]:
    config = server_config(SHIPPED, load_only=load_only)
    return sorted(p.path.name for p in chosen_packages(config, packages))


def test_languages_choose_the_packages_whose_languages_are_all_among_them(
        packages: list[ModelPackage]) -> None:
    assert chosen(packages, "en,de") == ["de-en", "en-de", "summarize-en"]
    assert chosen(packages, "en,fr,de") == list(PAIRS)
    assert chosen(packages, "") == list(PAIRS)


def test_names_choose_those_models(packages: list[ModelPackage]) -> None:
    name = next(p.manifest.name for p in packages if p.path.name == "en-fr")
    assert chosen(packages, name) == ["en-fr"]
    assert chosen(packages, f"{name},de,en") == ["de-en", "en-de", "en-fr", "summarize-en"]


def test_a_name_that_is_neither_a_model_nor_a_language_is_refused(
        packages: list[ModelPackage]) -> None:
    with pytest.raises(ModelLoadError, match="--load-only names 'xx-model'"):
        chosen(packages, "en,de,xx-model")
