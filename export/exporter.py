"""`seq2serve export SOURCE OUTPUT_DIR`: a checkpoint to a verified model package.

The package is built in a temporary directory beside OUTPUT_DIR and renamed
into place only after every check passed, so a failed export leaves nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import shutil
import sys
import tempfile
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tqdm import tqdm  # type: ignore[import-untyped]  # tqdm ships no type information

from seq2serve.export.sources import SAMPLE_TEXTS, load_source
from seq2serve.model.config import ModelConfig
from seq2serve.model.families.generation import without_keys
from seq2serve.model.families.generation_keys import KNOWN, refused_keys
from seq2serve.model.families.registry import families_help
from seq2serve.model.families.source import Source, SourceError
from seq2serve.model.families.tasks import TaskRequest
from seq2serve.model.package import kernels, placement
from seq2serve.model.package.manifest import (
    ATTENTIONS,
    DECODER_FILE,
    DEFAULT_ATTENTION,
    ENCODER_FILE,
    GRAPH_FILES,
    MANIFEST,
    PRECISIONS,
    SHORTLIST_DECODER_FILE,
    SHORTLIST_FILE,
    Manifest,
    ModelPackage,
    ShortlistSpec,
    SpecialTokens,
    format_version,
    load_package,
    sha256_file,
    shortlist_graph,
    standard_graphs,
)
from seq2serve.model.package.shortlist import ShortlistSettings

if TYPE_CHECKING:  # verify imports torch: loaded when an export runs, not at import
    from seq2serve.export.verify import Deviation

FP32_LOG_PROB_TOLERANCE = 1e-4
FP16_KEPT_FP32 = ["LogSoftmax"]  # log-probabilities are compared and summed in fp32
# The shortlist decoder's log-probs against the full decoder's renormalised over the
# same candidates: the same logits, another normalisation (fp16: its rounding).
SHORTLIST_TOLERANCE = {"fp32": 1e-4, "int8": 1e-4, "fp16": 0.05}


class ExportError(RuntimeError):
    pass


@dataclass
class ExportReport:
    package: Path
    precision: str
    sizes: dict[str, int]
    deviation: dict[str, Any]
    fp32_deviation: dict[str, Any]

    @property
    def total_bytes(self) -> int:
        return sum(self.sizes.values())


# T5 (norm="rms") at fp16, as transformers runs it: the RMSNorms, the feed-forward
# output projections (T5's `_keep_in_fp32_modules = ["wo"]`) and so the residual
# stream they add to stay fp32 (T5 v1.1 / mT5 overflow fp16 there). Node names of
# the traced graphs: ".../ffn_block/norm/Pow", ".../ffn/fc2/MatMul", ".../self_block/Add".
FP16_KEPT_FP32_T5 = re.compile(r"(^|/)[a-z_]*norm(_\d+)?/|/ffn/fc2/|_block(_\d+)?/Add(_\d+)?$")


def _fp16_kept_nodes(model: Any, cfg: ModelConfig) -> list[str]:
    """Names of the nodes the fp16 graph keeps fp32 beyond FP16_KEPT_FP32's op types."""
    if cfg.norm != "rms":
        return []
    return [node.name for node in model.graph.node if FP16_KEPT_FP32_T5.search(node.name)]


def _drop_cast_round_trips(model: Any) -> None:
    """Where the converter casts a kept-fp32 node's output to fp16 and back to fp32
    for the next kept-fp32 node, that node reads the fp32 value itself (the round
    trip would round the residual stream and the RMSNorm variance to fp16)."""
    import onnx

    graph = model.graph
    producers = {out: node for node in graph.node for out in node.output}

    def cast_to(node: Any) -> int | None:
        if node.op_type != "Cast":
            return None
        return next((a.i for a in node.attribute if a.name == "to"), None)

    outputs = {out.name for out in graph.output}
    renames: dict[str, str] = {}
    dropped: list[Any] = []
    for node in graph.node:
        if cast_to(node) != onnx.TensorProto.FLOAT:
            continue
        first = producers.get(node.input[0])
        if first is None or cast_to(first) != onnx.TensorProto.FLOAT16:
            continue
        source = producers.get(first.input[0])
        if source is None or not source.output[0].endswith("_cast_to_fp16"):
            continue  # only the converter's own casts (their input is fp32)
        if node.output[0] in outputs:  # a graph output (log_probs): cast from fp32 itself
            node.input[0] = first.input[0]
            continue
        renames[node.output[0]] = first.input[0]
        dropped.append(node)
    for node in dropped:
        graph.node.remove(node)
    for node in graph.node:
        for i, name in enumerate(node.input):
            if name in renames:
                node.input[i] = renames[name]
    used = {name for node in graph.node for name in node.input} | outputs
    for node in [n for n in graph.node if cast_to(n) == onnx.TensorProto.FLOAT16
                 and n.output[0] not in used]:
        graph.node.remove(node)


def _convert_fp16(src: Path, dst: Path, cfg: ModelConfig) -> None:
    import onnx
    from onnxruntime.transformers.float16 import convert_float_to_float16

    model = onnx.load(str(src))
    # Values beyond fp16's range (the attention mask's fill) are clamped by the
    # converter; log_probs stay fp32 so scores are summed without fp16 rounding.
    model = convert_float_to_float16(model, keep_io_types=["log_probs"],
                                     op_block_list=FP16_KEPT_FP32,
                                     node_block_list=_fp16_kept_nodes(model, cfg))
    if cfg.norm == "rms":
        _drop_cast_round_trips(model)
    _unique_node_names(model)
    onnx.save(model, str(dst))


def _unique_node_names(model: Any) -> None:
    """onnxruntime 1.31's converter adds its cast after a value once per consumer it
    keeps at fp32 (mT5's untied embedding: two), each with the same node and output
    name, and onnxruntime's loader refuses a name defined twice: a node that repeats
    an earlier one (same op, inputs, attributes and outputs) is dropped, and a node
    name still taken gets a suffix."""
    graph = model.graph
    seen: dict[tuple[str, ...], Any] = {}
    for node in list(graph.node):
        key = (node.op_type, node.domain, *node.input, "|", *node.output, "|",
               *(a.SerializeToString().hex() for a in node.attribute))
        if key in seen:
            graph.node.remove(node)
        else:
            seen[key] = node
    names: Counter[str] = Counter()
    for node in graph.node:
        if node.name:
            names[node.name] += 1
            if names[node.name] > 1:
                node.name = f"{node.name}_{names[node.name] - 1}"


def _graph_dtypes(path: Path) -> dict[str, str]:
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    return {v.name: onnx.helper.tensor_dtype_to_np_dtype(v.type.tensor_type.elem_type).name
            for v in [*graph.input, *graph.output]}


def _readable_like_a_new_dir(path: Path) -> None:
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o777 & ~umask)


def _exporter_version() -> str:
    try:
        return metadata.version("seq2serve")
    except metadata.PackageNotFoundError:
        return "unknown"


def export(source_dir: str | Path, output_dir: str | Path, *, precision: str = "fp32",
           name: str | None = None, opset: int = 17, progress: bool = True,
           attention: str = DEFAULT_ATTENTION, shortlist_from: str | Path | None = None,
           shortlist: ShortlistSettings | None = None,
           shortlist_default: bool = False, task: str | None = None,
           ignore_generation_keys: Sequence[str] = (),
           for_provider: str | None = None, revision: str | None = None) -> ExportReport:
    """Export SOURCE to OUTPUT_DIR; raises SourceError/ExportError listing problems.
    attention: "fused" (ONNX Runtime's fused operators, package format 7) or
    "plain" (the traced chain of standard operators, format 6).
    shortlist_from: training data (a corpus directory with train.src/train.tgt, or
    a mix's directory whose corpus.json lists its parts) to learn a vocabulary
    shortlist from (package format 8, model/package/shortlist.py), with `shortlist`'s
    settings, used by default when `shortlist_default`.
    task: the package's task ("summarize", "translate" or "translate:SRC-TGT";
    model/families/tasks.py), overriding the one the folder says (a folder that says
    none, or several, needs it).
    name: the package's model name; by default the source's, with the precision
    after it where that is not fp32 (`default_name`), so that the fp32 and int8
    packages of one folder can be served side by side.
    ignore_generation_keys: generation keys of a Hugging Face folder that change
    generate()'s tokens and that the package does not apply
    (families/generation_keys.py): export refuses the folder naming them unless
    they are listed here, and the manifest's generation.ignored_keys lists them.
    for_provider: a device provider the package must run on whole ("cuda"): options
    it cannot run are refused before anything is traced (`device_problems`), and the
    written package's every node must have a kernel there (model/package/placement.py).
    revision: for a hub id, the branch, tag or commit to read (None: main); refused
    for a local folder. The manifest's exporter.source.hub records it and the commit.

    The steps, each a function below: check the request and load the source, trace
    the fp32 graphs, check them and tokenize the samples, verify fp32 against
    PyTorch, write the precision's graphs (and the shortlist), verify them, write
    the manifest; the package appears at OUTPUT_DIR only whole."""
    import torch

    source_dir, output_dir = Path(source_dir), Path(output_dir)
    settings = shortlist or ShortlistSettings()
    source = _checked_source(source_dir, output_dir, precision, attention, settings,
                             shortlist_from, shortlist_default, task,
                             tuple(ignore_generation_keys), for_provider, revision)
    steps = tqdm(total=5, desc="export", unit="step", disable=not progress, file=sys.stderr)
    output_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{output_dir.name}.", dir=output_dir.parent))
    grad_was = torch.is_grad_enabled()
    torch.set_grad_enabled(False)  # restored below: export must not change the caller's mode
    try:
        model = source.model.float().eval()
        fp32_dir = tmp / "fp32"
        fp32_dir.mkdir()
        steps.set_postfix_str("tracing graphs")
        _trace(model, fp32_dir, opset, attention)
        steps.update()

        steps.set_postfix_str("checking graphs")
        tokenizer, samples = _check_graphs(source, model, tmp, fp32_dir)
        steps.update()

        if precision != "int8" and model.cfg.tie_output:
            from seq2serve.export.onnx_graphs import tie_output_projection

            tie_output_projection(fp32_dir / DECODER_FILE)
        steps.set_postfix_str("ONNX Runtime vs PyTorch")
        fp32 = _verify_fp32(model, fp32_dir, samples)
        steps.update()

        steps.set_postfix_str(f"precision {precision}")
        _write_precision(model, tmp, fp32_dir, precision, opset)
        shortlist_spec = None
        if shortlist_from is not None:
            steps.set_postfix_str("vocabulary shortlist")
            shortlist_spec = _write_shortlist(tmp, model, tokenizer, Path(shortlist_from),
                                              settings, precision, opset)
        deviation = _verify_precision(model, tmp, samples, precision, fp32)
        shutil.rmtree(fp32_dir)
        steps.update()

        steps.set_postfix_str("writing manifest")
        manifest = _manifest(tmp, source, model.cfg, name=name, precision=precision,
                             opset=opset, attention=attention, shortlist_spec=shortlist_spec,
                             shortlist_default=shortlist_default, deviation=deviation,
                             fp32=fp32)
        manifest.files = {p.name: sha256_file(p) for p in sorted(tmp.iterdir()) if p.is_file()}
        (tmp / MANIFEST).write_text(manifest.to_json(), encoding="utf-8")
        package = load_package(tmp)  # the loader the server uses must accept what we wrote
        if for_provider is not None:
            _check_placement(package, for_provider)
        _readable_like_a_new_dir(tmp)  # mkdtemp made it 0700; a package is shared data
        os.rename(tmp, output_dir)
        steps.update()
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        torch.set_grad_enabled(grad_was)
        steps.close()
    sizes = {p.name: p.stat().st_size for p in sorted(output_dir.iterdir())}
    return ExportReport(output_dir, precision, sizes, deviation.as_dict(), fp32.as_dict())


def _checked_source(source_dir: Path, output_dir: Path, precision: str, attention: str,
                    settings: ShortlistSettings, shortlist_from: str | Path | None,
                    shortlist_default: bool, task: str | None = None,
                    ignored: tuple[str, ...] = (), for_provider: str | None = None,
                    revision: str | None = None) -> Source:
    """The loaded source, or SourceError listing every problem of the request (the
    CTranslate2 converters' rule: collect all, then fail once)."""
    problems: list[str] = []
    if precision not in PRECISIONS:
        problems.append(f"--precision must be one of {PRECISIONS}, got {precision!r}")
    if attention not in ATTENTIONS:
        problems.append(f"--attention must be one of {ATTENTIONS}, got {attention!r}")
    if output_dir.exists():
        problems.append(f"{output_dir}: output directory exists (choose a new one)")
    if shortlist_from is not None:
        problems += settings.problems()
        if not Path(shortlist_from).is_dir():
            problems.append(f"--shortlist-from {shortlist_from}: not a directory")
    elif shortlist_default:
        problems.append("--shortlist-default needs --shortlist-from")
    asked: TaskRequest | None = None
    if task is not None:
        try:
            asked = TaskRequest.parse(task)
        except ValueError as e:
            problems.append(str(e))
    source: Source | None = None
    try:
        source = load_source(source_dir, asked, revision)
    except SourceError as e:
        problems.extend(e.problems)
    if source is not None and attention == "fused" and source.model.cfg.decoder_head_dim % 8:
        # ONNX Runtime's GroupQueryAttention takes heads of a multiple of 8 only.
        problems.append(f"--attention fused needs a head size that is a multiple of 8, "
                        f"this model's is {source.model.cfg.decoder_head_dim}: export it "
                        f"with --attention plain")
    if for_provider is not None:
        problems += device_problems(for_provider, precision, attention,
                                    None if source is None else source.model.cfg)
    problems += [f"--ignore-generation-key {key}: not a key of transformers' "
                 "GenerationConfig" for key in ignored if key not in KNOWN]
    if source is not None and str(source.origin.get("format", "")).startswith("huggingface"):
        source = _generation_keys(source, ignored, problems)
    if problems or source is None:
        raise SourceError(source_dir, problems)
    return source


def device_problems(for_provider: str, precision: str, attention: str,
                    cfg: ModelConfig | None) -> list[str]:
    """What `--for PROVIDER` cannot run of the options asked, each with its reason:
    the provider's kernel table (model/package/kernels.py) for the precision's and
    the fused attention's operators, and the kernels that refuse an input."""
    if for_provider not in placement.PROVIDERS:
        return [f"--for must be one of {', '.join(placement.PROVIDERS)}, got {for_provider!r}"]
    provider = placement.PROVIDERS[for_provider]
    table = kernels.load(provider)
    problems = []
    if precision == "int8" and not table.registrations("com.microsoft", "MatMulIntegerToFloat"):
        problems.append(f"--precision int8 cannot run on {for_provider}: {provider} has no "
                        "kernel for its com.microsoft MatMulIntegerToFloat (ONNX Runtime would "
                        "run every one on the CPU); export --precision fp16")
    if attention == "fused":
        dtype = {"fp32": "float", "fp16": "float16"}.get(precision, "float")
        takes = {t for k in table.registrations("com.microsoft", "GroupQueryAttention")
                 for t in k.types.get("T", ())}
        if dtype not in takes:
            problems.append(f"--attention fused at {precision} cannot run on {for_provider}: "
                            f"{provider}'s GroupQueryAttention takes {', '.join(sorted(takes))} "
                            f"only (the decoder's self-attention would run on the CPU, copying "
                            f"the cache each step); export --precision fp16, or --attention "
                            f"plain")
        refused = placement.REFUSED_INPUTS.get((provider, "com.microsoft", "GroupQueryAttention"))
        if cfg is not None and cfg.positions == "relative" and refused is not None:
            problems.append(f"--attention fused cannot run this model on {for_provider}: its "
                            f"relative position bias is GroupQueryAttention's attention_bias, "
                            f"and {refused[1].removeprefix('its ')}; export --attention plain")
    return problems


def _check_placement(package: ModelPackage, for_provider: str) -> None:
    """ExportError unless every node of the written package runs on the provider."""
    found = placement.check_package(package, placement.PROVIDERS[for_provider])
    if not found.ok:
        raise ExportError("\n".join(placement.report(found, package.manifest.precision,
                                                     every_node=False)))


def _generation_keys(source: Source, ignored: tuple[str, ...],
                     problems: list[str]) -> Source:
    """The source with its folder's refused generation keys (those that change
    generate()'s tokens and the package does not apply) ignored where `ignored`
    names them; a problem naming each other one."""
    cfg = source.model.cfg
    refused = refused_keys(source.hf_generation, cfg.decoder_start_id, cfg.eos_id)
    problems += [f"generation settings: {why} (export anyway, without it, with "
                 f"--ignore-generation-key {key})"
                 for key, why in sorted(refused.items()) if key not in ignored]
    return dataclasses.replace(source, generation=without_keys(
        source.generation, tuple(key for key in refused if key in ignored)))


def _trace(model: Any, fp32_dir: Path, opset: int, attention: str) -> None:
    from seq2serve.export.onnx_graphs import export_graphs

    if attention == DEFAULT_ATTENTION:  # export_graphs' own default
        export_graphs(model, fp32_dir, opset)
    else:
        export_graphs(model, fp32_dir, opset, fused=attention == "fused")


def _check_graphs(source: Source, model: Any, tmp: Path,
                  fp32_dir: Path) -> tuple[Any, list[list[int]]]:
    """ONNX's full check of each graph; the package's tokenizer files written; the
    tokenizer and the sample sources every verification decodes."""
    import onnx

    for graph in GRAPH_FILES:
        onnx.checker.check_model(str(fp32_dir / graph), full_check=True)
    tokenizer = source.write_tokenizer(tmp)
    # A multilingual model's samples are in its first language.
    language = next(iter(source.languages.tokens.values())) if source.languages else None
    samples = [tokenizer.encode(t, language)[: model.cfg.max_positions] for t in SAMPLE_TEXTS]
    return tokenizer, samples


def _verify_fp32(model: Any, fp32_dir: Path, samples: list[list[int]]) -> Deviation:
    """ONNX Runtime against PyTorch at fp32, or ExportError. One step on sample inputs
    must match tightly; along a 32-step greedy path the difference may grow in a
    random-weight model (reported, not failed on): what matters there is that ONNX
    Runtime would choose the same tokens."""
    from seq2serve.export.verify import compare

    fp32 = compare(model, fp32_dir / ENCODER_FILE, fp32_dir / DECODER_FILE, samples)
    problems = []
    if not fp32.log_probs <= FP32_LOG_PROB_TOLERANCE:
        problems.append(f"log-prob deviation {fp32.log_probs:.3g} exceeds "
                        f"{FP32_LOG_PROB_TOLERANCE:g}")
    if not fp32.flip_margin <= FP32_LOG_PROB_TOLERANCE:
        problems.append(
            f"greedy decoding differs between ONNX Runtime and PyTorch: at "
            f"{fp32.argmax_flips} step(s) ONNX Runtime prefers another token by up to "
            f"{fp32.flip_margin:.3g} (more than the tolerance {FP32_LOG_PROB_TOLERANCE:g})")
    if problems:
        raise ExportError("verification failed:\n  " + "\n  ".join(problems))
    return fp32


def _write_precision(model: Any, tmp: Path, fp32_dir: Path, precision: str,
                     opset: int) -> None:
    """The encoder and decoder at `precision`, and the cache graphs for them."""
    from seq2serve.export.onnx_graphs import write_cache_graphs
    from seq2serve.export.quantize import quantize_int8
    from seq2serve.export.verify import check_cache_graphs

    for graph in (ENCODER_FILE, DECODER_FILE):
        if precision == "fp32":
            shutil.move(fp32_dir / graph, tmp / graph)
        elif precision == "int8":
            quantize_int8(fp32_dir / graph, tmp / graph)
        else:
            _convert_fp16(fp32_dir / graph, tmp / graph, model.cfg)
    # The reorder and move graphs take the decoder's cache as it is: fp16 in fp16.
    cache_dtype = _graph_dtypes(tmp / DECODER_FILE)["self_k.0"]
    write_cache_graphs(tmp, model.cfg.decoder_layers, cache_dtype, opset,
                       vocab=model.cfg.tgt_vocab_size)
    try:
        check_cache_graphs(tmp)
    except ValueError as e:
        raise ExportError(f"verification failed: {e}") from None


def _verify_precision(model: Any, tmp: Path, samples: list[list[int]], precision: str,
                      fp32: Deviation) -> Deviation:
    """The written graphs' deviation from PyTorch (fp32's own at fp32); ExportError
    when they produce NaN or inf."""
    from seq2serve.export.verify import check_fp16, compare

    deviation = fp32
    if precision == "int8":
        deviation = compare(model, tmp / ENCODER_FILE, tmp / DECODER_FILE, samples)
    elif precision == "fp16":
        deviation = check_fp16(model, tmp / ENCODER_FILE, tmp / DECODER_FILE, samples)
    if not deviation.finite:
        raise ExportError(f"{precision} graphs produce NaN or inf log-probabilities")
    return deviation


def default_name(source_name: str, precision: str) -> str:
    """A package's model name when `--name` gives none: the source's, and its
    precision where that is not fp32 ("bart-large-cnn-int8"): one server serves each
    name once, so one folder's packages at two precisions need two names."""
    return source_name if precision == "fp32" else f"{source_name}-{precision}"


def _manifest(tmp: Path, source: Source, cfg: ModelConfig, *, name: str | None,
              precision: str, opset: int, attention: str,
              shortlist_spec: ShortlistSpec | None, shortlist_default: bool,
              deviation: Deviation, fp32: Deviation) -> Manifest:
    """The package's manifest (its files' hashes are added by the caller), with the
    tokenizer's files (written beside the graphs by `_check_graphs`) listed."""
    dtypes = {name: dtype for graph in GRAPH_FILES
              for name, dtype in _graph_dtypes(tmp / graph).items()}
    generation = source.generation
    if shortlist_spec is not None:
        shortlist_dtypes = _graph_dtypes(tmp / SHORTLIST_DECODER_FILE)
        shortlist_spec = dataclasses.replace(shortlist_spec, decoder=shortlist_graph(
            cfg.decoder_layers, opset, shortlist_dtypes))
        generation = dataclasses.replace(generation, shortlist=shortlist_default)
    return Manifest(
        name=name or default_name(source.name, precision),
        task=source.task,
        source_language=source.source_language,
        target_language=source.target_language,
        config=cfg,
        special_tokens=SpecialTokens.of(cfg) if source.suppress is None
        else dataclasses.replace(SpecialTokens.of(cfg), suppress=source.suppress),
        tokenizer=source.tokenizer_files(),
        generation=generation,
        precision=precision,
        # Longer inputs were never seen in training: summarization refuses them
        # (or truncates on request), translation splits them into sentences.
        max_source_length=min(cfg.max_positions,
                              source.trained_source_length or cfg.max_positions),
        graphs=standard_graphs(cfg.decoder_layers, opset, dtypes),
        exporter={"name": "seq2serve", "version": _exporter_version(),
                  "source": source.origin, "deviation": deviation.as_dict(),
                  "fp32_deviation": fp32.as_dict()},
        format_version=format_version(attention, shortlist_spec is not None),
        attention=attention if shortlist_spec is not None else None,
        shortlist=shortlist_spec,
        input_prefix=source.input_prefix,
        languages=source.languages,
    )


def _write_shortlist(tmp: Path, model: Any, tokenizer: Any, data: Path,
                     settings: ShortlistSettings, precision: str, opset: int) -> ShortlistSpec:
    """Learn the lexical table from `data`'s training pairs, write shortlist.npz and
    decoder_shortlist.onnx (from the finished decoder.onnx) into `tmp`, and check
    the new graph against the full decoder (and PyTorch, for fp32)."""
    import onnx

    from seq2serve.export.shortlist_graph import shortlist_decoder
    from seq2serve.export.verify import check_shortlist
    from seq2serve.model.package import shortlist as lexical

    cfg = model.cfg
    try:
        files = lexical.training_pairs(data)
    except (ValueError, OSError, KeyError) as e:
        raise ExportError(f"--shortlist-from: {e}") from None
    special = sorted({cfg.pad_id, cfg.eos_id, cfg.unk_id, cfg.bos_id, cfg.decoder_start_id})
    pairs = ((tokenizer.encode(s), tokenizer.encode_target(t))
             for s, t in lexical.read_pairs(files))
    table = lexical.learn_table(pairs, cfg.src_vocab_size, cfg.tgt_vocab_size, special)
    try:
        graph = shortlist_decoder(onnx.load(str(tmp / DECODER_FILE)))
    except ValueError as e:
        raise ExportError(f"shortlist decoder: {e}") from None
    onnx.save(graph.model, str(tmp / SHORTLIST_DECODER_FILE))
    projection = lexical.Projection(graph.weight, graph.bias)
    lexical.save(tmp / SHORTLIST_FILE, table, projection)
    try:
        deviation = check_shortlist(tmp, projection, SHORTLIST_TOLERANCE[precision],
                                    model if precision == "fp32" else None)
    except ValueError as e:
        raise ExportError(f"verification failed: {e}") from None
    return ShortlistSpec(decoder=shortlist_graph(cfg.decoder_layers, opset),
                         first=settings.first, best=settings.best,
                         threshold=settings.threshold,
                         learned_from=f"{data} ({len(files)} training file pairs, p(t | s); "
                         f"verified: log-prob deviation {deviation:.2e})")


# -- command line ---------------------------------------------------------------

def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", type=Path,
                        help="a seq2serve checkpoint directory, a Hugging Face model "
                        "directory (config.json, model.safetensors or pytorch_model.bin, the "
                        f"tokenizer's files) of one of the families {families_help()}, or a "
                        "Hugging Face hub id (ORG/NAME: downloaded into the hub's cache, or "
                        "read from it with HF_HUB_OFFLINE=1)")
    parser.add_argument("output", type=Path, help="the package directory to create "
                        "(must not exist)")
    parser.add_argument("--revision", metavar="REV",
                        help="for a hub id: the branch, tag or commit to read (default "
                        "main), recorded in the manifest beside the commit read; refused "
                        "for a local folder")
    parser.add_argument("--precision", choices=PRECISIONS, default="fp32",
                        help="fp32 (default), fp16 (for CUDA) or int8 (dynamic "
                        "quantization, for CPU)")
    parser.add_argument("--name", help="model name in the manifest (default: the source "
                        "directory's or hub repository's name, with the precision after it "
                        "where that is not fp32: bart-large-cnn-int8)")
    parser.add_argument("--task", metavar="TASK", help="the package's task: summarize, "
                        "translate, or translate:SRC-TGT (translate:en-fr: the folder's "
                        "task_specific_params entry for that pair, or the pair of a folder "
                        "that names none); by default the one task the folder names "
                        "(task_specific_params), refused with the list where it names "
                        "several. The entry's parameters are the package's defaults, as "
                        "transformers' pipeline applied them")
    parser.add_argument("--opset", type=int, default=17, help="ONNX opset (default 17)")
    parser.add_argument("--attention", choices=ATTENTIONS, default=DEFAULT_ATTENTION,
                        help="fused: ONNX Runtime's MultiHeadAttention and GroupQueryAttention, "
                        "the cache written in place (package format 7); plain: standard "
                        f"ONNX operators only (format 6). Default {DEFAULT_ATTENTION}")
    parser.add_argument("--shortlist-from", type=Path, metavar="DATA",
                        help="learn a vocabulary shortlist (package format 8) from DATA's "
                        "training pairs: a corpus directory (train.src, train.tgt) or a mix "
                        "whose corpus.json lists its parts")
    defaults = ShortlistSettings()
    parser.add_argument("--shortlist-first", type=int, default=defaults.first,
                        help="candidates: the N most frequent target pieces (default "
                        f"{defaults.first})")
    parser.add_argument("--shortlist-best", type=int, default=defaults.best,
                        help="candidates: each source piece's N best translations (default "
                        f"{defaults.best})")
    parser.add_argument("--shortlist-threshold", type=float, default=defaults.threshold,
                        help="... scoring at least this (p(t | s), default "
                        f"{defaults.threshold:g})")
    parser.add_argument("--shortlist-default", action="store_true",
                        help="decode over the shortlist unless a request says otherwise "
                        "(only where `seq2serve shortlist gate` passed)")
    parser.add_argument("--ignore-generation-key", action="append", default=[],
                        metavar="KEY", dest="ignore_generation_keys",
                        help="export a Hugging Face folder whose generation settings set KEY "
                        "(a GenerationConfig key that changes generate()'s tokens and that "
                        "seq2serve does not apply: export names them) without applying it; "
                        "the manifest and ListModels say so. Repeatable")
    parser.add_argument("--for", dest="for_provider", choices=sorted(placement.PROVIDERS),
                        help="a device the package must run on whole: refuse options it "
                        "cannot run (int8 on cuda; fused attention at fp32, or with T5's "
                        "position bias) and check that its kernels take every node of the "
                        "written graphs (seq2serve check-package)")
    parser.add_argument("--quiet", action="store_true", help="no progress display")


def run(args: argparse.Namespace) -> int:
    try:
        report = export(args.source, args.output, precision=args.precision, name=args.name,
                        opset=args.opset, progress=not args.quiet,
                        # Namespaces built without the option (older callers) export plain.
                        attention=getattr(args, "attention", DEFAULT_ATTENTION),
                        shortlist_from=getattr(args, "shortlist_from", None),
                        shortlist=ShortlistSettings(
                            getattr(args, "shortlist_first", 100),
                            getattr(args, "shortlist_best", 100),
                            getattr(args, "shortlist_threshold", 0.0)),
                        shortlist_default=getattr(args, "shortlist_default", False),
                        task=getattr(args, "task", None),
                        ignore_generation_keys=getattr(args, "ignore_generation_keys", ()),
                        for_provider=getattr(args, "for_provider", None),
                        revision=getattr(args, "revision", None))
    except (SourceError, ExportError) as e:
        print(f"seq2serve export: error: {e}", file=sys.stderr)
        return 1
    print(f"wrote {report.package} ({report.precision}, {report.total_bytes / 2**20:.1f} MiB)")
    for file, size in report.sizes.items():
        print(f"  {file:<16} {size / 2**20:8.2f} MiB")
    dev = report.deviation
    print(f"  deviation vs PyTorch: log-probs {dev['log_probs']:.2e} (along PyTorch's greedy "
          f"path {dev['path_log_probs']:.2e}), encoder {dev['encoder']:.2e}; greedy on "
          f"{dev['greedy_rows']} samples: {dev['argmax_flips']} argmax flip(s), largest "
          f"margin {dev['flip_margin']:.2e}")
    return 0
