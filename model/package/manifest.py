"""The model package: what `export` writes and what `serve` loads.

One directory per model: `manifest.json`, `encoder.onnx`, `decoder.onnx`,
`reorder.onnx`, `move.onnx`, `select.onnx` and the tokenizer files. The
manifest records the sha256 of every other file; `load_package` refuses a
package whose files do not match, naming the file, and a manifest whose values
have the wrong type, naming the key. This module needs neither torch nor
onnxruntime.

The graphs (format 7):
- encoder: the sources to the memory and each decoder layer's cross K/V;
- decoder: one step for N rows, each at its own position. The self-attention
  cache is one (N, H, T, Dh) tensor per layer and per K/V; the step writes each
  row's new slot and attends to the slots up to the row's position only. Row r
  continues cache row r. Format 7 writes the slot with ONNX Runtime's fused
  GroupQueryAttention (in place when past and present are bound to one buffer,
  on CPU and CUDA) and runs the other attentions as MultiHeadAttention; format 6
  (still read and served) wrote it with a ScatterND and masked the slots after
  the position in a plain traced attention. Both have the same inputs and
  outputs;
- reorder: the cache rows a new set of rows continues (a Gather per tensor);
- move: the rows that moved rewritten from the rows they continue, in place
  (a Gather of those rows, then a ScatterND into the cache);
- select: each row's best log-probs (TopK), for beam search.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from seq2serve.model.config import OMITTED_AT_DEFAULT, ModelConfig
from seq2serve.model.package.languages import MULTILINGUAL, Languages

FORMAT_VERSION = 8
# Format 6 packages have the same graph inputs and outputs with plain attention
# (export/fused_attention.py says what changed); format 8 is format 6 or 7 (its
# manifest says which attention) with a vocabulary shortlist (model/package/shortlist.py):
# a lexical table and a second decoder graph. The runner serves all three.
READABLE_FORMATS = (6, 7, FORMAT_VERSION)
# How the exporter builds the attention: "fused" writes format 7, "plain" format 6.
ATTENTIONS = ("fused", "plain")
# Plain until tests/unit/test_export.py's format 6 assertions (the ScatterND that
# writes the cache, export_graphs' signature) are made format-aware.
DEFAULT_ATTENTION = "plain"

# The IR version of every graph a package holds or a server builds: onnx's helper
# writes its own newest (14 with onnx 1.23), which onnxruntime 1.31 (the newest
# onnxruntime-gpu, pinned) refuses ("max supported IR version: 13"); opset 17 needs 8.
GRAPH_IR_VERSION = 8


def format_version(attention: str, shortlist: bool = False) -> int:
    """The package format of graphs exported with `attention` (one of ATTENTIONS),
    with or without a vocabulary shortlist."""
    if shortlist:
        return FORMAT_VERSION
    return 7 if attention == "fused" else 6
MANIFEST = "manifest.json"
ENCODER_FILE = "encoder.onnx"
DECODER_FILE = "decoder.onnx"
REORDER_FILE = "reorder.onnx"
MOVE_FILE = "move.onnx"
SELECT_FILE = "select.onnx"
GRAPH_FILES = (ENCODER_FILE, DECODER_FILE, REORDER_FILE, MOVE_FILE, SELECT_FILE)
# Format 8: the decoder over each source's candidates, and their table.
SHORTLIST_DECODER_FILE = "decoder_shortlist.onnx"
SHORTLIST_FILE = "shortlist.npz"
TASKS = ("translate", "summarize")
PRECISIONS = ("fp32", "fp16", "int8")

# -- graph signatures ----------------------------------------------------------------


@dataclass(frozen=True)
class TensorSpec:
    """One graph input or output. dtype: a numpy dtype name ("float32", "int64").
    shape: per axis a symbol or a fixed size. Symbols: B sources, N rows (B x
    beams), M rows before a reorder or the rows moved, S source length, T cache
    slots (> every row's position), K best per row; and the model's sizes, fixed
    in the graph: H heads, Dh head size, D model width, V target vocabulary."""

    name: str
    dtype: str
    shape: tuple[str | int, ...]


@dataclass(frozen=True)
class GraphSpec:
    file: str
    opset: int
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]


@dataclass(frozen=True)
class GraphSpecs:
    """The package's five graphs."""

    encoder: GraphSpec
    decoder: GraphSpec
    reorder: GraphSpec
    move: GraphSpec
    select: GraphSpec

    def by_name(self) -> dict[str, GraphSpec]:
        """{"encoder": ..., "decoder": ..., ...}, in GRAPH_FILES order."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


# The cache and cross K/V dtype is "float" until the exporter knows it (float32
# or float16): `standard_graphs(dtypes=...)` fills in what the graphs hold.
FLOAT = "float"


def _spec(name: str, dtype: str, *shape: str | int) -> TensorSpec:
    return TensorSpec(name, dtype, shape)


def per_layer(name: str, dtype: str, shape: tuple[str, ...], layers: int) -> list[TensorSpec]:
    """`name.0` ... `name.{layers-1}`: decoder layer i's tensor is `name.i`."""
    return [TensorSpec(f"{name}.{i}", dtype, shape) for i in range(layers)]


_CACHE = ("N", "H", "T", "Dh")
_CROSS = ("B", "H", "S", "Dh")
ENCODER_INPUTS = [_spec("src_ids", "int64", "B", "S"), _spec("src_mask", "int64", "B", "S")]
SELECT_INPUTS = [_spec("log_probs", "float32", "N", "V"), _spec("k", "int64", 1)]
SELECT_OUTPUTS = [_spec("top_log_probs", "float32", "N", "K"),
                  _spec("top_ids", "int64", "N", "K")]


def encoder_outputs(layers: int) -> list[TensorSpec]:
    return [_spec("memory", FLOAT, "B", "S", "D"),
            *per_layer("cross_k", FLOAT, _CROSS, layers),
            *per_layer("cross_v", FLOAT, _CROSS, layers)]


def decoder_inputs(layers: int) -> list[TensorSpec]:
    """In the order of Seq2SeqTransformer.decode_step's arguments, lists flattened."""
    return [_spec("tokens", "int64", "N"),
            _spec("positions", "int64", "N"),
            *per_layer("self_k", FLOAT, _CACHE, layers),
            *per_layer("self_v", FLOAT, _CACHE, layers),
            *per_layer("cross_k", FLOAT, _CROSS, layers),
            *per_layer("cross_v", FLOAT, _CROSS, layers),
            _spec("src_mask", "int64", "B", "S")]


def decoder_outputs(layers: int) -> list[TensorSpec]:
    return [_spec("log_probs", "float32", "N", "V"),
            *per_layer("new_self_k", FLOAT, _CACHE, layers),
            *per_layer("new_self_v", FLOAT, _CACHE, layers),
            _spec("alignment", "int64", "N")]


def reorder_inputs(layers: int) -> list[TensorSpec]:
    """In the order of Seq2SeqTransformer.reorder_cache's arguments; M rows before."""
    rows_before = ("M", *_CACHE[1:])
    return [*per_layer("self_k", FLOAT, rows_before, layers),
            *per_layer("self_v", FLOAT, rows_before, layers),
            _spec("beam_origin", "int64", "N")]


def reorder_outputs(layers: int) -> list[TensorSpec]:
    return [*per_layer("reordered_self_k", FLOAT, _CACHE, layers),
            *per_layer("reordered_self_v", FLOAT, _CACHE, layers)]


def move_inputs(layers: int) -> list[TensorSpec]:
    """The cache (N rows), the rows to rewrite (M, 1) and the row each copies (M,)."""
    return [*per_layer("self_k", FLOAT, _CACHE, layers),
            *per_layer("self_v", FLOAT, _CACHE, layers),
            _spec("moved_rows", "int64", "M", 1),
            _spec("moved_from", "int64", "M")]


def move_outputs(layers: int) -> list[TensorSpec]:
    return [*per_layer("moved_self_k", FLOAT, _CACHE, layers),
            *per_layer("moved_self_v", FLOAT, _CACHE, layers)]


def standard_graphs(layers: int, opset: int,
                    dtypes: Mapping[str, str] | None = None) -> GraphSpecs:
    """The graphs of a model with `layers` decoder layers. dtypes: tensor name ->
    dtype as the graphs hold it, replacing the placeholder "float"."""
    dtypes = dtypes or {}

    def graph(file: str, inputs: list[TensorSpec], outputs: list[TensorSpec]) -> GraphSpec:
        def typed(specs: list[TensorSpec]) -> tuple[TensorSpec, ...]:
            return tuple(dataclasses.replace(s, dtype=dtypes.get(s.name, s.dtype))
                         for s in specs)

        return GraphSpec(file, opset, typed(inputs), typed(outputs))

    return GraphSpecs(
        encoder=graph(ENCODER_FILE, ENCODER_INPUTS, encoder_outputs(layers)),
        decoder=graph(DECODER_FILE, decoder_inputs(layers), decoder_outputs(layers)),
        reorder=graph(REORDER_FILE, reorder_inputs(layers), reorder_outputs(layers)),
        move=graph(MOVE_FILE, move_inputs(layers), move_outputs(layers)),
        select=graph(SELECT_FILE, SELECT_INPUTS, SELECT_OUTPUTS))


# -- the manifest --------------------------------------------------------------------


@dataclass(frozen=True)
class SpecialTokens:
    pad: int
    eos: int
    unk: int
    bos: int
    decoder_start: int
    suppress: tuple[int, ...] = ()  # never generated: padding and the start token

    @classmethod
    def of(cls, config: ModelConfig) -> SpecialTokens:
        return cls(pad=config.pad_id, eos=config.eos_id, unk=config.unk_id, bos=config.bos_id,
                   decoder_start=config.decoder_start_id,
                   suppress=tuple(sorted({config.pad_id, config.decoder_start_id}
                                         - {config.eos_id})))


@dataclass(frozen=True)
class TokenizerFiles:
    """The tokenizer's files in the package: of type "sentencepiece", SentencePiece
    models and the vocab mapping their pieces to model ids; of type "tokenizers",
    one tokenizer.json (Hugging Face `tokenizers`, e.g. BART's byte-level BPE)."""

    source_model: str = field(default="", metadata=OMITTED_AT_DEFAULT)
    target_model: str = field(default="", metadata=OMITTED_AT_DEFAULT)
    vocab: str = field(default="", metadata=OMITTED_AT_DEFAULT)
    type: str = "sentencepiece"  # one of TOKENIZER_TYPES
    append_eos: bool = True
    tokenizer_json: str = field(default="", metadata=OMITTED_AT_DEFAULT)  # "tokenizers" only

    def files(self) -> tuple[str, ...]:
        if self.type == "tokenizers":
            return (self.tokenizer_json,)
        return self.source_model, self.target_model, self.vocab


TOKENIZER_TYPES = ("sentencepiece", "tokenizers")


@dataclass(frozen=True)
class GenerationDefaults:
    """The model's decoding defaults: what a request's unset options become.
    None: not set here (the server's built-in default applies)."""

    beam_size: int | None = None
    num_hypotheses: int | None = None
    length_penalty: float | None = None
    early_stopping: bool | str | None = None
    max_length: int | None = None
    max_length_ratio: float | None = None
    min_length: int | None = None
    no_repeat_ngram_size: int | None = None
    repetition_penalty: float | None = None
    sampling_temperature: float | None = None
    sampling_top_k: int | None = None
    sampling_top_p: float | None = None
    # Decode over the vocabulary shortlist (a format 8 package's table) unless a
    # request says otherwise; None or False: over the whole vocabulary.
    shortlist: bool | None = None
    # The model's, not a request's (no request option overrides them), applied as
    # generate() applies generation_config's keys of these names: the first new
    # token is forced_bos_token_id, the last one a row's limit allows is
    # forced_eos_token_id, and no output contains a bad word. None: off (as in
    # manifests written before these keys).
    forced_bos_token_id: int | None = None
    forced_eos_token_id: int | None = None
    bad_words_ids: tuple[tuple[int, ...], ...] | None = None
    # Also the model's, as generate() applies them: begin_suppress_tokens are banned
    # at the first new token (the second after a forced BOS); from
    # exponential_decay_start new tokens on, EOS's log-prob rises by |log-prob| *
    # (factor ** steps past the start - 1); renormalize_logits: a log-softmax after
    # every processor. None: off.
    begin_suppress_tokens: tuple[int, ...] | None = None
    # No output repeats an n-gram of this many tokens of its own source (its token
    # ids, EOS included).
    encoder_no_repeat_ngram_size: int | None = None
    exponential_decay_start: int | None = None
    exponential_decay_factor: float | None = None
    renormalize_logits: bool | None = None
    # The folder's generation keys exported anyway without being applied (export's
    # --ignore-generation-key): the package's tokens may differ from generate()'s
    # there. None: every key that changes generate()'s tokens is applied.
    ignored_keys: tuple[str, ...] | None = None

    MODEL_KEYS: ClassVar[tuple[str, ...]] = (
        "forced_bos_token_id", "forced_eos_token_id", "bad_words_ids",
        "begin_suppress_tokens", "encoder_no_repeat_ngram_size", "exponential_decay_start",
        "exponential_decay_factor", "renormalize_logits", "ignored_keys")

    def as_dict(self) -> dict[str, int | float | bool | str]:
        """The request options' defaults this package sets, by name (the model's
        own keys, MODEL_KEYS, are not request options)."""
        return {f.name: value for f in dataclasses.fields(self)
                if f.name not in self.MODEL_KEYS and (value := getattr(self, f.name)) is not None}


def shortlist_decoder_inputs(layers: int) -> list[TensorSpec]:
    """The decoder's inputs, then each source's candidate columns of the output
    projection (dtype: the decoder's weights) and their bias (-inf at padding)."""
    return [*decoder_inputs(layers), _spec("shortlist_weight", FLOAT, "B", "D", "C"),
            _spec("shortlist_bias", "float32", "B", "C")]


def shortlist_decoder_outputs(layers: int) -> list[TensorSpec]:
    """The decoder's outputs, log_probs over each row's candidates (N, C)."""
    return [_spec("log_probs", "float32", "N", "C"), *decoder_outputs(layers)[1:]]


def shortlist_graph(layers: int, opset: int,
                    dtypes: Mapping[str, str] | None = None) -> GraphSpec:
    dtypes = dtypes or {}
    return GraphSpec(SHORTLIST_DECODER_FILE, opset,
                     tuple(dataclasses.replace(s, dtype=dtypes.get(s.name, s.dtype))
                           for s in shortlist_decoder_inputs(layers)),
                     tuple(dataclasses.replace(s, dtype=dtypes.get(s.name, s.dtype))
                           for s in shortlist_decoder_outputs(layers)))


@dataclass(frozen=True)
class ShortlistSpec:
    """A format 8 package's vocabulary shortlist: its table (shortlist.npz), its
    decoder graph, and how many candidates a sentence gets (Marian's `first best
    prune`: the `first` most frequent target pieces, each source piece's `best`
    translations scoring at least `threshold`, and the special pieces)."""

    decoder: GraphSpec
    first: int  # the exporter's settings (model/package/shortlist.py ShortlistSettings)
    best: int
    threshold: float
    table: str = SHORTLIST_FILE
    # Where the table was learned and the quality gate's verdict, for people.
    learned_from: str = ""


@dataclass
class Manifest:
    name: str
    task: str  # one of TASKS
    source_language: str
    target_language: str
    config: ModelConfig
    special_tokens: SpecialTokens
    tokenizer: TokenizerFiles
    generation: GenerationDefaults
    precision: str  # one of PRECISIONS
    max_source_length: int
    graphs: GraphSpecs
    files: dict[str, str] = field(default_factory=dict)  # file name -> sha256
    # Provenance for people (the exporter's version, its source, the measured
    # deviation from PyTorch); the server does not read it.
    exporter: dict[str, object] = field(default_factory=dict)
    format_version: int = FORMAT_VERSION
    # Format 8 only (None, and absent from the JSON, before it): the attention the
    # graphs were built with (one of ATTENTIONS), and the vocabulary shortlist.
    attention: str | None = None
    shortlist: ShortlistSpec | None = None
    # What the model expects before every input text (T5's task prefix, "summarize: ",
    # "translate English to German: "): the server adds it. Absent when empty.
    input_prefix: str = field(default="", metadata=OMITTED_AT_DEFAULT)
    # A multilingual model's languages (languages.py): every pair of them is served,
    # and source_language and target_language are MULTILINGUAL. None (absent): the
    # one pair source_language -> target_language.
    languages: Languages | None = None

    @property
    def multilingual(self) -> bool:
        return self.languages is not None

    @property
    def fused_attention(self) -> bool:
        """Whether the decoder's attention is ONNX Runtime's fused operators."""
        if self.attention is not None:
            return self.attention == "fused"
        return self.format_version >= 7

    @property
    def digest(self) -> str:
        """One sha256 over the manifest itself, which holds every file's sha256: two
        packages with one digest compute the same outputs."""
        return hashlib.sha256(self.to_json().encode()).hexdigest()

    def never_generated(self) -> tuple[int, ...]:
        """The ids no output contains, whatever the step: the suppressed ones and the
        one-token bad words (what a peer system is told to suppress)."""
        words = self.generation.bad_words_ids or ()
        return tuple(sorted({*self.special_tokens.suppress,
                             *(w[0] for w in words if len(w) == 1)}))

    def to_dict(self) -> dict[str, object]:
        plain = _plain(self)
        assert isinstance(plain, dict)
        return plain

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True, ensure_ascii=False) + "\n"

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> Manifest:
        """The manifest of a parsed manifest.json; raises ManifestError listing
        every key that is missing, unknown or of the wrong type."""
        problems: list[str] = []
        manifest = _from_json(cls, dict(data), "", problems)
        if manifest is None:
            raise ManifestError(problems)
        return manifest


REQUIRED_KEYS = ("name", "task", "source_language", "target_language", "config",
                 "special_tokens", "tokenizer", "generation", "precision", "max_source_length",
                 "files", "graphs", "format_version")


class ManifestError(ValueError):
    """manifest.json does not describe a manifest; `problems` names each key."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("; ".join(problems))


class PackageError(ValueError):
    """A package failed verification; `problems` lists every finding."""

    def __init__(self, path: Path, problems: list[str]):
        self.path = path
        self.problems = problems
        super().__init__(f"model package {path} is invalid:\n  " + "\n  ".join(problems))


@dataclass
class ModelPackage:
    path: Path
    manifest: Manifest

    @property
    def encoder_path(self) -> Path:
        return self.path / ENCODER_FILE

    @property
    def decoder_path(self) -> Path:
        return self.path / DECODER_FILE

    @property
    def reorder_path(self) -> Path:
        return self.path / REORDER_FILE

    @property
    def move_path(self) -> Path:
        return self.path / MOVE_FILE

    @property
    def select_path(self) -> Path:
        return self.path / SELECT_FILE

    @property
    def shortlist_decoder_path(self) -> Path | None:
        spec = self.manifest.shortlist
        return None if spec is None else self.path / spec.decoder.file

    @property
    def shortlist_table_path(self) -> Path | None:
        spec = self.manifest.shortlist
        return None if spec is None else self.path / spec.table

    def file(self, name: str) -> Path:
        return self.path / name


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def load_package(path: str | Path, verify_hashes: bool = True) -> ModelPackage:
    """Read and verify a package. Raises PackageError listing every problem."""
    root = Path(path)
    data = _read_manifest(root)
    try:
        manifest = Manifest.from_dict(data)
    except ManifestError as e:
        raise PackageError(root, [f"{MANIFEST}: {p}" for p in e.problems]) from None
    problems = [f"{MANIFEST}: {p}" for p in _manifest_problems(manifest)]
    problems += _file_problems(root, manifest.files, verify_hashes)
    if problems:
        raise PackageError(root, problems)
    return ModelPackage(root, manifest)


def _read_manifest(root: Path) -> dict[str, object]:
    """manifest.json as a JSON object of a readable format version, or PackageError."""
    manifest_path = root / MANIFEST
    if not manifest_path.is_file():
        raise PackageError(root, [f"{MANIFEST}: missing"])
    try:
        data = json.loads(manifest_path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise PackageError(root, [f"{MANIFEST}: not valid JSON ({e})"]) from None
    if not isinstance(data, dict):
        raise PackageError(root, [f"{MANIFEST}: expected a JSON object"])
    missing = [f"{MANIFEST}: missing key {k!r}" for k in REQUIRED_KEYS if k not in data]
    if missing:
        raise PackageError(root, missing)
    if data["format_version"] not in READABLE_FORMATS:
        readable = " and ".join(map(str, READABLE_FORMATS))
        raise PackageError(root, [f"{MANIFEST}: format_version {data['format_version']} is not "
                                  f"supported (this seq2serve reads {readable}); re-export "
                                  "it with `seq2serve export`"])
    return data


def _manifest_problems(manifest: Manifest) -> list[str]:
    """What a well-typed manifest may still get wrong: values out of their sets,
    files not listed, graphs that are not the ones the server runs."""
    problems = [f"config: {p}" for p in manifest.config.problems()]
    if manifest.task not in TASKS:
        problems.append(f"task must be one of {', '.join(TASKS)}, got {manifest.task!r}")
    if manifest.precision not in PRECISIONS:
        problems.append(f"precision must be one of {', '.join(PRECISIONS)}, "
                        f"got {manifest.precision!r}")
    if manifest.tokenizer.type not in TOKENIZER_TYPES:
        problems.append(f"tokenizer.type must be one of {', '.join(TOKENIZER_TYPES)}, "
                        f"got {manifest.tokenizer.type!r}")
    elif not all(manifest.tokenizer.files()):
        problems.append(f"tokenizer: a {manifest.tokenizer.type} tokenizer needs "
                        + ("tokenizer_json" if manifest.tokenizer.type == "tokenizers"
                           else "source_model, target_model and vocab"))
    for required in (*GRAPH_FILES, *manifest.tokenizer.files()):
        if required not in manifest.files:
            problems.append(f"'files' does not list {required}")
    if manifest.languages is not None:
        problems += manifest.languages.problems(manifest.config.tgt_vocab_size)
        for side in ("source_language", "target_language"):
            if getattr(manifest, side) != MULTILINGUAL:
                problems.append(f"{side} must be {MULTILINGUAL!r} in a package with languages, "
                                f"got {getattr(manifest, side)!r}")
    problems += _format_problems(manifest)
    expected = standard_graphs(manifest.config.decoder_layers, 0)
    for name, graph in manifest.graphs.by_name().items():
        want = getattr(expected, name)
        if graph.file != want.file:
            problems.append(f"graphs.{name}.file must be {want.file!r}, got {graph.file!r}")
        for kind in ("inputs", "outputs"):
            problems += _name_problems(f"graphs.{name}.{kind}", getattr(graph, kind),
                                       getattr(want, kind), manifest.config.decoder_layers,
                                       manifest.format_version)
    return problems


def _format_problems(manifest: Manifest) -> list[str]:
    """Format 8 says its attention and has a shortlist; formats 6 and 7 have neither."""
    problems = []
    if manifest.format_version < FORMAT_VERSION:
        for key in ("attention", "shortlist"):
            if getattr(manifest, key) is not None:
                problems.append(f"{key}: not part of format {manifest.format_version}")
        return problems
    if manifest.attention not in ATTENTIONS:
        problems.append(f"attention must be one of {', '.join(ATTENTIONS)}, "
                        f"got {manifest.attention!r}")
    spec = manifest.shortlist
    if spec is None:
        return problems + [f"shortlist: missing (format {FORMAT_VERSION} has one)"]
    layers = manifest.config.decoder_layers
    for required in (spec.table, spec.decoder.file):
        if required not in manifest.files:
            problems.append(f"'files' does not list {required}")
    if spec.decoder.file != SHORTLIST_DECODER_FILE:
        problems.append(f"shortlist.decoder.file must be {SHORTLIST_DECODER_FILE!r}, "
                        f"got {spec.decoder.file!r}")
    want = shortlist_graph(layers, 0)
    for kind in ("inputs", "outputs"):
        problems += _name_problems(f"shortlist.decoder.{kind}", getattr(spec.decoder, kind),
                                   getattr(want, kind), layers, manifest.format_version)
    if spec.first < 0 or spec.best < 0 or not 0.0 <= spec.threshold <= 1.0:
        problems.append(f"shortlist: first and best must be >= 0 and threshold in [0, 1], "
                        f"got {spec.first}, {spec.best}, {spec.threshold}")
    return problems


def _name_problems(where: str, listed: tuple[TensorSpec, ...], wanted: tuple[TensorSpec, ...],
                   layers: int, version: int) -> list[str]:
    """The tensors the server binds by name must be the ones listed."""
    have, want = [s.name for s in listed], [s.name for s in wanted]
    if have == want:
        return []
    missing = [n for n in want if n not in have]
    unknown = [n for n in have if n not in want]
    detail = "; ".join(part for part in (
        f"missing {', '.join(map(repr, missing))}" if missing else "",
        f"not expected {', '.join(map(repr, unknown))}" if unknown else "",
        "" if missing or unknown else "in another order") if part)
    return [f"{where} are not those of a format {version} graph for {layers} decoder "
            f"layers: {detail}"]


def _file_problems(root: Path, files: dict[str, str], verify_hashes: bool) -> list[str]:
    problems = []
    for name, expected in sorted(files.items()):
        file_path = root / name
        if "/" in name or name.startswith("."):
            problems.append(f"{name}: file names in a package must be plain names")
        elif not file_path.is_file():
            problems.append(f"{name}: missing")
        elif verify_hashes and sha256_file(file_path) != expected:
            problems.append(f"{name}: sha256 mismatch (file is corrupt, truncated or modified)")
    return problems


# -- JSON <-> dataclasses ------------------------------------------------------------

T = TypeVar("T")


class _Mismatch(Exception):
    """A JSON value is not of its field's type."""

    def __init__(self, where: str, expected: str, value: object):
        super().__init__(f"{where} must be {expected}, got {_short(value)}")


class _Reported(Exception):
    """A nested object's problems are already listed."""


def _plain(value: object) -> object:
    """Dataclasses as JSON objects (fields that are None left out, and those marked
    OMITTED_AT_DEFAULT while at their default), tuples as arrays."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(v) for f in dataclasses.fields(value)
                if (v := getattr(value, f.name)) is not None
                and not (f.metadata.get("omitted_at_default") and v == f.default)}
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return value


def _from_json(cls: type[T], data: object, where: str, problems: list[str]) -> T | None:
    """An instance of the dataclass `cls` from a JSON object, or None with every
    problem (a key missing, unknown, or of the wrong type) added to `problems`.
    `where` prefixes the keys in messages ("graphs.decoder.")."""
    if not isinstance(data, dict):
        problems.append(f"{where.rstrip('.') or 'the manifest'} must be an object, "
                        f"got {_short(data)}")
        return None
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]  # cls is a dataclass: every caller passes one
    before = len(problems)
    problems += [f"{where}{k}: unknown key" for k in sorted(set(data) - set(fields))]
    values: dict[str, object] = {}
    for name, f in fields.items():
        if name not in data:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                problems.append(f"{where}{name}: missing")
            continue
        try:
            values[name] = _convert(hints[name], data[name], f"{where}{name}", problems)
        except _Mismatch as e:
            problems.append(str(e))
        except _Reported:
            pass
    if len(problems) > before:
        return None
    return cls(**values)


def _convert(hint: object, value: object, where: str, problems: list[str]) -> object:
    """`value` as the type `hint`: JSON arrays become tuples, numbers become floats
    where a float is wanted, objects become the dataclass wanted. Raises _Mismatch
    naming the key and the type."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any or hint is object:
        return value
    if origin is typing.Union or origin is types.UnionType:
        for arg in args:
            try:
                return _convert(arg, value, where, problems)
            except _Mismatch:
                continue
        raise _Mismatch(where, " or ".join(_describe(a) for a in args), value)
    if hint is type(None) and value is None:
        return None
    if hint is bool and isinstance(value, bool):
        return value
    if hint is int and isinstance(value, int) and not isinstance(value, bool):
        return value
    if hint is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if hint is str and isinstance(value, str):
        return value
    if origin is tuple and isinstance(value, list):
        return tuple(_convert(args[0], v, f"{where}[{i}]", problems)
                     for i, v in enumerate(value))
    if origin is dict and isinstance(value, dict):
        return {str(k): _convert(args[1], v, f"{where}.{k}", problems)
                for k, v in value.items()}
    if isinstance(hint, type) and dataclasses.is_dataclass(hint) and isinstance(value, dict):
        converted = _from_json(hint, value, f"{where}.", problems)
        if converted is None:
            raise _Reported
        return converted
    raise _Mismatch(where, _describe(hint), value)


_TYPE_NAMES: tuple[tuple[object, str], ...] = (
    (bool, "true or false"), (int, "an integer"), (float, "a number"), (str, "a string"),
    (type(None), "null"))


def _describe(hint: object) -> str:
    for known, name in _TYPE_NAMES:
        if hint is known:
            return name
    if typing.get_origin(hint) is tuple:
        return "an array"
    return "an object"


def _short(value: object, limit: int = 60) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= limit else text[:limit] + "..."
