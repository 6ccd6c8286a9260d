"""`python -m seq2serve.bench.quality`: bench/quality/score.py."""

import sys

from seq2serve.bench.quality.score import main

sys.exit(main())
