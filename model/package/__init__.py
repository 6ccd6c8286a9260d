"""The model package format, written by `export` and read by `server`, neither
importing the other: the manifest and its loader (`manifest.py`), the package's
tokenizer (`tokenizer.py`), the vocabulary shortlist tables (`shortlist.py`) and the
session settings every CPU session of a package gets (`session.py`).
"""
