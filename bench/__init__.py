"""Benchmarks (see docs/benchmarks.md).

The peer comparison, `seq2serve bench` / `python -m seq2serve.bench`: this
engine against Hugging Face `generate()` and CTranslate2 on the same inputs and
thread count. `harness` is the command (`configure`/`run`), `workload` builds
the seeded Marian model and its cached conversions, `systems` puts each system
behind one `generate(batch, beam, new_tokens) -> tokens per source` call.

`load.py` (server under concurrent clients) and `quality.py` (scores of
package variants) are stand-alone scripts beside it.
"""
