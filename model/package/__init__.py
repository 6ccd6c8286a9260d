"""The model package format, written by `export` and read by `server`, neither
importing the other: the manifest and its loader (`manifest.py`), the package's
tokenizer (`tokenizer.py`), the vocabulary shortlist tables (`shortlist.py`), the
session settings every CPU session of a package gets and those of CUDA sessions
(`session.py`), and which nodes a provider has no kernel for (`placement.py`, from
ONNX Runtime's kernel table, `kernels.py`).
"""
