"""Scoring: greedy decoding over a corpus split, then BLEU/chrF or ROUGE.

Used by the trainer's periodic validation and by `seq2serve train --score`,
whose report holds what a model card needs: the model's scores beside those of
a copy-the-source baseline, the metric signatures, per-kind scores, sample
outputs, the decoding settings and speed. References are the raw target lines
of the corpus, never detokenized ids, so the scores are what a user of the text
would see.
"""

from __future__ import annotations

import json
import os
import platform
import time
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

from seq2serve.model.checkpoint import STATE_FILE, load_checkpoint, load_trainer_state
from seq2serve.model.tokenizer import Tokenizer
from seq2serve.model.train.batching import length_batches, pad_rows, read_split
from seq2serve.model.transformer import Seq2SeqTransformer

TASKS = ("translate", "summarize")
MAIN_SCORE = {"translate": "bleu", "summarize": "rougeL"}
REPORT_FORMAT = "seq2serve-score"
REPORT_VERSION = 1
MAX_LEN_RATIO = 2.0  # generate()'s default length rule, recorded in every report
ROUGE_NAMES = ("rouge1", "rouge2", "rougeL")


def read_corpus_info(data_dir: str | os.PathLike[str]) -> dict[str, Any]:
    path = Path(data_dir) / "corpus.json"
    if not path.is_file():
        raise FileNotFoundError(f"{data_dir}: no corpus.json (run `seq2serve data` first)")
    return json.loads(path.read_text(encoding="utf-8"))


@torch.no_grad()
def generate(model: Seq2SeqTransformer, tokenizer: Tokenizer, sources: list[str],
             max_src_len: int = 256, max_len: int = 128, max_tokens: int = 4096,
             device: str | torch.device = "cpu",
             max_len_ratio: float | None = MAX_LEN_RATIO) -> list[str]:
    """Greedy outputs for `sources`, in input order.

    Outputs stop at `max_len` tokens and, with `max_len_ratio`, at ratio x the
    longest source in the batch + 10: an undertrained model that never emits
    EOS would otherwise make every validation decode all `max_len` steps.
    """
    was_training = model.training
    model.eval()
    ids = tokenizer.encode_batch(sources, max_len=max_src_len)
    outputs: list[str] = [""] * len(sources)
    # Budget covers the source plus the decoder's growing cache, roughly.
    for batch in length_batches([len(x) for x in ids], max(max_tokens // 2, 1)):
        src = torch.from_numpy(pad_rows([ids[i] for i in batch], tokenizer.pad_id)).to(device)
        limit = max_len
        if max_len_ratio is not None:
            limit = min(limit, int(src.shape[1] * max_len_ratio) + 10)
        out = model.greedy(src, src != tokenizer.pad_id, limit).tolist()
        for i, row in zip(batch, out, strict=True):
            outputs[i] = tokenizer.decode(row)
    model.train(was_training)
    return outputs


def score_with_signatures(task: str, hypotheses: list[str],
                          references: list[str]) -> tuple[dict[str, float], dict[str, str]]:
    """`score()` plus, per metric, the string that says how it was computed
    (sacreBLEU's own signature; the rouge-score version and settings)."""
    if task == "translate":
        from sacrebleu.metrics import BLEU, CHRF

        scores, signatures = {}, {}
        for name, metric in (("bleu", BLEU()), ("chrf", CHRF())):
            scores[name] = metric.corpus_score(hypotheses, [references]).score
            signatures[name] = str(metric.get_signature())  # known only after scoring
        return scores, signatures
    if task == "summarize":
        from rouge_score import rouge_scorer

        scorer = rouge_scorer.RougeScorer(list(ROUGE_NAMES), use_stemmer=True)
        totals = dict.fromkeys(ROUGE_NAMES, 0.0)
        for hyp, ref in zip(hypotheses, references, strict=True):
            result = scorer.score(ref, hyp)
            for name in ROUGE_NAMES:
                totals[name] += result[name].fmeasure
        n = max(len(hypotheses), 1)
        signature = (f"rouge-score:{_version('rouge-score')}|stemmer:porter|"
                     "mean-of-segment-F1|scale:100")
        return ({name: 100.0 * total / n for name, total in totals.items()},
                dict.fromkeys(ROUGE_NAMES, signature))
    raise ValueError(f"task must be one of {TASKS}, got {task!r}")


def score(task: str, hypotheses: list[str], references: list[str]) -> dict[str, float]:
    """BLEU and chrF (sacreBLEU defaults) for translation; mean ROUGE-1/2/L F1
    (stemmed) for summarization. All on a 0-100 scale."""
    return score_with_signatures(task, hypotheses, references)[0]


def read_kinds(data_dir: str | os.PathLike[str], split: str) -> list[str] | None:
    """The `{split}.kind` lines (sentence, synopsis, ...), or None without the file."""
    path = Path(data_dir) / f"{split}.kind"
    if not path.is_file():
        return None
    lines = path.read_text(encoding="utf-8").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return lines


def sample_indices(n: int, k: int) -> list[int]:
    """`min(k, n)` distinct indices spread evenly over range(n), each the middle of
    its stretch: deterministic, and not all from the head of a split whose order
    groups similar segments."""
    k = max(min(k, n), 0)
    return [(2 * i + 1) * n // (2 * k) for i in range(k)]


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def training_time(directory: Path, meta: dict[str, Any]) -> tuple[float | None, str | None]:
    """Wall-clock seconds of training up to this checkpoint's step, and where the
    number came from: config.json if the trainer recorded it there, else the
    trainer state beside it (resume checkpoints), else the run's log.jsonl line
    for that step (`best/` and `checkpoints/step-*` live inside the run)."""
    for key in ("elapsed_seconds", "training_seconds", "train_seconds"):
        if isinstance(meta.get(key), (int, float)):
            return float(meta[key]), f"config.json:{key}"
    if (directory / STATE_FILE).is_file():
        seconds = load_trainer_state(directory).get("elapsed_seconds")
        if seconds is not None:
            return float(seconds), STATE_FILE
    step = meta.get("step")
    for log in (directory.parent / "log.jsonl", directory.parent.parent / "log.jsonl"):
        if step is None or not log.is_file():
            continue
        for line in log.read_text(encoding="utf-8").splitlines():
            record = json.loads(line) if line.strip() else {}
            if record.get("step") == step and "elapsed_s" in record:
                return float(record["elapsed_s"]), str(log)
    return None, None


def evaluate(checkpoint: str | os.PathLike[str], data_dir: str | os.PathLike[str],
             split: str = "test", max_sentences: int | None = None, max_len: int | None = None,
             max_tokens: int = 4096, device: str = "cpu",
             output: str | os.PathLike[str] | None = None, samples: int = 10,
             kind: str | None = None, reverse: bool = False) -> dict[str, Any]:
    """Score a checkpoint and the copy-the-source baseline on a corpus split.

    `reverse` reads the split backwards (targets as sources: de-en on
    data/ddtp/en-de's test split). `kind` keeps only the segments whose
    `{split}.kind` line is `kind`;
    `max_sentences` then keeps the first that many. With `output`, writes the
    report (JSON) there and the hypotheses, one a line, next to it (`.hyp`).
    """
    directory = Path(checkpoint)
    model, meta, tokenizer = load_checkpoint(directory, device)  # fp32 whatever was stored
    task = meta.get("task") or read_corpus_info(data_dir)["task"]
    args = meta.get("train_args", {})
    sources, references = read_split(data_dir, split)
    if reverse:
        sources, references = references, sources
    kinds = read_kinds(data_dir, split)
    if kinds is not None and len(kinds) != len(sources):
        raise ValueError(f"{data_dir}/{split}.kind has {len(kinds)} lines but the split has "
                         f"{len(sources)} segments")
    lines = list(range(len(sources)))  # 0-based line numbers in the split files
    if kind is not None:
        if kinds is None:
            raise ValueError(f"--kind {kind}: {data_dir} has no {split}.kind file")
        lines = [i for i in lines if kinds[i] == kind]
        if not lines:
            raise ValueError(f"--kind {kind}: no such segments in {data_dir}/{split} "
                             f"(kinds there: {sorted(set(kinds))})")
    lines = lines[:max_sentences] if max_sentences is not None else lines
    sources = [sources[i] for i in lines]
    references = [references[i] for i in lines]
    kinds = [kinds[i] for i in lines] if kinds is not None else None

    max_src_len = args.get("max_src_len", 256)
    max_len = max_len or args.get("max_tgt_len", 128)
    t0 = time.perf_counter()
    hypotheses = generate(model, tokenizer, sources, max_src_len=max_src_len, max_len=max_len,
                          max_tokens=max_tokens, device=device, max_len_ratio=MAX_LEN_RATIO)
    seconds = time.perf_counter() - t0

    model_scores, signatures = score_with_signatures(task, hypotheses, references)
    by_kind: dict[str, Any] = {}
    for name in sorted(set(kinds or [])):
        keep = [i for i, k in enumerate(kinds or []) if k == name]
        refs = [references[i] for i in keep]
        by_kind[name] = {
            "segments": len(keep),
            "model": score(task, [hypotheses[i] for i in keep], refs),
            "copy_source": score(task, [sources[i] for i in keep], refs),
        }
    train_seconds, train_seconds_source = training_time(directory, meta)
    threads = torch.get_num_threads() if str(device).startswith("cpu") else None
    result: dict[str, Any] = {
        "format": REPORT_FORMAT, "format_version": REPORT_VERSION,
        "task": task, "src_lang": meta.get("src_lang"), "tgt_lang": meta.get("tgt_lang"),
        "data": str(data_dir), "split": split, "kind": kind, "segments": len(sources),
        **({"reverse": True} if reverse else {}),
        "checkpoint": {
            "path": str(checkpoint), "step": meta.get("step"),
            "training_seconds": train_seconds, "training_seconds_source": train_seconds_source,
            "trained_with": {"device": args.get("device"), "threads": args.get("threads")},
            "weights_dtype": meta.get("weights", {}).get("dtype", "float32"),
            "parameters": sum(p.numel() for p in model.parameters()),
        },
        "decoding": {
            "method": "greedy", "beam": 1, "max_len": max_len, "max_len_ratio": MAX_LEN_RATIO,
            "max_len_rule": f"stop at EOS or after min({max_len}, int({MAX_LEN_RATIO} x the "
                            "longest source in the batch, in tokens incl. EOS) + 10) tokens",
            "max_src_len": max_src_len, "max_tokens": max_tokens,
        },
        "scores": {
            "model": model_scores,
            "copy_source": score(task, sources, references),  # the hypothesis is the source
        },
        "signatures": signatures,
        "by_kind": by_kind,
        "speed": {
            "seconds": round(seconds, 3), "segments_per_s": len(sources) / max(seconds, 1e-9),
            "device": str(device), "threads": threads, "cpu": _cpu_name(),
        },
        "environment": {"torch": torch.__version__, "sacrebleu": _version("sacrebleu"),
                        "rouge_score": _version("rouge-score"),
                        "python": platform.python_version()},
        "samples": [
            {"line": lines[i] + 1, "kind": kinds[i] if kinds is not None else None,
             "source": sources[i], "reference": references[i], "hypothesis": hypotheses[i]}
            for i in sample_indices(len(sources), samples)
        ],
    }
    if output is not None:
        out = Path(output)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n",
                       encoding="utf-8")
        out.with_suffix(".hyp").write_text("".join(h + "\n" for h in hypotheses),
                                           encoding="utf-8")
    return result


def format_report(result: dict[str, Any]) -> str:
    """The report of `evaluate()` as text for a terminal (the JSON has it all)."""
    ck, dec, speed = result["checkpoint"], result["decoding"], result["speed"]
    trained = ""
    if ck["training_seconds"] is not None:
        s = int(ck["training_seconds"])
        trained = f", trained {s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"
    n = speed["threads"]
    threads = f", {n} thread{'s' if n != 1 else ''}" if n else ""
    out = [
        f"checkpoint  {ck['path']} (step {ck['step']}{trained}, {ck['weights_dtype']} weights, "
        f"{ck['parameters'] / 1e6:.2f}M parameters)",
        f"data        {result['data']} split {result['split']}"
        + (f" kind {result['kind']}" if result["kind"] else "")
        + f": {result['segments']} segments ({result['task']}"
        + (f" {result['src_lang']}->{result['tgt_lang']}" if result["src_lang"] else "") + ")",
        f"decoding    greedy; {dec['max_len_rule']}; sources truncated to "
        f"{dec['max_src_len']} tokens",
        f"speed       {speed['segments_per_s']:.2f} segments/s ({speed['seconds']:.2f} s on "
        f"{speed['device']}{threads}, {speed['cpu']})",
        "",
    ]
    names = list(result["scores"]["model"])
    rows = [("", "segments", *(f"{n} model/copy" for n in names))]
    rows.append(("all", str(result["segments"]), *(
        f"{result['scores']['model'][n]:.2f} / {result['scores']['copy_source'][n]:.2f}"
        for n in names)))
    for name, entry in result["by_kind"].items():
        rows.append((name, str(entry["segments"]), *(
            f"{entry['model'][n]:.2f} / {entry['copy_source'][n]:.2f}" for n in names)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out += ["  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                      for i, (c, w) in enumerate(zip(row, widths, strict=True))).rstrip()
            for row in rows]
    out.append("")
    for signature in dict.fromkeys(result["signatures"].values()):  # unique, in order
        metrics = ", ".join(n for n, s in result["signatures"].items() if s == signature)
        out.append(f"signature   {metrics}: {signature}")
    if result["samples"]:
        out += ["", f"{len(result['samples'])} samples (evenly spaced over the split):"]
        for sample in result["samples"]:
            kind = f" ({sample['kind']})" if sample["kind"] else ""
            out += [f"  line {sample['line']}{kind}", f"    src: {sample['source']}",
                    f"    ref: {sample['reference']}", f"    hyp: {sample['hypothesis']}"]
    return "\n".join(out)
