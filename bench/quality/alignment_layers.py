"""Which cross-attention places formatting best: the engine's, or another layer's or all's.

    python -m seq2serve.bench.quality.alignment_layers --models models \
        --sample bench/quality/spans_sample.tsv

The engine's alignment is the last decoder layer's cross-attention, averaged over
heads, argmax per target token (`Seq2SeqTransformer.decode_step`). For each sentence
of the sample whose pair one shipped package serves, this translates the plain text
with the package (beam 4, as served), runs the package's PyTorch checkpoint
(models/checkpoints/PAIR) teacher-forced on that translation to get every decoder
layer's and head's cross-attention, and prints the HTML each alignment gives through
core/formatting.py: the engine's, each layer's (heads averaged) and every layer and
head averaged. The spans are then judged by hand (docs/benchmarks.md has the counts).
Needs torch (the training extra).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

import torch

from seq2serve.bench.quality.spans import read_sample
from seq2serve.model.checkpoint import load_checkpoint
from seq2serve.model.package.manifest import load_package
from seq2serve.model.package.tokenizer import package_tokenizer
from seq2serve.model.transformer import Seq2SeqTransformer, causal_mask
from seq2serve.server.assembly import default_limits
from seq2serve.server.core.formatting import split
from seq2serve.server.core.markup import extract
from seq2serve.server.core.options import DecodingOptions
from seq2serve.server.core.placeholders import mask
from seq2serve.server.engine.engine import Engine
from seq2serve.server.engine.runner import RunnerConfig

Strategy = Callable[[torch.Tensor], list[int]]
# Attention (L, H, T + 2, S): row t is the query that chooses target token t (then EOS).
STRATEGIES: dict[str, Strategy] = {
    "first layer": lambda a: a[0].mean(0)[:-1].argmax(-1).tolist(),
    "last layer": lambda a: a[-1].mean(0)[:-1].argmax(-1).tolist(),
    "all averaged": lambda a: a.mean((0, 1))[:-1].argmax(-1).tolist(),
}


def attention(model: Seq2SeqTransformer, source: list[int], target: list[int],
              eos: int) -> torch.Tensor:
    """Every decoder layer's cross-attention, teacher-forced: (L, H, T + 2, S)."""
    src = torch.tensor([source])
    src_mask = torch.ones_like(src)
    tgt_in = torch.tensor([[model.cfg.decoder_start_id, *target, eos]])
    length = tgt_in.shape[1]
    with torch.no_grad():
        memory = model.run_encoder(src, src_mask)
        x = model.embed_target(tgt_in, torch.arange(length).expand(1, length))
        weights = []
        for layer in model.decoder_layers:
            k, v = layer.cross_attn.keys_values(memory)
            x, _, _, w = layer(x, None, None, causal_mask(length), k, v,
                               src_mask.bool()[:, None, None, :], None, None)
            weights.append(w[0])  # (H, T + 2, S)
    return torch.stack(weights)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", type=Path, default=Path("models"))
    parser.add_argument("--sample", type=Path,
                        default=Path(__file__).with_name("spans_sample.tsv"))
    args = parser.parse_args(argv)
    loaded: dict[str, tuple[object, Engine, Seq2SeqTransformer]] = {}
    for pair, fragment in read_sample(args.sample):
        if not (args.models / pair).is_dir():
            continue  # through English: no one package's attention
        if pair not in loaded:
            package = load_package(args.models / pair)
            engine = Engine(package, RunnerConfig(provider="cpu", intra_op_threads=1),
                            default_limits())
            model, _, _ = load_checkpoint(args.models / "checkpoints" / pair)
            loaded[pair] = (package_tokenizer(package), engine, model)
        tokenizer, engine, model = loaded[pair]
        document = extract(fragment)
        formatting = split(mask(document.texts[0]))
        if formatting is None:
            continue
        text = formatting.plain.text
        source = tokenizer.encode(text)  # type: ignore[attr-defined]
        [result] = engine.generate([source], DecodingOptions(return_alignment=True))
        best = result[0]
        output = tokenizer.decode(best.token_ids)  # type: ignore[attr-defined]
        source_spans = tokenizer.source_spans(text)  # type: ignore[attr-defined]
        target_spans = tokenizer.target_spans(best.token_ids)  # type: ignore[attr-defined]
        weights = attention(model, source, best.token_ids,
                            tokenizer.eos_id)  # type: ignore[attr-defined]
        print(f"{pair}  {fragment}")
        alignments = {"engine": list(best.alignment or []),
                      **{name: strategy(weights) for name, strategy in STRATEGIES.items()}}
        for name, alignment in alignments.items():
            links = [(t, source_spans[s]) for t, s in zip(target_spans,
                                                          alignment[:len(target_spans)],
                                                          strict=True)
                     if t[0] < t[1] and source_spans[s][0] < source_spans[s][1]]
            print(f"   {name:13s} {document.render([formatting.restore(output, links).text])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
