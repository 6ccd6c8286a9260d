"""One module per Hugging Face architecture, behind one registry keyed by
config.json's `model_type` (the shape of CTranslate2's `@register_loader`
converters and optimum's per-architecture ONNX configs). Each family module gives
the exporter a `Source` (source.py) from a folder: config -> ModelConfig, the
weight mapping, the tokenizer files, generation defaults, special and language
tokens; what families share (reading config.json and weights) is hf.py.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from seq2serve.model.families import bart, m2m100, marian, mbart, pegasus, t5
from seq2serve.model.families.hf import CONFIG_FILE
from seq2serve.model.families.source import Source

# model_type -> the family's loader: (folder, the task asked by `export --task` or
# None: the folder's own) -> Source.
FAMILIES: dict[str, Callable[[Path, str | None], Source]] = {
    "marian": marian.load_source,
    "bart": bart.load_source,
    "pegasus": pegasus.load_source,
    "t5": t5.load_source,
    "mt5": t5.load_source,
    "mbart": mbart.load_source,
    "m2m_100": m2m100.load_source,  # M2M100 and NLLB-200
}


def model_type(path: Path) -> str | None:
    """config.json's model_type, or None (no file, not JSON, no such key)."""
    config = path / CONFIG_FILE
    if not config.is_file():
        return None
    try:
        data = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    value = data.get("model_type") if isinstance(data, dict) else None
    return value if isinstance(value, str) else None
