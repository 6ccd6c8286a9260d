"""The systems under test, each behind the same small interface.

`prepare(sources)` turns token-id lists into the system's own input form
(outside the timed region); `generate(prepared, beam, new_tokens)` decodes and
returns the best hypothesis of each source as token ids. With `new_tokens` set,
every system generates exactly that many tokens (minimum length = maximum
length, EOS never forced, none returned); with None, it decodes naturally up to
the model's own length limit (the real-sentence runs), and a hypothesis the
model ended keeps its EOS: it was generated, so it counts as a token, and two
systems' outputs agree only if both ended (or both were cut) at the same place.

`forced_bos` (a multilingual model's target language token, families.py) is every
source's first new token, one of the `new_tokens` and returned with them, on every
system: our engine's per-source forced_bos, generate()'s forced_bos_token_id,
CTranslate2's target_prefix. A Hugging Face folder's suppressed tokens (its
generation_config's suppress_tokens) are suppressed on every system too (our
package takes them from the folder at export).
"""

from __future__ import annotations

import gc
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from seq2serve.bench.engine.workload import converted_vocabulary

Tokens = list[list[int]]
# The records of CTranslate2 over a package's shortlist as its vocabulary map.
CTRANSLATE2_VMAP = "ctranslate2-vmap"


class System:
    name = ""  # the `system` field of a record
    precision = ""

    def load(self) -> None:
        """Load the model (not timed)."""

    def prepare(self, sources: Sequence[Sequence[int]]) -> Any:
        return [list(s) for s in sources]

    def generate(self, prepared: Any, beam: int, new_tokens: int | None) -> Tokens:
        raise NotImplementedError

    def close(self) -> None:
        """Drop the model so the next system has the memory and caches to itself."""
        gc.collect()

    @property
    def label(self) -> str:
        return f"{self.name} {self.precision}"


class Seq2Serve(System):
    """This project's engine on an exported model package."""

    def __init__(self, package: Path, threads: int, name: str = "seq2serve",
                 device: str = "cpu", forced_bos: int | None = None):
        self.package = Path(package)
        self.threads = threads
        self.name = name
        self.device = device
        self.forced_bos = forced_bos
        self.engine: Any = None

    def load(self) -> None:
        from seq2serve.server.assembly import default_limits
        from seq2serve.server.engine.engine import Engine
        from seq2serve.server.engine.runner import RunnerConfig

        self.engine = Engine(self.package, RunnerConfig(provider=self.device,
                                                        intra_op_threads=self.threads),
                             default_limits())
        self.precision = self.engine.package.manifest.precision

    def generate(self, prepared: Any, beam: int, new_tokens: int | None) -> Tokens:
        from seq2serve.server.core.options import DecodingOptions
        from seq2serve.server.engine.search import FinishReason

        if new_tokens is None:  # the package's generation defaults (length limit, penalty)
            options = DecodingOptions(beam_size=beam, num_hypotheses=1)
        else:
            options = DecodingOptions(beam_size=beam, num_hypotheses=1,
                                      max_length=new_tokens, min_length=new_tokens)
        eos = [self.engine.eos_id]
        forced = None if self.forced_bos is None else [self.forced_bos] * len(prepared)
        results = self.engine.generate(prepared, options, forced_bos=forced)
        return [list(best.token_ids) + (eos if best.finish_reason is FinishReason.EOS else [])
                for best in (result[0] for result in results)]

    def close(self) -> None:
        self.engine = None
        super().close()


class Transformers(System):
    """Hugging Face `generate()` on PyTorch, KV cache on."""

    name = "transformers"
    precision = "fp32"

    def __init__(self, marian_dir: Path, threads: int, device: str = "cpu",
                 forced_bos: int | None = None):
        self.marian_dir = Path(marian_dir)
        self.threads = threads
        self.device = device
        self.forced_bos = forced_bos
        self.model: Any = None

    def load(self) -> None:
        import torch
        import transformers

        torch.set_num_threads(self.threads)
        transformers.logging.disable_progress_bar()
        # The Marian shape's folder, or a family's (bench/engine/families.py).
        self.model = transformers.AutoModelForSeq2SeqLM.from_pretrained(self.marian_dir).eval()
        self.model.to(self.device)
        cfg = self.model.config
        self.pad_id = cfg.pad_token_id
        self.eos_id = cfg.eos_token_id
        # generate() fills what a GenerationConfig leaves unset from the model's own
        # (Marian's forced_eos_token_id would put EOS at the last position): replace it.
        # Marian never generates <pad> (its bad_words_ids); the other families may.
        banned = [[self.pad_id]] if cfg.model_type == "marian" else None
        self.model.generation_config = transformers.GenerationConfig(
            decoder_start_token_id=cfg.decoder_start_token_id, eos_token_id=self.eos_id,
            pad_token_id=self.pad_id, bad_words_ids=banned,
            suppress_tokens=suppressed_tokens(self.marian_dir) or None,
            forced_bos_token_id=self.forced_bos, use_cache=True)

    def prepare(self, sources: Sequence[Sequence[int]]) -> Any:
        import torch

        width = max(len(s) for s in sources)
        ids = torch.full((len(sources), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(sources), width), dtype=torch.long)
        for i, s in enumerate(sources):
            ids[i, : len(s)] = torch.tensor(s)
            mask[i, : len(s)] = 1
        return {"input_ids": ids.to(self.device), "attention_mask": mask.to(self.device)}

    def generate(self, prepared: Any, beam: int, new_tokens: int | None) -> Tokens:
        import torch

        lengths: dict[str, int] = {}
        if new_tokens is not None:
            lengths = {"max_new_tokens": new_tokens, "min_new_tokens": new_tokens}
        with torch.inference_mode():
            out = self.model.generate(**prepared, num_beams=beam, do_sample=False,
                                      num_return_sequences=1, **lengths)
        tokens = []
        for row in out[:, 1:].tolist():  # drop the decoder start token
            if self.eos_id in row:
                row = row[: row.index(self.eos_id)]
            tokens.append(row)
        return tokens

    def close(self) -> None:
        self.model = None
        super().close()


class CTranslate2(System):
    """CTranslate2's Translator on the converted model; int8 is its load-time
    quantization (compute_type) of the float32 conversion. With `vmap`, over the
    model directory's vocabulary map (`use_vmap`), named CTRANSLATE2_VMAP."""

    name = "ctranslate2"
    vmap = False

    def __init__(self, model_dir: Path, marian_dir: Path, precision: str, threads: int,
                 device: str = "cpu", forced_bos: int | None = None, vmap: bool = False):
        self.vmap = vmap
        if vmap:
            self.name = CTRANSLATE2_VMAP
        self.model_dir = Path(model_dir)
        self.precision = precision
        self.device = device
        self.threads = threads
        # The converted vocabulary, by id (the Marian shape's drops only <pad>, its last).
        self.pieces = converted_vocabulary(self.model_dir)
        self.ids = {piece: i for i, piece in enumerate(self.pieces)}
        self.prefix = None if forced_bos is None else [self.pieces[forced_bos]]
        self.suppress = [[self.pieces[i]] for i in suppressed_tokens(marian_dir)]
        self.translator: Any = None

    def load(self) -> None:
        from seq2serve.bench.engine.ctranslate2_model import load_translator

        self.translator = load_translator(self.model_dir, self.precision, self.threads,
                                          self.device)

    def prepare(self, sources: Sequence[Sequence[int]]) -> Any:
        return [[self.pieces[i] for i in s] for s in sources]

    def generate(self, prepared: Any, beam: int, new_tokens: int | None) -> Tokens:
        lengths: dict[str, int] = {}
        if new_tokens is not None:
            lengths = {"max_decoding_length": new_tokens, "min_decoding_length": new_tokens}
        results = self.translator.translate_batch(
            prepared, beam_size=beam, num_hypotheses=1, max_batch_size=0,
            target_prefix=None if self.prefix is None else [self.prefix] * len(prepared),
            suppress_sequences=self.suppress or None, use_vmap=self.vmap, **lengths)
        return [[self.ids[p] for p in r.hypotheses[0]] for r in results]

    def close(self) -> None:
        self.translator = None
        super().close()


def suppressed_tokens(folder: Path) -> list[int]:
    """A Hugging Face folder's generation_config suppress_tokens ([] without one)."""
    file = Path(folder) / "generation_config.json"
    if not file.is_file():
        return []
    return list(json.loads(file.read_text(encoding="utf-8")).get("suppress_tokens") or [])


def cpu_session(path: Path, threads: int, profile_prefix: str | None = None) -> Any:
    """An ONNX Runtime CPU session set up as the engine's runner sets up its own
    (one inter-op thread, no spinning, exact int8 kernels), for a graph the runner
    does not load; `profile_prefix` turns on ONNX Runtime's profiler."""
    import onnxruntime as ort

    from seq2serve.model.package.session import EXACT_INT8_CONFIG
    from seq2serve.server.engine.runner import CPU

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    for key, value in EXACT_INT8_CONFIG.items():
        options.add_session_config_entry(key, value)
    if profile_prefix is not None:
        options.enable_profiling = True
        options.profile_file_prefix = profile_prefix
    return ort.InferenceSession(str(path), options, providers=[CPU])


def engine_defaults(manifest: Any) -> Any:
    """The decoding options the engine applies to a package's requests by default
    (its generation settings under the server's default limits): what a peer system
    is given to decode the same way."""
    from seq2serve.server.assembly import default_limits
    from seq2serve.server.core.options import DecodingOptions

    limits = default_limits()
    return DecodingOptions().resolve(manifest.generation.as_dict(), limits)


class CheckpointCTranslate2(System):
    """CTranslate2 on a seq2serve checkpoint's conversion (bench/engine/ctranslate2_model.py),
    given the same token ids as the engine: a piece's CTranslate2 index is its
    SentencePiece id, the source EOS is CTranslate2's to add (`add_source_eos`),
    and the target EOS comes back (`return_end_token`) as the engine's does.
    The engine's defaults for the package apply: its suppressed tokens, length
    penalty, repetition penalty, n-gram blocking and minimum length, and its
    output length limit (`max_length`, `max_length_ratio`). CTranslate2 takes one
    limit per call, so a batch decodes up to its longest source's limit and each
    hypothesis is then cut to its own source's: exactly the engine's limit for
    greedy decoding (a row's tokens do not depend on the limit), close to it for
    beam search. Only a source the model does not end costs CTranslate2 those
    extra steps (batches are sorted by length, so their limits are close).

    With `vmap`, CTranslate2 decodes over its vocabulary map (`use_vmap`; the model
    directory holds one, ctranslate2_model.convert_with_vmap) and its records are
    named `ctranslate2-vmap`."""

    name = "ctranslate2"

    def __init__(self, model_dir: Path, package: Path, precision: str, threads: int,
                 vmap: bool = False):
        from seq2serve.bench.engine.ctranslate2_model import (
            TOKENIZER_FILE,
            VMAP_FILE,
            spm_pieces,
        )
        from seq2serve.model.package.manifest import load_package

        self.model_dir = Path(model_dir)
        self.precision = precision
        self.threads = threads
        self.vmap = vmap
        if vmap:
            if not (self.model_dir / VMAP_FILE).is_file():
                raise ValueError(f"{self.model_dir}: no vocabulary map ({VMAP_FILE})")
            self.name = CTRANSLATE2_VMAP
        self.pieces = spm_pieces(self.model_dir / TOKENIZER_FILE)
        self.ids = {piece: i for i, piece in enumerate(self.pieces)}
        manifest = load_package(package).manifest
        self.eos_id = manifest.special_tokens.eos
        self.suppress = [[self.pieces[i]] for i in manifest.never_generated()]
        self.options = engine_defaults(manifest)
        self.translator: Any = None

    def load(self) -> None:
        from seq2serve.bench.engine.ctranslate2_model import load_translator

        self.translator = load_translator(self.model_dir, self.precision, self.threads)

    def prepare(self, sources: Sequence[Sequence[int]]) -> Any:
        # The engine's sources end with EOS, which CTranslate2 adds itself.
        pieces = [[self.pieces[i] for i in (s[:-1] if s and s[-1] == self.eos_id else s)]
                  for s in sources]
        limits = [self.options.max_new_tokens(len(s)) for s in sources]
        return pieces, limits

    def generate(self, prepared: Any, beam: int, new_tokens: int | None) -> Tokens:
        pieces, limits = prepared
        o = self.options
        results = self.translator.translate_batch(
            pieces, beam_size=beam, num_hypotheses=1, max_batch_size=0,
            max_decoding_length=new_tokens or max(limits),
            min_decoding_length=new_tokens or o.min_length,
            length_penalty=o.length_penalty, repetition_penalty=o.repetition_penalty,
            no_repeat_ngram_size=o.no_repeat_ngram_size,
            suppress_sequences=self.suppress or None, return_end_token=new_tokens is None,
            use_vmap=self.vmap)
        cut = limits if new_tokens is None else [new_tokens] * len(limits)
        return [[self.ids[p] for p in r.hypotheses[0][:limit]]
                for r, limit in zip(results, cut, strict=True)]

    def close(self) -> None:
        self.translator = None
        super().close()
