"""The exporter's `Source` for a multilingual family of BART's layout (M2M100 and
NLLB-200: m2m100.py; mBART-50: mbart.py): one package that translates between every
pair of the model's languages.

A family says which tokenizer scheme a folder uses (`Scheme`):
- "tokenizers": the folder's tokenizer.json (built by transformers' tokenizer class
  from sentencepiece.bpe.model where absent, at export only), which NLLB's and
  mBART-50's transformers tokenizers run themselves; the language tokens are entries
  of its vocabulary or added tokens;
- "sentencepiece": sentencepiece.bpe.model + vocab.json (M2M100Tokenizer, a Python
  tokenizer without a tokenizer.json): the package's vocab.json is the folder's plus
  the language tokens `__xx__`, which M2M100Tokenizer numbers after it.

The language codes are the family's (the list its transformers tokenizer class
holds), kept where the folder's vocabulary has their tokens; the request codes come
from languages.py.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from seq2serve.model.families import bart
from seq2serve.model.families.generation import (
    generate_settings,
    generation_from_hf,
    suppressed_by_hf,
)
from seq2serve.model.families.hf import (
    TOKENIZER_JSON,
    ConversionError,
    check_tokenizer_ids,
)
from seq2serve.model.families.hf import tokenizer_json as hf_tokenizer_json
from seq2serve.model.families.languages import family_languages
from seq2serve.model.families.source import Source, SourceError, folder_name
from seq2serve.model.families.tasks import TRANSLATE, TaskRequest
from seq2serve.model.package.languages import MULTILINGUAL, Languages

SPM_FILE = "sentencepiece.bpe.model"
VOCAB_FILE = "vocab.json"
TOKENIZER_CONFIG = "tokenizer_config.json"


@dataclass(frozen=True)
class Scheme:
    """A family's tokenizer and languages: `name` (in messages), `kind` ("tokenizers"
    or "sentencepiece"), `tokenizer_class` (transformers', building tokenizer.json
    where absent), `codes` (the family's language codes, in its tokenizer class's
    order), `token_of` (a code's token text), `tag_of` (a code as a BCP 47 tag),
    `preferred` (request code -> model code where the rule is ambiguous)."""

    name: str
    kind: str
    tokenizer_class: str
    codes: tuple[str, ...]
    tag_of: Callable[[str], str]
    token_of: Callable[[str], str] = str
    preferred: Mapping[str, str] = field(default_factory=dict)


def tokenizer_config(path: Path) -> dict[str, Any]:
    """The folder's tokenizer_config.json, or {} (absent or unreadable)."""
    try:
        data = json.loads((path / TOKENIZER_CONFIG).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def tokenizer_json_tokens(file: Path) -> dict[str, int]:
    """Every token text of a tokenizer.json -> its id (vocabulary and added tokens)."""
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
        vocab = data["model"]["vocab"]
        tokens = (dict(vocab) if isinstance(vocab, dict)
                  else {piece[0]: i for i, piece in enumerate(vocab)})
        tokens.update({t["content"]: t["id"] for t in data.get("added_tokens", [])})
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        return {}
    return tokens


def _language_tokens(scheme: Scheme, tokens: Mapping[str, int], vocab_size: int,
                     problems: list[str]) -> dict[str, int]:
    """model code -> token id for the family's codes the vocabulary has."""
    found = {code: tokens[scheme.token_of(code)] for code in scheme.codes
             if scheme.token_of(code) in tokens}
    if not found:
        problems.append(f"the tokenizer has none of {scheme.name}'s language tokens "
                        f"({', '.join(scheme.token_of(c) for c in scheme.codes[:3])}, ...)")
    for code, i in found.items():
        if not 0 <= i < vocab_size:
            problems.append(f"language token {scheme.token_of(code)} has id {i}, outside the "
                            f"model's vocabulary of {vocab_size}")
    return found


def load_source(path: Path, task: TaskRequest | None, layout: bart.Layout, scheme: Scheme,
                source_token: str = "prefix") -> Source:
    """A multilingual folder as the exporter takes it: the model (`layout`), its
    tokenizer (`scheme`), its languages, and generation defaults (the folder's
    generation_config, as every family's). It translates every pair of its
    languages: `task` may only say "translate", a request names the pair."""
    problems: list[str] = []
    if task is not None and (task.kind != TRANSLATE or task.pair is not None):
        problems.append(f"--task {task}: a {scheme.name} model translates every pair of its "
                        "languages, each request naming its own (--task translate)")
    tokenizer_json: Path | None = None
    vocab: dict[str, int] = {}
    if scheme.kind == "tokenizers":
        tokenizer_json = hf_tokenizer_json(path, problems, (SPM_FILE,), scheme.tokenizer_class,
                                           scheme.name)
        tokens = tokenizer_json_tokens(tokenizer_json) if tokenizer_json else {}
        if tokenizer_json is not None and not tokens:
            problems.append(f"{TOKENIZER_JSON}: no vocabulary could be read from it")
    else:
        missing = [name for name in (SPM_FILE, VOCAB_FILE) if not (path / name).is_file()]
        if missing:
            problems.append(f"{' and '.join(missing)}: missing (a {scheme.name} directory "
                            f"needs {SPM_FILE} + {VOCAB_FILE})")
        else:
            try:
                vocab = json.loads((path / VOCAB_FILE).read_text(encoding="utf-8"))
                if not isinstance(vocab, dict):
                    raise ValueError("not a JSON object")
            except (OSError, ValueError) as e:
                problems.append(f"{VOCAB_FILE}: not a piece -> id mapping ({e})")
                vocab = {}
        # M2M100Tokenizer numbers its language tokens after vocab.json's entries.
        tokens = {**vocab, **{scheme.token_of(code): len(vocab) + i
                              for i, code in enumerate(scheme.codes)}}
    model = None
    try:
        model = bart.load_bart(path, layout=layout, tokenizer_json=tokenizer_json)
    except ConversionError as e:
        problems.extend(e.problems)
    languages: Languages | None = None
    if model is not None and tokens:
        if tokenizer_json is not None:
            check_tokenizer_ids(tokenizer_json, model.cfg.tgt_vocab_size, scheme.name, problems)
        own = _language_tokens(scheme, tokens, model.cfg.tgt_vocab_size, problems)
        if own:
            try:
                languages = family_languages(own, scheme.tag_of, scheme.preferred,
                                             source_token)
            except ImportError as e:  # langcodes, of the export extra
                problems.append(str(e))
    settings = generate_settings(path, problems)
    if problems or model is None or languages is None:
        raise SourceError(path, problems)
    return Source(
        kind=layout.model_type,
        model=model,
        name=folder_name(path),
        task=TRANSLATE,
        source_language=MULTILINGUAL,
        target_language=MULTILINGUAL,
        source_spm=None if tokenizer_json else path / SPM_FILE,
        target_spm=None if tokenizer_json else path / SPM_FILE,
        vocab={} if tokenizer_json else tokens,
        tokenizer_json=tokenizer_json,
        generation=generation_from_hf(settings, model.cfg.max_positions),
        suppress=suppressed_by_hf(settings),
        origin={"format": f"huggingface-{layout.model_type}", "tokenizer": scheme.name},
        languages=languages,
    )


def tokenizer_json_has(path: Path, token: str) -> bool:
    """Whether the folder's tokenizer.json has `token` (a family's language token)."""
    file = path / TOKENIZER_JSON
    return file.is_file() and token in tokenizer_json_tokens(file)
