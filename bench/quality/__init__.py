"""What a model package translates, through the serving engine:

- `python -m seq2serve.bench.quality` (`score`): a corpus split decoded with each
  package and scored as `seq2serve train --score` does (precision variants side
  by side; the release tooling reads its --json);
- `python -m seq2serve.bench.quality.placeholders`: placeholders and markup of real
  catalogs, with and without protection.
"""
