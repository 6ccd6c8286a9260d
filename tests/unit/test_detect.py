"""Language identification among the served languages, on the project's own test text."""

from pathlib import Path

import pytest

from seq2serve.server.core.detect import Detection, Detector

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = {
    "en": ROOT / "tests/fixtures/ddtp_en_test_sample.txt",
    # The models' translations of the DDTP test set: German and French text.
    "de": ROOT / "models/checkpoints/en-de/test-ddtp.hyp",
    "fr": ROOT / "models/checkpoints/en-fr/test-ddtp.hyp",
}


@pytest.fixture(scope="module")
def detector() -> Detector:
    return Detector(["en", "de", "fr"])


@pytest.mark.parametrize("language", sorted(SAMPLES))
def test_accuracy_on_the_test_sentences(detector, language):
    path = SAMPLES[language]
    if not path.exists():
        pytest.skip(f"{path} is not in this checkout")
    lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    right = sum(detector.detect(line)[0].language == language for line in lines)
    # Measured: en 96.5 %, de 98.9 %, fr 97.4 % (the misses are mostly package names and
    # English terms left in the translations).
    assert right / len(lines) >= 0.95, f"{language}: {right}/{len(lines)}"


@pytest.mark.parametrize("text, language", [
    ("Hello world", "en"),
    ("Datei speichern", "de"),
    ("Enregistrer le fichier", "fr"),
    ("Neuland", "de"),
    ("Annuler", "fr"),
    ("Tout philosophe a deux philosophies : la sienne et celle de Spinoza.", "fr"),
])
def test_short_text(detector, text, language):
    assert detector.detect(text)[0].language == language


def test_answer_is_served_languages_best_first_with_confidences_0_to_100(detector):
    found = detector.detect("Der schnelle braune Fuchs springt über den faulen Hund.")
    assert found[0] == Detection("de", pytest.approx(found[0].confidence))
    assert {d.language for d in found} <= {"en", "de", "fr"}
    assert all(0 < d.confidence <= 100 for d in found)
    assert [d.confidence for d in found] == sorted((d.confidence for d in found), reverse=True)
    assert sum(d.confidence for d in found) == pytest.approx(100, abs=0.02)
    assert all(d.confidence == round(d.confidence, 2) for d in found)


def test_text_in_an_unserved_language_gets_a_served_one(detector):
    found = detector.detect("El rápido zorro marrón salta sobre el perro perezoso.")
    assert found and {d.language for d in found} <= {"en", "de", "fr"}


@pytest.mark.parametrize("text", ["", "   \n\t", "!!! ???", "123 456", "€ 3,50", "<>&;",
                                  "😀😀", "你好世界", "Привет мир"])
def test_no_served_language_to_see_is_an_empty_answer(detector, text):
    assert detector.detect(text) == []


def test_same_text_same_answer(detector):
    text = "Ceci est un paquet de transition."
    first = detector.detect(text)
    assert all(detector.detect(text) == first for _ in range(200))


def test_one_language():
    detector = Detector(["de"])
    assert detector.detect("Guten Morgen, wie geht es dir?") == [Detection("de", 100.0)]
    assert detector.detect("你好世界") == []


def test_codes_are_reported_as_served():
    detector = Detector(["en-US", "de_DE", "fr", "fr"])
    assert detector.languages == ("en-US", "de_DE", "fr")
    assert detector.detect("Die Datei wurde gespeichert.")[0].language == "de_DE"


def test_can_identify():
    assert Detector.can_identify("de")
    assert Detector.can_identify("pt-BR")
    assert not Detector.can_identify("xx")
    assert not Detector.can_identify("")
    assert not Detector.can_identify("eng")


@pytest.mark.parametrize("languages, error, message", [
    ([], ValueError, "languages: at least one"),
    (["en", "xx"], ValueError, "languages: 'xx' is not a language"),
    ("en", TypeError, "languages: a sequence of codes"),
])
def test_bad_languages(languages, error, message):
    with pytest.raises(error, match=message):
        Detector(languages)
