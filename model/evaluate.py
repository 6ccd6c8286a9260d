"""Scoring: greedy decoding over a corpus split, then BLEU/chrF or ROUGE.

Used by the trainer's periodic validation and by `seq2serve train --score`
(numbers for model cards). References are the raw target lines of the corpus,
never detokenized ids, so the scores are what a user of the text would see.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

from .batching import length_batches, pad_rows, read_split
from .checkpoint import load_checkpoint
from .tokenizer import Tokenizer
from .transformer import Seq2SeqTransformer

TASKS = ("translate", "summarize")
MAIN_SCORE = {"translate": "bleu", "summarize": "rougeL"}


def read_corpus_info(data_dir: str | os.PathLike[str]) -> dict[str, Any]:
    path = Path(data_dir) / "corpus.json"
    if not path.is_file():
        raise FileNotFoundError(f"{data_dir}: no corpus.json (run `seq2serve data` first)")
    return json.loads(path.read_text(encoding="utf-8"))


@torch.no_grad()
def generate(model: Seq2SeqTransformer, tokenizer: Tokenizer, sources: list[str],
             max_src_len: int = 256, max_len: int = 128, max_tokens: int = 4096,
             device: str | torch.device = "cpu", max_len_ratio: float | None = 2.0) -> list[str]:
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


def score(task: str, hypotheses: list[str], references: list[str]) -> dict[str, float]:
    """BLEU and chrF (sacreBLEU defaults) for translation; mean ROUGE-1/2/L F1
    (stemmed) for summarization. All on a 0-100 scale."""
    if task == "translate":
        import sacrebleu

        return {
            "bleu": sacrebleu.corpus_bleu(hypotheses, [references]).score,
            "chrf": sacrebleu.corpus_chrf(hypotheses, [references]).score,
        }
    if task == "summarize":
        from rouge_score import rouge_scorer

        names = ("rouge1", "rouge2", "rougeL")
        scorer = rouge_scorer.RougeScorer(list(names), use_stemmer=True)
        totals = dict.fromkeys(names, 0.0)
        for hyp, ref in zip(hypotheses, references, strict=True):
            result = scorer.score(ref, hyp)
            for name in names:
                totals[name] += result[name].fmeasure
        n = max(len(hypotheses), 1)
        return {name: 100.0 * total / n for name, total in totals.items()}
    raise ValueError(f"task must be one of {TASKS}, got {task!r}")


def evaluate(checkpoint: str | os.PathLike[str], data_dir: str | os.PathLike[str],
             split: str = "test", max_sentences: int | None = None, max_len: int | None = None,
             max_tokens: int = 4096, device: str = "cpu",
             output: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """Score a checkpoint on a corpus split; optionally write hypotheses and scores."""
    model, meta, tokenizer = load_checkpoint(checkpoint, device)
    task = meta.get("task") or read_corpus_info(data_dir)["task"]
    args = meta.get("train_args", {})
    sources, references = read_split(data_dir, split, max_sentences)
    hypotheses = generate(model, tokenizer, sources,
                          max_src_len=args.get("max_src_len", 256),
                          max_len=max_len or args.get("max_tgt_len", 128),
                          max_tokens=max_tokens, device=device)
    result: dict[str, Any] = {
        "checkpoint": str(checkpoint), "data": str(data_dir), "split": split,
        "sentences": len(sources), "task": task, "decoding": "greedy",
        "step": meta.get("step"), **score(task, hypotheses, references),
    }
    if output is not None:
        out = Path(output)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
        out.with_suffix(".hyp").write_text("".join(h + "\n" for h in hypotheses),
                                           encoding="utf-8")
    return result
