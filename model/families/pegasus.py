"""Load a Hugging Face Pegasus directory (PegasusForConditionalGeneration, e.g.
google/pegasus-xsum, pegasus-cnn_dailymail) into `Seq2SeqTransformer`, as a
family of BART's layout: bart.py reads the config, maps the weights, finds the
task and generation defaults and builds the exporter's source (`bart.convert_bart`,
`bart.load_bart`, `bart.load_source` with `layout=PEGASUS`); this module says what
Pegasus fixes (`PEGASUS`, a `bart.Layout`).

Exactness notes (checked against transformers 5.24 `modeling_pegasus.py`):
- Pre-norm layers (LayerNorm before each sub-layer, eps 1e-5) and a final
  LayerNorm after each stack (`model.encoder.layer_norm` /
  `model.decoder.layer_norm`: our `encoder_norm` / `decoder_norm`); no
  `layernorm_embedding`. Layer tensors carry BART's names.
- Positions are Marian's sinusoids (sines in the first half of the vector) from
  position 0 in both stacks, no offset: our model recomputes the table, so a
  stored `embed_positions` is only checked to be it.
- Token embeddings are scaled by sqrt(d_model) iff `scale_embedding` (the class
  default is False; the hub's checkpoints say true); one matrix shared by encoder,
  decoder and output under transformers 5's tie rules (hf.py).
- Logits get `final_logits_bias` (dropped when all zeros); activation from
  `activation_function` (the hub's: relu; the class default: gelu).
- The decoder starts from pad (decoder_start_token_id 0); eos </s> 1; no BOS (the
  decoder start stands in, as Marian's). The tokenizer is SentencePiece with
  Pegasus's offset of 103: ids 0..104 are <pad>, </s>, <mask_1>, <mask_2> and
  <unk_2>..<unk_102>, the pieces follow, so <unk> (SentencePiece's 2) is 105;
  the unk id is read from the tokenizer.json.
- Tokenizer: transformers 5's PegasusTokenizer is a `tokenizers` backend: a
  folder's tokenizer.json is what it runs, and what the package carries; a folder
  with only spiece.model gets one built by PegasusTokenizer at export (never in
  the server).
- Old (transformers 3) keys that conflict with this structure are refused by
  name: normalize_before, add_final_layer_norm and static_position_embeddings
  other than true, normalize_embedding and add_bias_logits other than false.
- Generation: as every family's (generation.py): what generate() does under the
  folder's generation_config.json (or config.json's generation keys), the forced
  EOS of PegasusConfig (default 1) included; task_specific_params' `summarization*`
  (pegasus-xsum's `summarization_xsum`) says the task.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import Tensor

from seq2serve.model.config import ModelConfig
from seq2serve.model.families import bart
from seq2serve.model.families.hf import Weights, check_sinusoid_positions

# transformers' PegasusConfig defaults: a config.json that omits a field means these.
# PegasusConfig has no bos_token_id: the decoder start stands in.
HF_DEFAULTS: dict[str, Any] = {
    "vocab_size": 50265,
    "max_position_embeddings": 1024,
    "encoder_layers": 12,
    "encoder_ffn_dim": 4096,
    "encoder_attention_heads": 16,
    "decoder_layers": 12,
    "decoder_ffn_dim": 4096,
    "decoder_attention_heads": 16,
    "activation_function": "gelu",
    "d_model": 1024,
    "dropout": 0.1,
    "attention_dropout": 0.0,
    "activation_dropout": 0.0,
    "scale_embedding": False,
    "pad_token_id": 0,
    "eos_token_id": 1,
    "decoder_start_token_id": 0,
    "tie_word_embeddings": True,
}

# Keys of older (transformers 3) Pegasus configs (the hub's still carry them:
# pegasus-xsum says normalize_before, add_final_layer_norm and
# static_position_embeddings true). transformers 5's Pegasus ignores them and always
# computes this structure: another value means another model.
PEGASUS_FLAG_VALUES = {
    "normalize_before": True,
    "add_final_layer_norm": True,
    "static_position_embeddings": True,
    "normalize_embedding": False,
    "add_bias_logits": False,
}

SUPPORTED_ARCHITECTURES = ("PegasusForConditionalGeneration", "PegasusModel")
OFFSET = 103  # PegasusTokenizer's: the SentencePiece piece i >= 2 is id i + 103


def _stack_tensors(cfg: ModelConfig, weights: Weights, prefix: str,
                   problems: list[str]) -> tuple[dict[str, Tensor | None], dict[str, str]]:
    """Pegasus's stack tensors: the final LayerNorms; the stored position tables
    are checked to be the sinusoids our model recomputes."""
    check_sinusoid_positions(cfg, weights, prefix, "Pegasus", problems)
    return bart.final_norms(weights, prefix)


def _fallback_unk(path: Path | None) -> tuple[int, str]:
    return 2 + OFFSET, "Pegasus convention (SentencePiece's <unk> 2 + offset 103)"


PEGASUS = bart.Layout(
    name="Pegasus", model_type="pegasus", architectures=SUPPORTED_ARCHITECTURES,
    hf_defaults=HF_DEFAULTS, flag_values=PEGASUS_FLAG_VALUES,
    structure={"pre_norm": True, "positions": "sinusoid", "position_layout": "split",
               "layernorm_embedding": False},
    stack_tensors=_stack_tensors, fallback_unk=_fallback_unk,
    tokenizer_files=("spiece.model",), tokenizer_class="PegasusTokenizer")
