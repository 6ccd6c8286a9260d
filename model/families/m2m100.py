"""Load a Hugging Face M2M100 directory (M2M100ForConditionalGeneration:
facebook/m2m100_418M, m2m100_1.2B, and NLLB-200, e.g. nllb-200-distilled-600M,
which is the same model_type "m2m_100") into `Seq2SeqTransformer`, as a family of
BART's layout (`M2M100`, a `bart.Layout`), and as a multilingual package's source
(multilingual.py).

Exactness notes (checked against transformers 5.24 `modeling_m2m_100.py`):
- Pre-norm layers (LayerNorm before each sub-layer, eps 1e-5) and a final LayerNorm
  after each stack; no `layernorm_embedding`; relu (`activation_function`); no
  final_logits_bias; layer tensors carry BART's names.
- Token embeddings are scaled by sqrt(d_model) iff `scale_embedding` (M2M100Config's
  default: True).
- Positions are fairseq's sinusoids (`M2M100SinusoidalPositionalEmbedding`: sines in
  the first half of the vector, cosines in the second, frequencies
  exp(-i log(10000) / (d/2 - 1)), the padding row zero), looked up at
  cumsum(non-pad) + pad_token_id: in a right-padded sequence position p is row
  p + pad_token_id + 1. The table is a buffer transformers computes, never stored: we
  compute it at conversion exactly as transformers does and keep it as a learned
  table from that row on (BART's offset folding). A stored one (older files) must
  equal it (transformers 5 ignores it and computes the table, as we do). A
  generated pad token would take the zero row in transformers (its
  positions count non-pad tokens): generate() and the package differ only there.
- The decoder starts from </s> (decoder_start_token_id 2); the target language is
  the forced first token, given per source by the server.
- Tokenizers: an NLLB folder (tokenizer_config's tokenizer_class NllbTokenizer[Fast],
  or a tokenizer.json with NLLB's language tokens such as eng_Latn) carries its
  tokenizer.json (NllbTokenizer is a `tokenizers` backend in transformers 5); its
  `legacy_behaviour` puts the source language token after the EOS instead of first.
  An M2M100 folder is sentencepiece.bpe.model + vocab.json with the language tokens
  `__xx__` numbered after vocab.json (M2M100Tokenizer, a Python tokenizer);
  tokenizer_config's `language_codes` picks the list (m2m100, or wmt21's eight).
- Model vocabularies are larger than the tokenizers (NLLB 256206): every row is kept.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from seq2serve.model.config import ModelConfig
from seq2serve.model.families import bart, multilingual
from seq2serve.model.families.hf import TOKENIZER_JSON, Weights
from seq2serve.model.families.source import Source, SourceError
from seq2serve.model.families.tasks import TaskRequest
from seq2serve.model.transformer import Seq2SeqTransformer

# transformers' M2M100Config defaults: a config.json that omits a field means these
# (BartConfig's but for these four).
HF_DEFAULTS: dict[str, Any] = {**bart.HF_DEFAULTS, "vocab_size": 128112,
                               "activation_function": "relu", "attention_dropout": 0.1,
                               "scale_embedding": True}

SUPPORTED_ARCHITECTURES = ("M2M100ForConditionalGeneration", "M2M100Model")

# M2M100Tokenizer's FAIRSEQ_LANGUAGE_CODES (transformers 5.24), by `language_codes`.
M2M100_CODES = {
    "m2m100": (
        "af", "am", "ar", "ast", "az", "ba", "be", "bg", "bn", "br", "bs", "ca", "ceb", "cs",
        "cy", "da", "de", "el", "en", "es", "et", "fa", "ff", "fi", "fr", "fy", "ga", "gd",
        "gl", "gu", "ha", "he", "hi", "hr", "ht", "hu", "hy", "id", "ig", "ilo", "is", "it",
        "ja", "jv", "ka", "kk", "km", "kn", "ko", "lb", "lg", "ln", "lo", "lt", "lv", "mg",
        "mk", "ml", "mn", "mr", "ms", "my", "ne", "nl", "no", "ns", "oc", "or", "pa", "pl",
        "ps", "pt", "ro", "ru", "sd", "si", "sk", "sl", "so", "sq", "sr", "ss", "su", "sv",
        "sw", "ta", "th", "tl", "tn", "tr", "uk", "ur", "uz", "vi", "wo", "xh", "yi", "yo",
        "zh", "zu"),
    "wmt21": ("en", "ha", "is", "ja", "cs", "ru", "zh", "de"),
}

# NllbTokenizer's FAIRSEQ_LANGUAGE_CODES (transformers 5.24).
NLLB_CODES = (
    "ace_Arab", "ace_Latn", "acm_Arab", "acq_Arab", "aeb_Arab", "afr_Latn", "ajp_Arab",
    "aka_Latn", "amh_Ethi", "apc_Arab", "arb_Arab", "ars_Arab", "ary_Arab", "arz_Arab",
    "asm_Beng", "ast_Latn", "awa_Deva", "ayr_Latn", "azb_Arab", "azj_Latn", "bak_Cyrl",
    "bam_Latn", "ban_Latn", "bel_Cyrl", "bem_Latn", "ben_Beng", "bho_Deva", "bjn_Arab",
    "bjn_Latn", "bod_Tibt", "bos_Latn", "bug_Latn", "bul_Cyrl", "cat_Latn", "ceb_Latn",
    "ces_Latn", "cjk_Latn", "ckb_Arab", "crh_Latn", "cym_Latn", "dan_Latn", "deu_Latn",
    "dik_Latn", "dyu_Latn", "dzo_Tibt", "ell_Grek", "eng_Latn", "epo_Latn", "est_Latn",
    "eus_Latn", "ewe_Latn", "fao_Latn", "pes_Arab", "fij_Latn", "fin_Latn", "fon_Latn",
    "fra_Latn", "fur_Latn", "fuv_Latn", "gla_Latn", "gle_Latn", "glg_Latn", "grn_Latn",
    "guj_Gujr", "hat_Latn", "hau_Latn", "heb_Hebr", "hin_Deva", "hne_Deva", "hrv_Latn",
    "hun_Latn", "hye_Armn", "ibo_Latn", "ilo_Latn", "ind_Latn", "isl_Latn", "ita_Latn",
    "jav_Latn", "jpn_Jpan", "kab_Latn", "kac_Latn", "kam_Latn", "kan_Knda", "kas_Arab",
    "kas_Deva", "kat_Geor", "knc_Arab", "knc_Latn", "kaz_Cyrl", "kbp_Latn", "kea_Latn",
    "khm_Khmr", "kik_Latn", "kin_Latn", "kir_Cyrl", "kmb_Latn", "kon_Latn", "kor_Hang",
    "kmr_Latn", "lao_Laoo", "lvs_Latn", "lij_Latn", "lim_Latn", "lin_Latn", "lit_Latn",
    "lmo_Latn", "ltg_Latn", "ltz_Latn", "lua_Latn", "lug_Latn", "luo_Latn", "lus_Latn",
    "mag_Deva", "mai_Deva", "mal_Mlym", "mar_Deva", "min_Latn", "mkd_Cyrl", "plt_Latn",
    "mlt_Latn", "mni_Beng", "khk_Cyrl", "mos_Latn", "mri_Latn", "zsm_Latn", "mya_Mymr",
    "nld_Latn", "nno_Latn", "nob_Latn", "npi_Deva", "nso_Latn", "nus_Latn", "nya_Latn",
    "oci_Latn", "gaz_Latn", "ory_Orya", "pag_Latn", "pan_Guru", "pap_Latn", "pol_Latn",
    "por_Latn", "prs_Arab", "pbt_Arab", "quy_Latn", "ron_Latn", "run_Latn", "rus_Cyrl",
    "sag_Latn", "san_Deva", "sat_Beng", "scn_Latn", "shn_Mymr", "sin_Sinh", "slk_Latn",
    "slv_Latn", "smo_Latn", "sna_Latn", "snd_Arab", "som_Latn", "sot_Latn", "spa_Latn",
    "als_Latn", "srd_Latn", "srp_Cyrl", "ssw_Latn", "sun_Latn", "swe_Latn", "swh_Latn",
    "szl_Latn", "tam_Taml", "tat_Cyrl", "tel_Telu", "tgk_Cyrl", "tgl_Latn", "tha_Thai",
    "tir_Ethi", "taq_Latn", "taq_Tfng", "tpi_Latn", "tsn_Latn", "tso_Latn", "tuk_Latn",
    "tum_Latn", "tur_Latn", "twi_Latn", "tzm_Tfng", "uig_Arab", "ukr_Cyrl", "umb_Latn",
    "urd_Arab", "uzn_Latn", "vec_Latn", "vie_Latn", "war_Latn", "wol_Latn", "xho_Latn",
    "ydd_Hebr", "yor_Latn", "yue_Hant", "zho_Hans", "zho_Hant", "zul_Latn")

# The codes that follow no rule. M2M100's `ns` is fairseq's Northern Sotho (ISO nso);
# ISO 639-1 `tl` (Tagalog; CLDR's `fil`) and the macrolanguage `no` (Norwegian: NLLB
# has Bokmål and Nynorsk) name one NLLB language each.
M2M100_TAGS = {"ns": "nso"}
NLLB_PREFERRED = {"tl": "tgl_Latn", "no": "nob_Latn"}


def _tag(code: str) -> str:
    return M2M100_TAGS.get(code, code)


def _m2m100_scheme(codes: str) -> multilingual.Scheme:
    return multilingual.Scheme(
        name="M2M100", kind="sentencepiece", tokenizer_class="M2M100Tokenizer",
        codes=M2M100_CODES[codes], tag_of=_tag, token_of=lambda code: f"__{code}__")


NLLB = multilingual.Scheme(
    name="NLLB-200", kind="tokenizers", tokenizer_class="NllbTokenizer", codes=NLLB_CODES,
    tag_of=lambda code: code.replace("_", "-"), preferred=NLLB_PREFERRED)


def fairseq_sinusoids(rows: int, dim: int, padding_idx: int | None) -> Tensor:
    """(rows, dim) M2M100SinusoidalPositionalEmbedding.get_embedding's table,
    computed in the same float32 operations."""
    half = dim // 2
    step = math.log(10000) / (half - 1)
    freq = torch.exp(torch.arange(half, dtype=torch.int64).float() * -step)
    angle = torch.arange(rows, dtype=torch.int64).float().unsqueeze(1) * freq.unsqueeze(0)
    table = torch.cat([torch.sin(angle), torch.cos(angle)], dim=1).view(rows, -1)
    if dim % 2 == 1:
        table = torch.cat([table, torch.zeros(rows, 1)], dim=1)
    if padding_idx is not None:
        table[padding_idx, :] = 0
    return table


def _stack_tensors(cfg: ModelConfig, weights: Weights, prefix: str,
                   problems: list[str]) -> tuple[dict[str, Tensor | None], dict[str, str]]:
    """M2M100's stack tensors: the final LayerNorms, and each stack's position table
    (fairseq's sinusoids from row pad + 1, where position 0 of an unpadded sequence
    is looked up). A stored table (`embed_positions.weights`) must be the sinusoids."""
    state, names = bart.final_norms(weights, prefix)
    first = cfg.pad_id + 1
    table = fairseq_sinusoids(cfg.max_positions + first, cfg.d_model, cfg.pad_id)
    for side, ours in (("encoder", "src"), ("decoder", "tgt")):
        name = f"{prefix}{side}.embed_positions.weights"
        names[f"{ours}_positions"] = f"{name} (computed)"
        stored = weights.take(name)
        if stored is not None:
            rows = min(stored.shape[0], table.shape[0]) if stored.dim() == 2 else 0
            if (stored.dim() != 2 or stored.shape[1] != cfg.d_model or rows == 0
                    or not torch.allclose(stored[:rows].float(), table[:rows], atol=1e-4,
                                          rtol=0)):
                problems.append(f"{name} is not M2M100's sinusoid table; learned positions "
                                "are not supported")
        state[f"{ours}_positions"] = table[first:].clone()
    return state, names


M2M100 = bart.Layout(
    name="M2M100", model_type="m2m_100", architectures=SUPPORTED_ARCHITECTURES,
    hf_defaults=HF_DEFAULTS, flag_values={},
    structure={"pre_norm": True, "positions": "learned", "layernorm_embedding": False},
    stack_tensors=_stack_tensors, fallback_unk=bart.vocab_json_unk,
    tokenizer_files=(multilingual.SPM_FILE,), tokenizer_class="NllbTokenizer")


def convert_m2m100(path: str | Path,
                   tokenizer_json: Path | None = None) -> tuple[ModelConfig, dict[str, Tensor]]:
    """(ModelConfig, state dict for `Seq2SeqTransformer`) from an M2M100 or NLLB
    directory, or one `ConversionError` listing every problem found."""
    return bart.convert_bart(path, M2M100, tokenizer_json)


def load_m2m100(path: str | Path, dtype: torch.dtype = torch.float32) -> Seq2SeqTransformer:
    """A `Seq2SeqTransformer` in eval mode with the M2M100 / NLLB checkpoint's weights."""
    return bart.load_bart(path, dtype, M2M100)


def scheme_of(path: Path, problems: list[str]) -> multilingual.Scheme | None:
    """NLLB-200 or M2M100, by the folder's tokenizer: tokenizer_config's
    tokenizer_class, else the files (a tokenizer.json with NLLB's language tokens;
    sentencepiece.bpe.model + vocab.json)."""
    config = multilingual.tokenizer_config(path)
    cls = config.get("tokenizer_class")
    if isinstance(cls, str) and cls.startswith("Nllb"):
        return NLLB
    codes = config.get("language_codes", "m2m100")
    if isinstance(cls, str) and cls.startswith("M2M100"):
        if codes not in M2M100_CODES:
            problems.append(f"tokenizer_config.json: language_codes must be one of "
                            f"{sorted(M2M100_CODES)}, got {codes!r}")
            return None
        return _m2m100_scheme(codes)
    if cls is not None:
        problems.append(f"tokenizer_config.json: tokenizer_class {cls!r} is neither NLLB's "
                        "(NllbTokenizer) nor M2M100's (M2M100Tokenizer)")
        return None
    if multilingual.tokenizer_json_has(path, "eng_Latn"):
        return NLLB
    if all((path / f).is_file() for f in (multilingual.SPM_FILE, multilingual.VOCAB_FILE)):
        return _m2m100_scheme("m2m100")
    problems.append(f"no tokenizer: an NLLB directory needs {TOKENIZER_JSON} (or "
                    f"{multilingual.SPM_FILE} and tokenizer_config.json), an M2M100 one "
                    f"{multilingual.SPM_FILE} + {multilingual.VOCAB_FILE}")
    return None


def load_source(path: Path, task: TaskRequest | None = None) -> Source:
    """An M2M100 or NLLB-200 folder as the exporter takes it: a multilingual
    translation package (every pair of its languages)."""
    problems: list[str] = []
    scheme = scheme_of(path, problems)
    if scheme is None:
        raise SourceError(path, problems)
    legacy = multilingual.tokenizer_config(path).get("legacy_behaviour") is True
    place = "suffix" if scheme is NLLB and legacy else "prefix"
    return multilingual.load_source(path, task, M2M100, scheme, place)
