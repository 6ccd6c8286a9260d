"""Built corpus folders for tests, in the layout every `seq2serve data` builder writes."""

from __future__ import annotations

import json
from pathlib import Path


def write_corpus(folder: Path, splits: dict[str, list[tuple[str, str, str]]]) -> None:
    """`folder`/{train,valid,test}.{kind,src,tgt} from (kind, English, German) rows, and its
    corpus.json (en-de)."""
    folder.mkdir(parents=True)
    for split in ("train", "valid", "test"):
        rows = splits.get(split, [])
        for ext, col in (("kind", 0), ("src", 1), ("tgt", 2)):
            (folder / f"{split}.{ext}").write_text("".join(f"{r[col]}\n" for r in rows))
    (folder / "corpus.json").write_text(json.dumps({"task": "translate", "src_lang": "en",
                                                    "tgt_lang": "de"}))
