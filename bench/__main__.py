"""`python -m seq2serve.bench`: `seq2serve bench` (bench/engine/harness.py)."""

import sys

from seq2serve.bench.engine.harness import main

sys.exit(main())
