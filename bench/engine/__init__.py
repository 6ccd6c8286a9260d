"""This engine against its peers, in one run, on the same inputs and thread count:
`seq2serve bench` (or `python -m seq2serve.bench`).

`harness` is the command (`configure`/`run`) and its timing, `workload` builds the
seeded OPUS-MT-shaped Marian model and its cached conversions, `systems` puts
each system behind one `generate(batch, beam, new_tokens) -> tokens per source`
call, `model` is `--model NAME` (a shipped model beside CTranslate2 on the same
checkpoint), `ctranslate2_model` converts a seq2serve checkpoint for CTranslate2
(`python -m seq2serve.bench.engine.ctranslate2_model`), `ort_beam_search` builds
ONNX Runtime's BeamSearch operator over one (`--ort-beam-search`).
"""
