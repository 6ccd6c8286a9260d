"""`python -m seq2serve.bench.profile`: bench/profile/decoding.py."""

import sys

from seq2serve.bench.profile.decoding import main

sys.exit(main())
