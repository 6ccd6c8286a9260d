"""`python -m seq2serve.bench` (or `python -m bench` from the repository root)."""

import sys

from seq2serve.bench.harness import main

sys.exit(main())
