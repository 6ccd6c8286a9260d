"""Batching: the scheduler's queue and batch decisions (plain data, no ONNX Runtime)
and the worker thread that runs them on an engine."""
