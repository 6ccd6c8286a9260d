"""A Hugging Face folder's generation settings as the package's GenerationDefaults:
what generate() does with the folder's own generation_config, said in the engine's
terms. One function, `generation_from_hf`, for every family.

generate()'s lengths count the decoder start token, the engine's do not (a
request's max_length is generate()'s max_new_tokens). Checked against
transformers 5.24 (`generation/utils.py` `_prepare_generated_length`,
`configuration_utils.py` `_get_default_generation_params`):
- max_new_tokens, when set, is the limit; else max_length - 1 new tokens;
- neither set (generation_config.json and config.json both silent): generate()
  takes its default max_length 20 *plus* the start token, i.e. 20 new tokens,
  capped so that start + new <= max_position_embeddings;
- min_new_tokens, when set, is the minimum; else max(0, min_length - 1) (EOS
  is banned while start + generated < min_length);
- generate() has no length ratio: max_length_ratio is 0;
- num_beams 1, length_penalty 1.0, early_stopping False, no_repeat_ngram_size 0,
  repetition_penalty 1.0 when unset (`_get_default_generation_params`);
- bad_words_ids: one-token words equal to EOS are dropped (NoBadWordsLogitsProcessor
  does), the rest kept; forced_bos_token_id / forced_eos_token_id,
  begin_suppress_tokens, encoder_no_repeat_ngram_size,
  exponential_decay_length_penalty and renormalize_logits as
  they are (the engine applies them in generate()'s order).
Every other GenerationConfig key is inert or refused by name (generation_keys.py).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from seq2serve.model.families.generation_keys import KNOWN
from seq2serve.model.package.manifest import GenerationDefaults

# generate()'s default max_length when nothing sets one; counted in new tokens
# (`_prepare_generated_length` adds the start token to it).
HF_DEFAULT_NEW_TOKENS = 20


def _int(config: Mapping[str, Any], key: str) -> int | None:
    value = config.get(key)
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value


def _eos_ids(config: Mapping[str, Any]) -> set[int]:
    eos = config.get("eos_token_id")
    if isinstance(eos, int) and not isinstance(eos, bool):
        return {eos}
    if isinstance(eos, list):
        return {e for e in eos if isinstance(e, int)}
    return set()


def generation_from_hf(config: Mapping[str, Any], max_positions: int) -> GenerationDefaults:
    """The package's defaults for a folder whose generate() settings are `config`:
    generation_config.json's keys, or (a folder without one) config.json's, as
    `GenerationConfig.from_model_config` reads them. max_positions: the decoder's
    positions, which no hypothesis outgrows (the engine's limit)."""
    max_new_tokens = _int(config, "max_new_tokens")
    max_length = _int(config, "max_length")
    if max_new_tokens is not None:
        max_new = max_new_tokens
    elif max_length is not None:
        max_new = max_length - 1
    else:
        max_new = min(HF_DEFAULT_NEW_TOKENS, max_positions - 1)
    max_new = max(1, min(max_new, max_positions))

    min_new_tokens = _int(config, "min_new_tokens")
    min_length = _int(config, "min_length")
    if min_new_tokens is not None:
        min_new = min_new_tokens
    else:
        min_new = max(0, (min_length or 0) - 1)
    min_new = min(max(0, min_new), max_new)

    early = config.get("early_stopping")
    early_stopping: bool | str = early if early in (True, False, "never") else False
    eos = _eos_ids(config)
    words = config.get("bad_words_ids") or ()
    bad_words = tuple(
        tuple(word) for word in (words if isinstance(words, list) else ())
        if isinstance(word, list) and word
        and all(isinstance(t, int) and not isinstance(t, bool) for t in word)
        and not (len(word) == 1 and word[0] in eos))
    beams = _int(config, "num_beams") or 1
    sampling = config.get("do_sample") is True
    decay = _decay(config.get("exponential_decay_length_penalty"))
    return GenerationDefaults(
        beam_size=beams,
        num_hypotheses=min(_int(config, "num_return_sequences") or 1, beams),
        length_penalty=1.0 if config.get("length_penalty") is None
        else float(config["length_penalty"]),
        early_stopping=early_stopping,
        max_length=max_new,
        max_length_ratio=0.0,
        min_length=min_new,
        no_repeat_ngram_size=_int(config, "no_repeat_ngram_size") or 0,
        repetition_penalty=float(config.get("repetition_penalty") or 1.0),
        sampling_temperature=float(config.get("temperature") or 1.0) if sampling else None,
        sampling_top_k=(50 if _int(config, "top_k") is None else _int(config, "top_k"))
        if sampling else None,
        sampling_top_p=float(config.get("top_p") or 1.0) if sampling else None,
        forced_bos_token_id=_int(config, "forced_bos_token_id"),
        forced_eos_token_id=_int(config, "forced_eos_token_id"),
        bad_words_ids=bad_words or None,
        begin_suppress_tokens=_token_list(config.get("begin_suppress_tokens")),
        encoder_no_repeat_ngram_size=_int(config, "encoder_no_repeat_ngram_size") or None,
        exponential_decay_start=decay[0] if decay else None,
        exponential_decay_factor=decay[1] if decay else None,
        renormalize_logits=True if config.get("renormalize_logits") is True else None,
    )


def _token_list(value: object) -> tuple[int, ...] | None:
    """A list of token ids as a sorted tuple; None when empty or not one."""
    if not isinstance(value, list):
        return None
    ids = {t for t in value if isinstance(t, int) and not isinstance(t, bool)}
    return tuple(sorted(ids)) or None


def _decay(value: object) -> tuple[int, float] | None:
    """exponential_decay_length_penalty's (start_index, decay_factor), or None."""
    if isinstance(value, (list, tuple)) and len(value) == 2:
        start, factor = value
        if isinstance(start, int) and not isinstance(start, bool) \
                and isinstance(factor, (int, float)) and not isinstance(factor, bool):
            return start, float(factor)
    return None


def suppressed_by_hf(config: Mapping[str, Any]) -> tuple[int, ...]:
    """The tokens generate() never generates whatever else happens: its
    `suppress_tokens` (SuppressTokensLogitsProcessor, last in its order, as the
    package's special_tokens.suppress is). Padding and the start token are not
    among them unless configured (OPUS-MT bans padding with bad_words_ids)."""
    tokens = config.get("suppress_tokens") or ()
    return tuple(sorted({int(t) for t in tokens if isinstance(t, int)}))


def generate_settings(path: Path, problems: list[str]) -> dict[str, Any]:
    """What generate() decodes with: generation_config.json, or config.json's
    generation keys in a folder without one (GenerationConfig.from_model_config
    takes the keys GenerationConfig knows)."""
    file = path / "generation_config.json"
    if not file.is_file():
        file = path / "config.json"  # its problems are the loader's to report
        try:
            data = json.loads(file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        return {k: v for k, v in data.items() if k in KNOWN} if isinstance(data, dict) else {}
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        problems.append(f"generation_config.json: not valid JSON ({e})")
        return {}
    if not isinstance(data, dict):
        problems.append("generation_config.json: not a JSON object")
        return {}
    return data


# The GenerationDefaults fields each refused key would otherwise set: an ignored
# key is not applied at all (not applied approximately).
_FIELDS_OF: dict[str, tuple[str, ...]] = {
    "repetition_penalty": ("repetition_penalty",),
    "do_sample": ("sampling_temperature", "sampling_top_k", "sampling_top_p"),
    "exponential_decay_length_penalty": ("exponential_decay_start",
                                         "exponential_decay_factor"),
}


def without_keys(defaults: GenerationDefaults, keys: tuple[str, ...]) -> GenerationDefaults:
    """`defaults` with the generation keys `keys` ignored: none of them applied, and
    the manifest's ignored_keys naming them (None when there are none)."""
    cleared = {name: None for key in keys for name in _FIELDS_OF.get(key, ())}
    return dataclasses.replace(defaults, **cleared,
                               ignored_keys=tuple(sorted(keys)) or None)
