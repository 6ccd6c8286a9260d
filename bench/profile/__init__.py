"""Where a decoding's time goes: `python -m seq2serve.bench.profile` (`decoding`):
the encoder, each runner call between steps, Python, ONNX Runtime's operators,
and CTranslate2's whole decoding beside the graphs alone."""
