"""The multilingual families (issue 46): M2M100 and NLLB-200 (model_type m2m_100) and
mBART-50 (mbart), each a tiny random model built with transformers' own classes and a
SentencePiece model trained here, tokenized by the family's own transformers tokenizer
class (M2M100Tokenizer, NllbTokenizer, MBart50Tokenizer) and saved as the hub's folders
are; exported; decoded by the engine and compared with generate() under the folder's
generation_config with the tokenizer's `src_lang` and `forced_bos_token_id` = the target
language, for several pairs; mixed-pair batches against each source alone at fp32,
int8 and fp16; the package's tokenizer against the family's class; language codes.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import family_checks
import pytest
import torch
import transformers
from conftest import CORPUS
from family_checks import assert_same_nbest, check_package_batch_invariance
from hf_reference import reference_nbest
from multilingual_folders import (
    EOS,
    FAMILIES,
    PAIRS,
    hf_model,
    hf_tokenizer,
    lang_id,
    make_folder,
    write_spm,
)
from torch import Tensor

from seq2serve.export.exporter import export
from seq2serve.model.families import m2m100, mbart
from seq2serve.model.families.source import SourceError
from seq2serve.model.package.languages import MULTILINGUAL
from seq2serve.model.package.manifest import load_package
from seq2serve.model.package.tokenizer import package_tokenizer

TOL = 1e-4
MAX_NEW = 16
TEXTS = CORPUS[:4] + ["unseen wörds: ☃ zebra", "Open", "  spaces   and\nnew lines  "]


@pytest.fixture(scope="module", params=FAMILIES)
def family(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def folder(family: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_folder(family, tmp_path_factory.mktemp(family) / f"tiny-{family}")


@pytest.fixture(scope="module")
def hf(family: str, folder: Path) -> Any:
    cls = (transformers.MBartForConditionalGeneration if family == "mbart50"
           else transformers.M2M100ForConditionalGeneration)
    return cls.from_pretrained(str(folder), attn_implementation="eager").eval()


@pytest.fixture(scope="module")
def package(folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("packages") / folder.name
    export(folder, out, progress=False)
    return out


@pytest.fixture(scope="module")
def engine(package: Path) -> Any:
    from seq2serve.server.assembly import default_limits
    from seq2serve.server.engine.engine import Engine
    from seq2serve.server.engine.runner import RunnerConfig

    return Engine(package, RunnerConfig(provider="cpu", intra_op_threads=1), default_limits())


# -- the model ---------------------------------------------------------------------------


def test_pytorch_parity(family: str, folder: Path, hf: Any) -> None:
    """Our model against transformers' on a right-padded batch: encoder, logits, every
    cached decoder step (positions from fairseq's sinusoids / the learned table)."""
    from test_bart_parity import inputs

    load = mbart.load_mbart if family == "mbart50" else m2m100.load_m2m100
    ours = load(folder)
    cfg = ours.cfg
    assert cfg.pre_norm and cfg.positions == "learned"
    assert cfg.layernorm_embedding == (family == "mbart50")
    assert cfg.final_logits_bias == (family == "mbart50")
    assert cfg.decoder_start_id == EOS and cfg.tgt_vocab_size == hf.config.vocab_size
    src, mask, tgt = inputs(hf.config.vocab_size)
    diffs = family_checks.assert_parity(hf, ours, src, mask, tgt, TOL)
    print(family, {k: f"{v:.1e}" for k, v in diffs.items()})


def test_sinusoids_are_transformers_table() -> None:
    """fairseq_sinusoids is M2M100SinusoidalPositionalEmbedding's table bit for bit
    (odd widths and another pad id included)."""
    from transformers.models.m2m_100.modeling_m2m_100 import (
        M2M100SinusoidalPositionalEmbedding as Theirs,
    )

    for rows, dim, pad in ((66, 32, 1), (40, 17, 0), (1026, 1024, 1)):
        assert torch.equal(m2m100.fairseq_sinusoids(rows, dim, pad),
                           Theirs.get_embedding(rows, dim, pad))


# -- the tokenizer ---------------------------------------------------------------------


def test_tokenizer_matches_the_family_class(family: str, folder: Path, package: Path) -> None:
    manifest = load_package(package).manifest
    languages = manifest.languages
    assert languages is not None and languages.source_token == "prefix"
    assert manifest.source_language == manifest.target_language == MULTILINGUAL
    ours = package_tokenizer(load_package(package))
    texts = [*TEXTS, "Müller größer Straße café Noël", "日本語 🙂", "zzqx ǂ ∰ unknown pieces",
             "", " ", "Don't stop , he said .", ">>de<< not a Marian code"]
    for src, _ in PAIRS[family]:
        tok = hf_tokenizer(family, folder, src)
        for text in texts:
            assert ours.encode(text, languages.token(src)) == tok(text)["input_ids"], (src, text)
    tok = hf_tokenizer(family, folder)
    assert tok.unk_token_id == manifest.special_tokens.unk == 3
    assert 3 in ours.encode("zzqx ǂ", languages.token(PAIRS[family][0][0]))
    g = torch.Generator().manual_seed(0)
    language_ids = sorted(languages.token_ids())
    rows = [tok(t)["input_ids"][1:-1] for t in texts]
    rows += [torch.randint(0, len(tok), (12,), generator=g).tolist() for _ in range(100)]
    rows += [[language_ids[0], 5, 6, language_ids[-1], 7, 3]]  # language tokens and <unk>
    for ids in rows:
        cut = ids[: ids.index(EOS)] if EOS in ids else ids  # ours stops at EOS
        # Language tokens never come back, also where the class does not skip them
        # (transformers 5's M2M100Tokenizer decodes them as text).
        text = [i for i in cut if i not in languages.token_ids()]
        assert ours.decode(ids) == tok.decode(text, skip_special_tokens=True), ids
    assert all(ours.decode([i]) == "" for i in language_ids)


def test_languages_are_the_family_classes(family: str, folder: Path, package: Path) -> None:
    """The package's languages are the family's tokenizer class's codes, each with the
    token id its class gives it; the codes requests use map to them."""
    languages = load_package(package).manifest.languages
    assert languages is not None
    tok = hf_tokenizer(family, folder)
    if family == "m2m100":
        from transformers.models.m2m_100.tokenization_m2m_100 import FAIRSEQ_LANGUAGE_CODES
        codes = FAIRSEQ_LANGUAGE_CODES["m2m100"]
        assert tuple(codes) == m2m100.M2M100_CODES["m2m100"]
    elif family == "nllb":
        from transformers.models.nllb.tokenization_nllb import FAIRSEQ_LANGUAGE_CODES as codes
        assert tuple(codes) == m2m100.NLLB_CODES
    else:
        from transformers.models.mbart50.tokenization_mbart50 import (
            FAIRSEQ_LANGUAGE_CODES as codes,
        )
        assert tuple(codes) == mbart.MBART50_CODES
    assert languages.tokens == {code: lang_id(family, tok, code) for code in codes}
    expected = {  # request code -> the model's own code
        # M2M100's zh is Simplified: zh-TW (Traditional) is not it (issue 51)
        "m2m100": {"en": "en", "de": "de", "pt-BR": "pt", "zh-Hans": "zh", "zh-TW": None,
                   "fil": "tl", "nso": "ns", "DE": "de", "__de__": None, "iw": "he",
                   "nb": "no"},
        "nllb": {"en": "eng_Latn", "de": "deu_Latn", "fr": "fra_Latn", "pt-BR": "por_Latn",
                 "zh": "zho_Hans", "zh-Hans": "zho_Hans", "zh-Hant": "zho_Hant",
                 "zh-TW": "zho_Hant", "zh-HK": "zho_Hant", "zh-CN": "zho_Hans",
                 "ar": "arb_Arab", "fa": "pes_Arab", "fa-AF": "prs_Arab", "ms": "zsm_Latn",
                 "sw": "swh_Latn", "no": "nob_Latn", "nb": "nob_Latn", "tl": "tgl_Latn",
                 "sr": "srp_Cyrl", "sr-Cyrl": "srp_Cyrl", "yue": "yue_Hant",
                 "eng_Latn": "eng_Latn", "eng-latn": "eng_Latn", "en-US": "eng_Latn"},
        "mbart50": {"en": "en_XX", "de": "de_DE", "de-DE": "de_DE", "de_DE": "de_DE",
                    "zh": "zh_CN", "zh-Hans": "zh_CN", "zh-CN": "zh_CN", "pt-BR": "pt_XX",
                    "tl": "tl_XX", "fil": "tl_XX"},
    }[family]
    for code, own in expected.items():
        assert languages.model_code(code) == own, (code, languages.model_code(code))
    for unknown in ("xx", "klingon", "", "tlh", "qaa-Latn"):
        assert languages.model_code(unknown) is None, unknown
    listed = languages.listed()
    assert sorted(listed.values()) == sorted(codes)
    # every language named (CLDR's English names), and listed as export chose
    assert set(languages.names) == set(listed) and all(languages.names.values())
    assert {languages.listing[own] for own in codes} == set(listed)
    assert listed.get({"m2m100": "en", "nllb": "en", "mbart50": "en"}[family]) is not None


# -- the engine against generate() ---------------------------------------------------


def _sources(family: str, folder: Path, package: Path,
             src: str) -> tuple[dict[str, Tensor], list[list[int]]]:
    tok = hf_tokenizer(family, folder, src)
    batch = tok(TEXTS, return_tensors="pt", padding=True)
    ours = package_tokenizer(load_package(package))
    languages = load_package(package).manifest.languages
    assert languages is not None
    sources = [ours.encode(t, languages.token(src)) for t in TEXTS]
    assert sources == [batch["input_ids"][i, : int(batch["attention_mask"][i].sum())].tolist()
                       for i in range(len(TEXTS))]
    return batch, sources


PARITY = {
    "greedy": ({}, {"beam_size": 1}),
    "beam4_nbest2": ({"num_beams": 4, "num_return_sequences": 2, "length_penalty": 1.5},
                     {"beam_size": 4, "num_hypotheses": 2, "length_penalty": 1.5}),
}


@pytest.mark.parametrize("case", list(PARITY))
def test_engine_matches_generate(case: str, family: str, folder: Path, package: Path,
                                 hf: Any, engine: Any) -> None:
    from seq2serve.server.core.options import DecodingOptions

    hf_kwargs, ours = PARITY[case]
    tok = hf_tokenizer(family, folder)
    for src, tgt in PAIRS[family]:
        batch, sources = _sources(family, folder, package, src)
        target = lang_id(family, tok, tgt)
        ref = reference_nbest(hf, batch, do_sample=False, max_new_tokens=MAX_NEW,
                              forced_bos_token_id=target, **hf_kwargs)
        results = engine.generate(sources, DecodingOptions(max_length=MAX_NEW,
                                                           max_length_ratio=0, **ours),
                                  forced_bos=[target] * len(sources))
        assert all(h.token_ids[0] == target for r in results for h in r)
        diff = assert_same_nbest(ref, results, TOL)
        print(family, case, src, tgt, f"score diff {diff:.1e}")


def test_mixed_pairs_batch_equals_each_alone(family: str, package: Path) -> None:
    """Texts of different source and target languages in one batch decode bit for bit
    as each alone (request codes: what the server passes)."""
    pairs = {"m2m100": [("en", "de"), ("de", "fr"), ("fr", "en"), ("zh-Hans", "pt-BR")],
             "nllb": [("en", "de"), ("de", "fr"), ("zh-TW", "en"), ("fr", "zh-Hans")],
             "mbart50": [("en", "de"), ("de", "fr"), ("fr", "en"), ("zh", "pt-BR")]}[family]
    check_package_batch_invariance(package, TEXTS, MAX_NEW, pairs)


def test_export_int8_fp16(family: str, folder: Path, package: Path, tmp_path: Path) -> None:
    manifest = load_package(package).manifest
    assert manifest.task == "translate"
    assert manifest.exporter["fp32_deviation"]["log_probs"] <= TOL  # type: ignore[index]
    pairs = [("en", "de"), ("de", "fr"), ("fr", "en")]
    for precision in ("int8", "fp16"):
        report = export(folder, tmp_path / precision, precision=precision, progress=False)
        assert report.precision == precision
        if precision == "fp16":
            assert report.deviation["log_probs"] <= 0.05
        exported = load_package(tmp_path / precision).manifest
        assert exported.languages == manifest.languages
        check_package_batch_invariance(tmp_path / precision, TEXTS[:5], MAX_NEW, pairs)


# -- odd folders -------------------------------------------------------------------------


def test_nllb_legacy_behaviour_puts_the_language_last(tmp_path: Path) -> None:
    folder = make_folder("nllb", tmp_path / "nllb")
    file = folder / "tokenizer_config.json"
    file.write_text(json.dumps({**json.loads(file.read_text()), "legacy_behaviour": True}))
    export(folder, tmp_path / "out", progress=False)
    package = load_package(tmp_path / "out")
    languages = package.manifest.languages
    assert languages is not None and languages.source_token == "suffix"
    ours = package_tokenizer(package)
    tok = hf_tokenizer("nllb", folder, "deu_Latn")
    assert tok.legacy_behaviour
    for text in TEXTS:
        assert ours.encode(text, languages.token("de")) == tok(text)["input_ids"]


def test_odd_folders_are_refused(tmp_path: Path) -> None:
    # mBART-25 (MBartTokenizer): another token scheme
    folder = make_folder("mbart50", tmp_path / "mbart25")
    file = folder / "tokenizer_config.json"
    file.write_text(json.dumps({**json.loads(file.read_text()),
                                "tokenizer_class": "MBartTokenizer"}))
    with pytest.raises(SourceError, match="only mBART-50"):
        export(folder, tmp_path / "out", progress=False)
    # an M2M100 folder without its tokenizer
    folder = make_folder("m2m100", tmp_path / "m2m")
    (folder / "vocab.json").unlink()
    with pytest.raises(SourceError, match="vocab.json"):
        export(folder, tmp_path / "out", progress=False)
    # an unknown tokenizer class; a summarization task asked of a translation model
    folder = make_folder("nllb", tmp_path / "nllb")
    with pytest.raises(SourceError, match="translates"):
        export(folder, tmp_path / "out", progress=False, task="summarize")
    file = folder / "tokenizer_config.json"
    file.write_text(json.dumps({**json.loads(file.read_text()), "tokenizer_class": "T5Tokenizer"}))
    with pytest.raises(SourceError, match="neither NLLB's"):
        export(folder, tmp_path / "out", progress=False)
    # a tokenizer.json without any of the family's language tokens (what transformers 5's
    # NllbTokenizer builds from sentencepiece.bpe.model alone)
    shutil.rmtree(folder)
    write_spm(folder)
    tok = transformers.NllbTokenizer.from_pretrained(str(folder))
    tok.save_pretrained(str(folder))
    hf_model("nllb", len(tok) + 3).save_pretrained(folder)
    with pytest.raises(SourceError, match="none of NLLB-200's language tokens"):
        export(folder, tmp_path / "out", progress=False)


def test_stored_position_tables_are_checked(tmp_path: Path) -> None:
    """Older M2M100 files store the sinusoid tables (`embed_positions.weights`): the
    table itself is read and accepted, another (learned positions) refused by name."""
    from safetensors.torch import load_file, save_file

    from seq2serve.model.families.hf import ConversionError

    folder = make_folder("m2m100", tmp_path / "m2m")
    hf = transformers.M2M100ForConditionalGeneration.from_pretrained(str(folder))
    state = load_file(folder / "model.safetensors")
    for side in ("encoder", "decoder"):
        state[f"model.{side}.embed_positions.weights"] = \
            getattr(hf.model, side).embed_positions.weights.clone()
    save_file(state, folder / "model.safetensors")
    cfg, converted = m2m100.convert_m2m100(folder)
    assert converted["src_positions"].shape == (cfg.max_positions, cfg.d_model)
    state["model.decoder.embed_positions.weights"] += 0.01
    save_file(state, folder / "model.safetensors")
    with pytest.raises(ConversionError, match="model.decoder.embed_positions.weights is not"):
        m2m100.convert_m2m100(folder)


def test_the_registry_names_the_families(tmp_path: Path) -> None:
    from seq2serve.model.families.registry import FAMILIES

    assert FAMILIES["m2m_100"].load is m2m100.load_source
    assert FAMILIES["mbart"].load is mbart.load_source
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "nllb_moe"}))
    with pytest.raises(SourceError, match="'m2m_100'.*'mbart'"):
        export(tmp_path, tmp_path / "out", progress=False)


VARIANTS = {
    # M2M100Config's other settings: unscaled embeddings, gelu, untied output
    "m2m100_unscaled_untied": ("m2m100", dict(scale_embedding=False, activation_function="gelu",
                                              tie_word_embeddings=False, decoder_layers=3)),
    # MBartConfig's defaults: unscaled, and no decoder_start_token_id (generate() starts
    # from bos_token_id)
    "mbart50_class_defaults": ("mbart50", dict(scale_embedding=False,
                                               decoder_start_token_id=None)),
}


@pytest.mark.parametrize("case", list(VARIANTS))
def test_config_variants(case: str, tmp_path: Path) -> None:
    """Our model against transformers' where a config differs from the hub's, and the
    engine against generate() (greedy, one pair)."""
    from test_bart_parity import inputs

    from seq2serve.server.assembly import default_limits
    from seq2serve.server.core.options import DecodingOptions
    from seq2serve.server.engine.engine import Engine
    from seq2serve.server.engine.runner import RunnerConfig

    family, overrides = VARIANTS[case]
    folder = make_folder(family, tmp_path / case, seed=3, **overrides)
    cls = (transformers.MBartForConditionalGeneration if family == "mbart50"
           else transformers.M2M100ForConditionalGeneration)
    hf = cls.from_pretrained(str(folder), attn_implementation="eager").eval()
    load = mbart.load_mbart if family == "mbart50" else m2m100.load_m2m100
    ours = load(folder)
    assert ours.cfg.scale_embedding is False
    start = hf.generation_config.decoder_start_token_id
    assert ours.cfg.decoder_start_id == (hf.generation_config.bos_token_id if start is None
                                         else start)
    src, mask, tgt = inputs(hf.config.vocab_size)
    tgt[:, 0] = ours.cfg.decoder_start_id
    family_checks.assert_parity(hf, ours, src, mask, tgt, TOL)
    export(folder, tmp_path / "out", progress=False)
    engine = Engine(tmp_path / "out", RunnerConfig(provider="cpu", intra_op_threads=1),
                    default_limits())
    src_lang, tgt_lang = PAIRS[family][1]
    batch, sources = _sources(family, folder, tmp_path / "out", src_lang)
    target = lang_id(family, hf_tokenizer(family, folder), tgt_lang)
    ref = reference_nbest(hf, batch, do_sample=False, max_new_tokens=MAX_NEW,
                          forced_bos_token_id=target)
    results = engine.generate(sources, DecodingOptions(beam_size=1, max_length=MAX_NEW,
                                                       max_length_ratio=0),
                              forced_bos=[target] * len(sources))
    assert_same_nbest(ref, results, TOL)


def test_defaults_are_the_config_classes() -> None:
    """What a config.json that omits a key means: the config class's default (mBART's
    missing decoder start is generate()'s fallback, BOS)."""
    for defaults, config in ((m2m100.HF_DEFAULTS, transformers.M2M100Config()),
                             (mbart.HF_DEFAULTS, transformers.MBartConfig())):
        for key, value in defaults.items():
            theirs = getattr(config, key)
            if key == "decoder_start_token_id" and theirs is None:
                theirs = config.bos_token_id
            assert theirs == value, key


def test_mixed_pairs_batch_matches_generate(family: str, folder: Path, package: Path,
                                            hf: Any, engine: Any) -> None:
    """One engine batch of every pair (beam 4, n-best 2) against generate() run pair by
    pair with the tokenizer's src_lang and the target as forced_bos_token_id."""
    from hf_reference import reference_nbest_by_pair

    from seq2serve.server.core.options import DecodingOptions

    tok = hf_tokenizer(family, folder)
    languages = load_package(package).manifest.languages
    assert languages is not None
    ours = package_tokenizer(load_package(package))
    pairs = [PAIRS[family][i % len(PAIRS[family])] for i in range(len(TEXTS))]
    targets = [lang_id(family, tok, tgt) for _, tgt in pairs]

    def encode(texts: list[str], src_lang: str) -> Any:
        return hf_tokenizer(family, folder, src_lang)(texts, return_tensors="pt", padding=True)

    ref = reference_nbest_by_pair(hf, encode, TEXTS, [(s, t) for (s, _), t in
                                                      zip(pairs, targets, strict=True)],
                                  num_beams=4, num_return_sequences=2, do_sample=False,
                                  max_new_tokens=MAX_NEW)
    sources = [ours.encode(text, languages.token(src))
               for text, (src, _) in zip(TEXTS, pairs, strict=True)]
    results = engine.generate(sources, DecodingOptions(beam_size=4, num_hypotheses=2,
                                                       max_length=MAX_NEW, max_length_ratio=0),
                              forced_bos=targets)
    assert_same_nbest(ref, results, TOL)


def test_an_unreadable_tokenizer_json_is_named(tmp_path: Path) -> None:
    folder = make_folder("nllb", tmp_path / "nllb")
    (folder / "tokenizer.json").write_text("{}")
    with pytest.raises(SourceError, match="tokenizer.json: no vocabulary"):
        export(folder, tmp_path / "out", progress=False)
