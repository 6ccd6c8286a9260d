"""The soak's quick form: the shipped models under 64 concurrent
callers lose, mix up and batch-change nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from seq2serve.bench.server import soak
from seq2serve.server.config import MAX_BEAM_SIZE

FIXTURE = Path(__file__).parents[1] / "fixtures" / "ddtp_en_test_sample.txt"


def test_classify_names_each_failure() -> None:
    alone = [((1, 2), -1.0), ((3,), -2.0), ((4, 5), -0.5), ((6,), -0.1)]
    together = [((1, 2), -1.0), ((1, 2), -1.0), None, ((6,), -0.2)]
    assert soak.classify(alone, together) == {"lost": 1, "mixed": 1, "batch_dependent": 1,
                                              "right": 1}


@pytest.mark.slow
@pytest.mark.parametrize("batching", ["request", "iteration"])
def test_quick_soak_is_clean(batching: str) -> None:
    texts = soak.read_texts([FIXTURE], 96)
    rows = {"request": "0", "iteration": "256"}[batching]
    report = soak.run(texts, model="en-de", concurrency=64,
                      settings={"max_running_rows": rows, "max_running_beam": str(MAX_BEAM_SIZE)})
    assert (report.lost, report.mixed, report.batch_dependent) == (0, 0, 0)
    assert report.right == report.texts == 96
    assert report.rss_start_mib > 0 and report.rss_peak_mib >= report.rss_end_mib > 0
