"""The Hugging Face model families the exporter loads (registry.py)."""
