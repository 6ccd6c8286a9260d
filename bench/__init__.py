"""Benchmarks (see docs/benchmarks.md), one subpackage per group:

- `engine`: this engine against its peers (Hugging Face `generate()`, CTranslate2,
  ONNX Runtime's BeamSearch operator) on the same inputs and thread count:
  `seq2serve bench`, `python -m seq2serve.bench`;
- `server`: a real `seq2serve serve` under load (batching modes, the soak, the
  HTTP door beside LibreTranslate), driven by the closed and open loops of
  `server/clients.py`; `server/serving.py` holds the one `free_port` of the
  repository (the tests' too);
- `quality`: what a package translates (`python -m seq2serve.bench.quality`:
  scores of package variants; `quality.placeholders`: placeholders and markup);
- `profile`: where a decoding's time goes (`python -m seq2serve.bench.profile`).

`inputs` is what every group reads: text lines, their token ids, comma lists.
"""
