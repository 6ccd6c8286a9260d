"""Formatting through `/translate` with format=html: the words, and where the spans land.

    python -m seq2serve.bench.quality.spans --models models \
        --sample bench/quality/spans_sample.tsv --json spans.json

For each line of the sample (a pair and an HTML sentence with one to three spans:
bold, italic, links, code) the shipped models serve, this asks the server's
LibreTranslate `/translate` twice: the fragment with format=html, and its plain
text (tags taken off, entities resolved; its code, which HTML keeps as it is, as a
`{k}` placeholder, which the core masks as it masks kept HTML) with format=text.
It reports how many
answers' plain text (the HTML answer with its tags taken off and its entities
resolved) is the plain answer exactly, how many came back `placeholdersRepaired`,
and prints each HTML answer beside the plain one, for the spans to be judged by
hand (bench/quality/spans_verdicts.md holds the verdicts of the last run).
"""

from __future__ import annotations

import argparse
import asyncio
import html
import json
import re
import socket
import sys
import tempfile
import threading
from pathlib import Path

import httpx

from seq2serve.server.app import Server
from seq2serve.server.config import ServerConfig

_TAG = re.compile(r"<[^>]*>")


def plain(fragment: str) -> str:
    """The text of an HTML sentence: its tags taken off, its entities resolved."""
    return html.unescape(_TAG.sub("", fragment))


def plain_with_placeholders(fragment: str) -> tuple[str, list[str]]:
    """The plain text of an HTML sentence whose code (kept as it is: a placeholder the
    model carries, as the core masks it) is written `{k}`, and the code of each k."""
    codes: list[str] = []

    def number(match: re.Match[str]) -> str:
        codes.append(html.unescape(match[1]))
        return f"{{{len(codes) - 1}}}"

    return plain(re.sub(r"<code>(.*?)</code>", number, fragment)), codes


def put_back(text: str, codes: list[str]) -> str:
    """`text` with each `{k}` written as the code it stood for."""
    return re.sub(r"\{(\d+)\}", lambda m: codes[int(m[1])], text)


def read_sample(path: Path) -> list[tuple[str, str]]:
    lines = [line.split("\t", 1) for line in path.read_text(encoding="utf-8").splitlines()
             if line.strip() and not line.startswith("#")]
    return [(pair.strip(), fragment.strip()) for pair, fragment in lines]


def measure(models: Path, sample: list[tuple[str, str]]) -> dict[str, object]:
    pairs = sorted({p for pair, _ in sample for p in _served(pair)})
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for pair in pairs:
            (root / pair).symlink_to((models / pair).resolve())
        config = ServerConfig(models_dir=root, host="127.0.0.1", port=0, metrics_port=0,
                              http_port=_free_port(), provider="cpu", threads=1, cache_mb=0.0,
                              grace_period_s=5.0, drain_delay_s=0.0)
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, daemon=True)
        thread.start()

        def call(coro):  # noqa: ANN001, ANN202
            return asyncio.run_coroutine_threadsafe(coro, loop).result(600)

        async def create() -> Server:
            return Server(config)

        server = call(create())
        call(server.start())
        try:
            assert server.http is not None
            rows = _ask(f"http://127.0.0.1:{server.http.port}", sample)
        finally:
            call(server.stop(5.0))
            loop.call_soon_threadsafe(loop.stop)
            thread.join(10)
    same = sum(r["same_words"] for r in rows)
    repaired = sum(r["repaired"] for r in rows)
    return {"sentences": len(rows), "same_words": same, "repaired": repaired, "rows": rows}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _served(pair: str) -> list[str]:
    """The packages a pair needs: itself, or the two legs through English."""
    source, target = pair.split("-")
    return [pair] if "en" in (source, target) else [f"{source}-en", f"en-{target}"]


def _ask(url: str, sample: list[tuple[str, str]]) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    with httpx.Client(base_url=url, timeout=300) as client:
        for pair, fragment in sample:
            source, target = pair.split("-")
            asked = {"source": source, "target": target}
            formatted = client.post("/translate", json={**asked, "q": fragment,
                                                        "format": "html"}).json()
            reference, codes = plain_with_placeholders(fragment)
            text = client.post("/translate", json={**asked, "q": reference,
                                                   "format": "text"}).json()
            expected = put_back(text["translatedText"], codes)
            answer = formatted["translatedText"]
            rows.append({"pair": pair, "source": fragment, "html": answer,
                         "plain": expected,
                         "same_words": plain(answer) == expected,
                         "repaired": bool(formatted.get("placeholdersRepaired"))})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", type=Path, default=Path("models"))
    parser.add_argument("--sample", type=Path,
                        default=Path(__file__).with_name("spans_sample.tsv"))
    parser.add_argument("--json", type=Path, help="write the record here")
    args = parser.parse_args(argv)
    record = measure(args.models, read_sample(args.sample))
    for row in record["rows"]:  # type: ignore[attr-defined]
        mark = "=" if row["same_words"] else "≠"
        print(f"{row['pair']}  {row['source']}\n   html  {row['html']}\n"
              f"   {mark}text  {row['plain']}")
    print(f"words identical to the plain translation: {record['same_words']} of "
          f"{record['sentences']}; placeholdersRepaired: {record['repaired']}")
    if args.json:
        args.json.write_text(json.dumps(record, indent=2, ensure_ascii=False) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
