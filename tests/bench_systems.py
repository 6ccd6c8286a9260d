"""What the engine benchmarks' tests share: every system of a prepared workload
(our fp32 and int8 packages, transformers' generate(), CTranslate2 fp32 and int8)
decodes exact lengths, and the fp32 systems agree on the greedy tokens."""

from __future__ import annotations

from typing import Any

from seq2serve.bench.engine import systems


def assert_systems_agree(models: Any, sources: list[list[int]], new_tokens: int = 7) -> None:
    every = [systems.Seq2Serve(models.packages["fp32"], 1),
             systems.Seq2Serve(models.packages["int8"], 1),
             systems.Transformers(models.marian, 1),
             systems.CTranslate2(models.ctranslate2, models.marian, "fp32", 1),
             systems.CTranslate2(models.ctranslate2, models.marian, "int8", 1)]
    greedy = {}
    for system in every:
        system.load()
        try:
            for beam in (1, 4):
                out = system.generate(system.prepare(sources), beam, new_tokens)
                assert [len(t) for t in out] == [new_tokens] * len(sources), (system.label,
                                                                              beam)
                if beam == 1:
                    greedy[system.label] = out
        finally:
            system.close()
    # The fp32 systems compute the same model from the same ids: same greedy tokens.
    assert greedy["seq2serve fp32"] == greedy["transformers fp32"] == greedy["ctranslate2 fp32"]
