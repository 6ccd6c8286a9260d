"""Every key of transformers' GenerationConfig (5.24, `generation/configuration_utils.py`)
and what seq2serve does with it: applied exactly (families/generation.py turns it
into the package's GenerationDefaults, the engine applies it in generate()'s
processor order), refused by name when set to a value that changes generate()'s
tokens and is not applied, or inert (it never changes the tokens of an
encoder-decoder generate() call). Export refuses a folder that sets a refused key
unless it is named with `--ignore-generation-key`; the manifest's
generation.ignored_keys and ListModels then say which.

generate()'s processor order (`_get_logits_processor`): sequence_bias,
encoder_repetition_penalty, repetition_penalty, no_repeat_ngram_size,
encoder_no_repeat_ngram_size, bad_words_ids, min_length, min_new_tokens,
forced_bos_token_id, forced_eos_token_id, remove_invalid_values,
exponential_decay_length_penalty, suppress_tokens, begin_suppress_tokens; then
(do_sample only) temperature, top_h, top_k, top_p, min_p, typical_p,
epsilon_cutoff, eta_cutoff; then watermarking; renormalize_logits last.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

# Applied exactly: the key -> how (README's family section prints this table).
APPLIED: dict[str, str] = {
    "max_length": "limit: max_length - 1 new tokens (generate() counts the start token)",
    "max_new_tokens": "limit, before max_length",
    "min_length": "EOS banned while start + generated < min_length",
    "min_new_tokens": "EOS banned while generated < min_new_tokens, before min_length",
    "early_stopping": "True, False or \"never\", HF's beam stop rule and sticky flag",
    "num_beams": "beam size",
    "num_return_sequences": "n-best size (at most num_beams)",
    "length_penalty": "finished score / generated ** length_penalty",
    "no_repeat_ngram_size": "n-grams of the history (start token included) never repeat",
    "repetition_penalty": "beam search (on log-probs, as generate()); refused with "
                          "num_beams 1 (generate() penalises raw logits there)",
    "bad_words_ids": "banned; a one-token word equal to EOS dropped as generate() does",
    "forced_bos_token_id": "first new token",
    "forced_eos_token_id": "last new token a row's limit allows",
    "suppress_tokens": "never generated",
    "begin_suppress_tokens": "banned at the first new token (the second after a forced BOS)",
    "encoder_no_repeat_ngram_size": "no output repeats an n-gram of its own source (token "
                                    "ids with EOS; generate() reads a padded batch's "
                                    "padding too)",
    "exponential_decay_length_penalty": "EOS log-prob += |log-prob| * (factor ** k - 1), "
                                        "k steps past start; beam search only (refused "
                                        "with num_beams 1: generate() uses raw logits)",
    "renormalize_logits": "log-softmax after every processor",
    "do_sample": "sampling with num_beams 1 (same distribution; the engine's own seeded "
                 "draws, so not generate()'s tokens); refused with num_beams > 1",
    "temperature": "sampling", "top_k": "sampling (default 50)", "top_p": "sampling",
    "decoder_start_token_id": "must equal config.json's (the graphs' start); refused if not",
    "bos_token_id": "generate()'s start when decoder_start_token_id is unset: must equal "
                    "config.json's start; refused if not",
    "eos_token_id": "must be config.json's one EOS; refused if several or another",
}

# Never change the tokens of an encoder-decoder generate() call (outputs, caching,
# compilation, assisted decoding that verifies every token with the model itself).
INERT = frozenset({
    "output_attentions", "output_hidden_states", "output_scores", "output_logits",
    "return_dict_in_generate", "use_cache", "cache_implementation", "cache_config",
    "max_cache_len", "compile_config", "disable_compile", "continuous_batching_config",
    "prefill_chunk_size", "is_assistant", "num_assistant_tokens",
    "num_assistant_tokens_schedule", "assistant_confidence_threshold", "assistant_lookbehind",
    "target_lookbehind", "prompt_lookup_num_tokens", "max_matching_ngram_size",
    "assistant_early_exit", "transformers_version", "_from_model_config", "_commit_hash",
    "pad_token_id",  # pads finished rows only
    # diversity_penalty acts only with num_beam_groups > 1, refused below.
    "diversity_penalty",
    # transformers 5 reads it no more (Whisper's processors took its place).
    "forced_decoder_ids",
})


def _set(value: object) -> bool:
    return value is not None and value != [] and value != {} and value is not False


def _number(value: object, default: float) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) \
        else default


def _beams(config: Mapping[str, Any]) -> int:
    beams = config.get("num_beams")
    return beams if isinstance(beams, int) and not isinstance(beams, bool) else 1


def _decay_pair(value: object) -> bool:
    return isinstance(value, list) and len(value) == 2 \
        and isinstance(value[0], int) and not isinstance(value[0], bool) and value[0] >= 0 \
        and isinstance(value[1], (int, float)) and not isinstance(value[1], bool)


def _sampling(config: Mapping[str, Any]) -> bool:
    return config.get("do_sample") is True


# Refused when the rule says the value changes generate()'s tokens: key -> (rule, why).
Rule = Callable[[Any, Mapping[str, Any]], bool]
REFUSED: dict[str, tuple[Rule, str]] = {
    "max_time": (lambda v, c: v is not None, "a wall-clock cut: tokens depend on speed"),
    "stop_strings": (lambda v, c: _set(v), "stops on decoded text, not applied"),
    "sequence_bias": (lambda v, c: _set(v), "not applied"),
    "encoder_repetition_penalty": (lambda v, c: _number(v, 1.0) != 1.0, "not applied"),
    "encoder_no_repeat_ngram_size": (
        lambda v, c: v is not None and not (isinstance(v, int) and not isinstance(v, bool)),
        "must be an integer"),
    "remove_invalid_values": (lambda v, c: v is True, "not applied"),
    "guidance_scale": (lambda v, c: v is not None and _number(v, 1.0) != 1.0,
                       "classifier-free guidance needs a second model call"),
    "watermarking_config": (lambda v, c: v is not None, "not applied"),
    "num_beam_groups": (lambda v, c: _number(v, 1) > 1,
                        "group beam search (moved to the hub in transformers 5), not applied"),
    "constraints": (lambda v, c: _set(v), "constrained beam search, not applied"),
    "force_words_ids": (lambda v, c: _set(v), "constrained beam search, not applied"),
    "penalty_alpha": (lambda v, c: _number(v, 0) > 0, "contrastive search, not applied"),
    "dola_layers": (lambda v, c: v is not None, "DoLa decoding, not applied"),
    "low_memory": (lambda v, c: v is True, "generate() refuses it"),
    "token_healing": (lambda v, c: v is True, "not applied"),
    "use_mtp": (lambda v, c: v is True, "multi-token prediction, not applied"),
    "assistant_ensemble_weight": (lambda v, c: v is not None, "not applied"),
    "speculation_type": (lambda v, c: v is not None, "not applied"),
    "do_sample": (lambda v, c: v is True and _beams(c) > 1, "beam sampling, not applied"),
    "repetition_penalty": (lambda v, c: _number(v, 1.0) != 1.0 and _beams(c) == 1,
                           "with num_beams 1 generate() penalises raw logits; the engine "
                           "has log-probs"),
    "exponential_decay_length_penalty": (
        lambda v, c: v is not None and (_beams(c) == 1 or not _decay_pair(v)),
        "applied in beam search only (with num_beams 1 generate() raises raw logits, the "
        "engine has log-probs), as [start_index, decay_factor]"),
    "begin_suppress_tokens": (
        lambda v, c: v is not None and not (isinstance(v, list) and all(
            isinstance(t, int) and not isinstance(t, bool) for t in v)),
        "must be a list of token ids"),
    "min_p": (lambda v, c: v is not None and _sampling(c), "not applied"),
    "top_h": (lambda v, c: v is not None and _sampling(c), "not applied"),
    "typical_p": (lambda v, c: _number(v, 1.0) < 1.0 and _sampling(c), "not applied"),
    "epsilon_cutoff": (lambda v, c: 0.0 < _number(v, 0.0) < 1.0 and _sampling(c),
                       "not applied"),
    "eta_cutoff": (lambda v, c: 0.0 < _number(v, 0.0) < 1.0 and _sampling(c), "not applied"),
}

KNOWN = frozenset({*APPLIED, *INERT, *REFUSED})


def _ids(value: object) -> set[int] | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return {value}
    if isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool)
                                       for v in value):
        return set(value)
    return None


def refused_keys(config: Mapping[str, Any], start: int, eos: int) -> dict[str, str]:
    """The keys of `config` (generate()'s settings: generation_config.json, or
    config.json's keys of KNOWN names) that would make generate()'s tokens differ
    from the package's: key -> why. start, eos: the package's decoder start and
    EOS (config.json's, which the graphs and the engine use)."""
    found: dict[str, str] = {}
    for key, (rule, why) in REFUSED.items():
        if key in config and rule(config[key], config):
            found[key] = f"{key} {config[key]!r}: {why}"
    for key in sorted(set(config) - KNOWN):
        found[key] = f"{key}: a key transformers 5.24's GenerationConfig does not know"
    first = config.get("decoder_start_token_id")
    key = "decoder_start_token_id"
    if first is None:  # generate()'s fallback (`_prepare_special_tokens`)
        first, key = config.get("bos_token_id"), "bos_token_id"
    if first is not None and _ids(first) != {start}:
        found[key] = (f"{key} {first!r}: generate() starts the decoder from it, the package "
                      f"from config.json's {start}")
    eos_ids = _ids(config.get("eos_token_id"))
    if eos_ids != {eos}:
        found["eos_token_id"] = (f"eos_token_id {config.get('eos_token_id')!r}: the package "
                                 f"ends at config.json's {eos} only")
    return found
