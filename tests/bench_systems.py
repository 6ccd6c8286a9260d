"""What the engine benchmarks' tests share: every system of a prepared workload
(our fp32 and int8 packages, transformers' generate(), CTranslate2 fp32 and int8)
decodes exact lengths (a forced first token among them), and the fp32 systems agree
on the greedy tokens."""

from __future__ import annotations

from typing import Any

from seq2serve.bench.engine import systems


def assert_systems_agree(models: Any, sources: list[list[int]], new_tokens: int = 7,
                         forced_bos: int | None = None) -> None:
    """forced_bos: every source's first new token (a multilingual model's target
    language), on every system."""
    every = [systems.Seq2Serve(models.packages["fp32"], 1, forced_bos=forced_bos),
             systems.Seq2Serve(models.packages["int8"], 1, forced_bos=forced_bos),
             systems.Transformers(models.marian, 1, forced_bos=forced_bos),
             systems.CTranslate2(models.ctranslate2, models.marian, "fp32", 1,
                                 forced_bos=forced_bos),
             systems.CTranslate2(models.ctranslate2, models.marian, "int8", 1,
                                 forced_bos=forced_bos)]
    greedy = {}
    for system in every:
        system.load()
        try:
            for beam in (1, 4):
                out = system.generate(system.prepare(sources), beam, new_tokens)
                assert [len(t) for t in out] == [new_tokens] * len(sources), (system.label,
                                                                              beam)
                if forced_bos is not None:
                    assert [t[0] for t in out] == [forced_bos] * len(sources), system.label
                if beam == 1:
                    greedy[system.label] = out
        finally:
            system.close()
    # The fp32 systems compute the same model from the same ids: same greedy tokens.
    assert greedy["seq2serve fp32"] == greedy["transformers fp32"] == greedy["ctranslate2 fp32"]
