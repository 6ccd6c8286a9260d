"""The numeric engine: ONNX Runtime sessions (runner), decode state, search
strategies and pure decoding functions over arrays."""
