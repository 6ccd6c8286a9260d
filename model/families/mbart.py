"""Load a Hugging Face mBART-50 directory (MBartForConditionalGeneration with
MBart50Tokenizer: facebook/mbart-large-50-many-to-many-mmt, -one-to-many-mmt,
-many-to-one-mmt) into `Seq2SeqTransformer`, as a family of BART's layout (`MBART`,
a `bart.Layout`), and as a multilingual package's source (multilingual.py).

Exactness notes (checked against transformers 5.24 `modeling_mbart.py`):
- Pre-norm layers (eps 1e-5) and a final LayerNorm after each stack (`layer_norm`),
  *and* BART's `layernorm_embedding` after token embedding + position, in both stacks.
- Positions are learned, looked up at position + 2 (MBartLearnedPositionalEmbedding,
  BART's offset), folded at conversion as BART's.
- Token embeddings are scaled by sqrt(d_model) iff `scale_embedding` (MBartConfig's
  default False; the hub's mBART-50 say true); gelu; final_logits_bias (dropped
  when all zeros).
- The decoder starts from decoder_start_token_id (mBART-50's: </s>, 2; generate()
  takes bos_token_id where a config has none, as this module's default does); the
  target language is the forced first token, given per source by the server.
- Tokenizer: MBart50Tokenizer is a `tokenizers` backend in transformers 5: the
  folder's tokenizer.json (built from sentencepiece.bpe.model where absent) is what
  it runs; its language codes (en_XX, de_DE, ...) are tokens of it, the source's
  first ([lang] pieces </s>). mBART-25 / mbart-large-cc25 folders (MBartTokenizer:
  the source language after </s>, the target language as decoder start) are refused.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from seq2serve.model.config import ModelConfig
from seq2serve.model.families import bart, multilingual
from seq2serve.model.families.hf import Weights
from seq2serve.model.families.source import Source, SourceError
from seq2serve.model.families.tasks import TaskRequest
from seq2serve.model.transformer import Seq2SeqTransformer

# transformers' MBartConfig defaults: a config.json that omits a field means these.
# MBartConfig's decoder_start_token_id is None: generate() then starts from BOS.
HF_DEFAULTS: dict[str, Any] = {**bart.HF_DEFAULTS, "decoder_start_token_id": 0}

SUPPORTED_ARCHITECTURES = ("MBartForConditionalGeneration", "MBartModel")

# MBart50Tokenizer's FAIRSEQ_LANGUAGE_CODES (transformers 5.24).
MBART50_CODES = (
    "ar_AR", "cs_CZ", "de_DE", "en_XX", "es_XX", "et_EE", "fi_FI", "fr_XX", "gu_IN",
    "hi_IN", "it_IT", "ja_XX", "kk_KZ", "ko_KR", "lt_LT", "lv_LV", "my_MM", "ne_NP",
    "nl_XX", "ro_RO", "ru_RU", "si_LK", "tr_TR", "vi_VN", "zh_CN", "af_ZA", "az_AZ",
    "bn_IN", "fa_IR", "he_IL", "hr_HR", "id_ID", "ka_GE", "km_KH", "mk_MK", "ml_IN",
    "mn_MN", "mr_IN", "pl_PL", "ps_AF", "pt_XX", "sv_SE", "sw_KE", "ta_IN", "te_IN",
    "th_TH", "tl_XX", "uk_UA", "ur_PK", "xh_ZA", "gl_ES", "sl_SI")
# Only mBART-50 has these (mBART-25's codes are its first 25).
MBART50_ONLY = "gl_ES"


def _tag(code: str) -> str:
    """fairseq's region (de_DE, en_XX) is no part of the language; zh_CN is Chinese in
    simplified script."""
    return "zh-Hans" if code == "zh_CN" else code.split("_")[0]


MBART50 = multilingual.Scheme(
    name="mBART-50", kind="tokenizers", tokenizer_class="MBart50Tokenizer",
    codes=MBART50_CODES, tag_of=_tag, preferred={"tl": "tl_XX"})


def _stack_tensors(cfg: ModelConfig, weights: Weights, prefix: str,
                   problems: list[str]) -> tuple[dict[str, Tensor | None], dict[str, str]]:
    """mBART's stack tensors: BART's (learned positions, offset folded; the embedding
    LayerNorms) and the final LayerNorms."""
    state, names = bart.learned_positions(cfg, weights, prefix, problems)
    norms, norm_names = bart.final_norms(weights, prefix)
    return {**state, **norms}, {**names, **norm_names}


MBART = bart.Layout(
    name="mBART", model_type="mbart", architectures=SUPPORTED_ARCHITECTURES,
    hf_defaults=HF_DEFAULTS, flag_values={},
    structure={"pre_norm": True, "positions": "learned", "layernorm_embedding": True},
    stack_tensors=_stack_tensors, fallback_unk=bart.vocab_json_unk,
    tokenizer_files=(multilingual.SPM_FILE,), tokenizer_class="MBart50Tokenizer")


def load_mbart(path: str | Path, dtype: torch.dtype = torch.float32) -> Seq2SeqTransformer:
    """A `Seq2SeqTransformer` in eval mode with the mBART checkpoint's weights."""
    return bart.load_bart(path, dtype, MBART)


def load_source(path: Path, task: TaskRequest | None = None) -> Source:
    """An mBART-50 folder as the exporter takes it: a multilingual translation package
    (every pair of its languages). Other mBART tokenizers are refused."""
    cls = multilingual.tokenizer_config(path).get("tokenizer_class")
    if not ((isinstance(cls, str) and cls.startswith("MBart50"))
            or (cls is None and multilingual.tokenizer_json_has(path, MBART50_ONLY))):
        raise SourceError(path, [
            f"tokenizer: only mBART-50 folders are supported (tokenizer_class "
            f"MBart50Tokenizer, or a tokenizer.json with mBART-50's language tokens); got "
            f"{cls or 'neither'} (mBART-25 / mbart-large-cc25 put the target language "
            "first in the decoder, not as a forced token)"])
    return multilingual.load_source(path, task, MBART, MBART50)
