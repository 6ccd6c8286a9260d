"""What every Hugging Face family shares: reading config.json and the weights
(safetensors or a torch file, single or sharded) as plain data, with every problem
collected before failing (CTranslate2-converter style) and raised as one
`ConversionError`; transformers' activation names; the BART layout's weight
mapping (Marian and BART name their layers alike): names, ties, checks. `transformers` is never
imported here (a test-only dependency) and nothing is fetched from a hub.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from seq2serve.model.config import ModelConfig

if TYPE_CHECKING:
    from seq2serve.model.transformer import Seq2SeqTransformer

CONFIG_FILE = "config.json"
SAFETENSORS_FILE = "model.safetensors"
TORCH_FILE = "pytorch_model.bin"

# transformers' ACT2FN name -> ours. gelu_python is exact (erf) GELU; the tanh
# variants are the same formula as torch's approximate="tanh".
ACTIVATION_MAP = {
    "relu": "relu",
    "gelu": "gelu",
    "gelu_python": "gelu",
    "gelu_new": "gelu_new",
    "gelu_pytorch_tanh": "gelu_new",
    "swish": "swish",
    "silu": "swish",
}


class ConversionError(ValueError):
    """Everything wrong with one checkpoint, listed together."""

    def __init__(self, source: str | Path, problems: Iterable[str]):
        self.source = str(source)
        self.problems = list(problems)
        super().__init__(
            f"cannot convert checkpoint {self.source}:\n  - " + "\n  - ".join(self.problems)
        )


# -- files ---------------------------------------------------------------------


def read_config(path: Path, problems: list[str]) -> dict[str, Any] | None:
    file = path / CONFIG_FILE
    if not file.is_file():
        problems.append(f"{CONFIG_FILE} not found in {path}")
        return None
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        problems.append(f"{CONFIG_FILE} is not readable JSON: {exc}")
        return None
    if not isinstance(data, dict):
        problems.append(f"{CONFIG_FILE} must hold a JSON object, got {type(data).__name__}")
        return None
    return data


def _load_one(file: Path, problems: list[str]) -> dict[str, Tensor] | None:
    try:
        if file.name.endswith(".safetensors"):
            from safetensors.torch import load_file

            return load_file(str(file), device="cpu")
        data = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as exc:  # any reader failure is a problem to report, not a crash
        problems.append(f"{file.name} cannot be read: {type(exc).__name__}: {exc}")
        return None
    if not isinstance(data, Mapping) or not all(isinstance(v, Tensor) for v in data.values()):
        problems.append(f"{file.name} does not hold a flat name -> tensor mapping")
        return None
    return dict(data)


def read_folder(path: Path) -> tuple[dict[str, Any], dict[str, Tensor] | None, list[str]]:
    """A folder's config.json and weights, with the problems found so far (the
    caller adds its own); ConversionError when there is no config to check at all."""
    problems: list[str] = []
    if not path.is_dir():
        raise ConversionError(path, [f"{path} is not a directory"])
    hf = read_config(path, problems)
    stored = read_weights(path, problems)
    if hf is None:
        raise ConversionError(path, problems)
    return hf, stored, problems


def read_weights(path: Path, problems: list[str]) -> dict[str, Tensor] | None:
    """Prefer safetensors; accept single-file or sharded (`*.index.json`) checkpoints."""
    for single in (SAFETENSORS_FILE, TORCH_FILE):
        index = path / f"{single}.index.json"
        if (path / single).is_file():
            return _load_one(path / single, problems)
        if index.is_file():
            try:
                shards = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"]
                                    .values()))
            except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
                problems.append(f"{index.name} is not a valid shard index: {exc}")
                return None
            weights: dict[str, Tensor] = {}
            ok = True
            for shard in shards:
                part = _load_one(path / shard, problems)
                ok = ok and part is not None
                weights.update(part or {})
            return weights if ok else None
    problems.append(f"no weights in {path}: expected {SAFETENSORS_FILE} or {TORCH_FILE}")
    return None


def build_model(cfg: ModelConfig, state: Mapping[str, Tensor],
                dtype: torch.dtype = torch.float32) -> Seq2SeqTransformer:
    """A `Seq2SeqTransformer` in eval mode with a converted checkpoint's weights."""
    from seq2serve.model.transformer import Seq2SeqTransformer

    model = Seq2SeqTransformer(cfg)
    model.load_state_dict(state, strict=True)
    return model.to(dtype).eval()


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# -- the BART layout (Marian, BART): tensor names, ties, checks ---------------------

_ATTN = ("q_proj", "k_proj", "v_proj", "out_proj")
_AFFINE = ("weight", "bias")


def layer_names(cfg: ModelConfig, hf_prefix: str) -> dict[str, str]:
    """our name -> HF name for every per-layer tensor of the BART layout (Marian's
    and BART's layers carry the same names)."""
    names: dict[str, str] = {}
    for i in range(cfg.encoder_layers):
        ours, hf = f"encoder_layers.{i}.", f"{hf_prefix}encoder.layers.{i}."
        pairs = [(f"self_attn.{p}", f"self_attn.{p}") for p in _ATTN]
        pairs += [("attn_block.norm", "self_attn_layer_norm"), ("ffn.fc1", "fc1"),
                  ("ffn.fc2", "fc2"), ("ffn_block.norm", "final_layer_norm")]
        for a, b in pairs:
            for t in _AFFINE:
                names[f"{ours}{a}.{t}"] = f"{hf}{b}.{t}"
    for i in range(cfg.decoder_layers):
        ours, hf = f"decoder_layers.{i}.", f"{hf_prefix}decoder.layers.{i}."
        pairs = [(f"self_attn.{p}", f"self_attn.{p}") for p in _ATTN]
        pairs += [(f"cross_attn.{p}", f"encoder_attn.{p}") for p in _ATTN]
        pairs += [("self_block.norm", "self_attn_layer_norm"),
                  ("cross_block.norm", "encoder_attn_layer_norm"), ("ffn.fc1", "fc1"),
                  ("ffn.fc2", "fc2"), ("ffn_block.norm", "final_layer_norm")]
        for a, b in pairs:
            for t in _AFFINE:
                names[f"{ours}{a}.{t}"] = f"{hf}{b}.{t}"
    return names


def expected_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor of our model for `cfg`, by name, with its shape."""
    from seq2serve.model.transformer import Seq2SeqTransformer

    # The meta device gives every parameter's shape without allocating or initialising.
    with torch.device("meta"):
        model = Seq2SeqTransformer(cfg)
    return {name: tuple(t.shape) for name, t in model.state_dict(keep_vars=True).items()}


def same(a: Tensor | None, b: Tensor | None) -> bool:
    return a is not None and b is not None and a.shape == b.shape and bool(torch.equal(a, b))


def hf_prefix(weights: Mapping[str, Tensor]) -> str:
    # A ...ForConditionalGeneration/MTModel stores "model.encoder...", a bare model "encoder...".
    if any(k.startswith("model.") for k in weights):
        return "model."
    return ""


class Weights:
    """A checkpoint's tensors by name, remembering which were read (the rest are
    reported as unexpected)."""

    def __init__(self, tensors: Mapping[str, Tensor]):
        self.tensors = tensors
        self.used: set[str] = set()

    def __contains__(self, name: str) -> bool:
        return name in self.tensors

    def take(self, *names: str) -> Tensor | None:
        """The first of `names` stored, or None."""
        for name in names:
            if name in self.tensors:
                self.used.add(name)
                return self.tensors[name]
        return None


@dataclass
class Embeddings:
    """The matrices the encoder, decoder and output projection read, and the HF
    names to cite for each in messages."""

    source: Tensor | None
    target: Tensor | None
    output: Tensor | None
    names: dict[str, str]


def tied_embeddings(weights: Weights, prefix: str, share: bool, tie: bool,
                    problems: list[str]) -> Embeddings:
    """The embedding matrices under transformers 5's rules: `share` (encoder and
    decoder read one matrix) applies only with `tie` (tie_word_embeddings), since a
    false tie_word_embeddings unties everything. A tied tensor is stored once,
    under its tie target, or (older files) under every name: the first one present
    is read and the others must equal it."""
    shared = f"{prefix}shared.weight"
    enc_name = f"{prefix}encoder.embed_tokens.weight"
    dec_name = f"{prefix}decoder.embed_tokens.weight"
    if share and tie:
        group = [shared, enc_name, dec_name, "lm_head.weight"]
    elif tie:
        group = [dec_name, "lm_head.weight"]
    else:
        group = []
    present = [name for name in group if name in weights]
    for name in present[1:]:
        weights.used.add(name)
        if not same(weights.tensors[name], weights.tensors[present[0]]):
            problems.append(f"config ties {name} to {present[0]} but the stored tensors differ")
    tied = weights.take(*present) if present else None
    if shared in weights:
        weights.used.add(shared)  # transformers 5 keeps it, but no module reads it when untied
    tied_name = " = ".join(present or group)  # names the tie group in messages
    return Embeddings(
        source=tied if share and tie else weights.take(enc_name),
        target=tied if tie else weights.take(dec_name),
        output=tied if tie else weights.take("lm_head.weight"),
        names={"src_embed.weight": tied_name if share and tie else enc_name,
               "tgt_embed.weight": tied_name if tie else dec_name,
               "output.weight": tied_name if tie else "lm_head.weight",
               "final_logits_bias": "final_logits_bias"})


def logits_bias(weights: Weights) -> Tensor | None:
    """final_logits_bias as a (V,) vector, or None where absent or all zeros (what
    transformers loads a missing one as, and OPUS-MT's are: adding it is a pass over
    (N, V) logits every decoder step that changes nothing)."""
    bias = weights.take("final_logits_bias")
    if bias is not None and bias.dim() == 2 and bias.shape[0] == 1:
        bias = bias[0]  # stored (1, V)
    if bias is None or (bias.is_floating_point() and not bool(bias.any())):
        return None
    return bias


def check_state(cfg: ModelConfig, state: Mapping[str, Tensor | None], hf_names: Mapping[str, str],
                weights: Weights, problems: list[str]) -> dict[str, Tensor]:
    """Every tensor our model for `cfg` needs, present, of its shape and floating;
    no stored tensor left unread. Returns the state dict (problems appended)."""
    expected = expected_shapes(cfg)
    for name, shape in expected.items():
        tensor = state.get(name)
        if tensor is None:
            problems.append(f"missing tensor {hf_names.get(name, name)}")
        elif tuple(tensor.shape) != shape:
            problems.append(f"{hf_names.get(name, name)} has shape {tuple(tensor.shape)}, "
                            f"expected {shape}")
        elif not tensor.is_floating_point():
            problems.append(f"{hf_names.get(name, name)} has dtype {tensor.dtype}, expected float")
    extra = sorted(set(weights.tensors) - weights.used)
    if extra:
        shown = ", ".join(extra[:10]) + (f", ... ({len(extra)} in all)" if len(extra) > 10 else "")
        problems.append(f"unexpected tensors (layer counts or architecture differ?): {shown}")
    return {k: v for k, v in state.items() if k in expected and v is not None}


def check_sinusoid_positions(cfg: ModelConfig, weights: Weights, prefix: str, family: str,
                             problems: list[str]) -> None:
    """A family of sinusoid positions (Marian, Pegasus): our model recomputes the
    table, so a stored
    `embed_positions` is only read and checked to be that table (`cfg`'s layout,
    from position 0); one that differs would be learned positions."""
    from seq2serve.model.transformer import sinusoid_table

    table: Tensor | None = None
    for side in ("encoder", "decoder"):
        name = f"{prefix}{side}.embed_positions.weight"
        stored = weights.take(name)
        if stored is None:
            continue
        if tuple(stored.shape) != (cfg.max_positions, cfg.d_model):
            problems.append(f"{name} has shape {tuple(stored.shape)}, expected "
                            f"{(cfg.max_positions, cfg.d_model)}")
            continue
        if table is None:
            table = sinusoid_table(cfg.max_positions, cfg.d_model, cfg.position_layout)
        tol = max(4 * torch.finfo(stored.dtype).eps, 1e-6) if stored.is_floating_point() else 0
        if not torch.allclose(stored.float(), table, atol=tol, rtol=0):
            diff = (stored.float() - table).abs().max().item()
            problems.append(f"{name} is not {family}'s sinusoid table (max diff {diff:.3g}); "
                            "learned positions are not supported")


TOKENIZER_JSON = "tokenizer.json"


def tokenizer_json(path: Path, problems: list[str], files: tuple[str, ...],
                   tokenizer_class: str, family: str) -> Path | None:
    """The folder's tokenizer.json; or, where it has only the family's tokenizer
    `files` (BART: vocab.json + merges.txt; T5, Pegasus: spiece.model), one written
    by transformers' `tokenizer_class` (at export only: the server reads the file with
    `tokenizers`) into a temporary folder removed when the process ends."""
    import atexit
    import shutil
    import tempfile

    if (path / TOKENIZER_JSON).is_file():
        return path / TOKENIZER_JSON
    names = " + ".join(files)
    if not all((path / name).is_file() for name in files):
        problems.append(f"{TOKENIZER_JSON}: missing, and no {names} to build it from "
                        f"(a {family} directory needs its tokenizer files)")
        return None
    try:
        import transformers
    except ImportError:
        problems.append(f"{TOKENIZER_JSON}: missing; building it from {names} needs "
                        "transformers installed (pip install transformers)")
        return None
    try:
        tokenizer = getattr(transformers, tokenizer_class).from_pretrained(str(path))
        out = Path(tempfile.mkdtemp(prefix=f"seq2serve-{family.lower()}-tokenizer-"))
        atexit.register(shutil.rmtree, out, True)  # read by the export, then of no use
        tokenizer.save_pretrained(str(out))
    except Exception as e:  # any failure of the reader is a problem to report
        problems.append(f"{names}: cannot build {TOKENIZER_JSON} ({type(e).__name__}: {e})")
        return None
    if not (out / TOKENIZER_JSON).is_file():
        problems.append(f"{names}: transformers wrote no {TOKENIZER_JSON}")
        return None
    return out / TOKENIZER_JSON


def check_tokenizer_ids(file: Path, vocab_size: int, family: str,
                        problems: list[str]) -> None:
    """Every id of a tokenizer.json (BPE: piece -> id; Unigram: [piece, score] by id;
    its added tokens) is a row of the model's vocabulary."""
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
        vocab = data["model"]["vocab"]
        ids = vocab.values() if isinstance(vocab, dict) else range(len(vocab))
        top = max([*ids, *(t["id"] for t in data.get("added_tokens", []))])
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        problems.append(f"{TOKENIZER_JSON}: not a {family} tokenizer.json ({e})")
        return
    if top >= vocab_size:
        problems.append(f"{TOKENIZER_JSON}: ids reach {top} but the model's vocabulary has "
                        f"{vocab_size} entries")


# -- config.json, checked --------------------------------------------------------------


def check_architectures(hf_config: Mapping[str, Any], supported: tuple[str, ...],
                        problems: list[str]) -> None:
    """config.json's `architectures`, when given, names one of the supported classes."""
    archs = hf_config.get("architectures")
    if archs is not None and not any(a in supported for a in archs or ()):
        problems.append(f"architectures must include one of {supported}, got {archs}")


def config_ints(hf: Mapping[str, Any], names: Iterable[str],
                problems: list[str]) -> dict[str, int]:
    """Each of `names` as an integer; one that is not is a problem (and 1, so that the
    rest of the config can still be checked)."""
    ints: dict[str, int] = {}
    for name in names:
        if is_int(hf[name]):
            ints[name] = hf[name]
        else:
            problems.append(f"{name} must be an integer, got {hf[name]!r}")
            ints[name] = 1
    return ints


def one_eos(hf: Mapping[str, Any], fallback: int, problems: list[str]) -> int:
    """config.json's eos_token_id: one integer (a list of one id repeated is one)."""
    eos = hf["eos_token_id"]
    if isinstance(eos, list) and len(set(eos)) == 1:
        eos = eos[0]
    if not is_int(eos):
        problems.append(f"eos_token_id must be one integer, got {eos!r}")
        return fallback
    return int(eos)
