"""Corpora from Debian: DDTP description translations and program-message catalogs."""
