"""Placeholders and markup on real catalogs: do they survive, and what does masking cost?

    python -m seq2serve.bench.quality.placeholders --models models --deb-cache data/debs \
        --json placeholders.json

The entries: every message of the program-messages *test* packages (the same
selection and split as `seq2serve data`, so none was trained on) whose English
holds a placeholder, an inline tag, an entity, a URL, an e-mail address, a path,
an escape or a keyboard accelerator (`server/core/placeholders.py` finds them),
taken raw from the `.mo` files: the corpus builder strips markup and
accelerators and drops entries whose placeholders differ, this keeps them all.
Only the test packages' .debs are fetched (about 25 MiB).

Each entry is translated as the server does it (segmented, beam 4), once with
protection (masking, the repair rule, accelerators put back) and once without.
Reported per language pair: entries whose every placeholder is intact (each
source placeholder as often in the output as in the source, by our own count
and by translate-toolkit's `filters.checks`, which nobody here wrote), chrF
against the catalog's own translation (sacreBLEU), how many outputs needed a
repair, and the issue's examples. `--forms` also measures how often the model
copies candidate sentinel forms by themselves (no repair), which is how the
sentinel was chosen.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from seq2serve.bench.quality.score import generate_sorted
from seq2serve.model.package.manifest import load_package
from seq2serve.model.package.tokenizer import package_tokenizer
from seq2serve.server.assembly import default_limits
from seq2serve.server.core import placeholders as ph
from seq2serve.server.core.options import DecodingOptions
from seq2serve.server.core.pieces import join, plan
from seq2serve.server.engine.engine import Engine
from seq2serve.server.engine.runner import RunnerConfig

EXAMPLES = (
    "Hello {{name}}, you have {0} new messages",
    "<b>Warning:</b> the disk is almost full",
    "Save _As…",
    "&Open Recent",
    "Visit https://example.org/help for more information.",
)
CHECKS = ("printf", "xmltags", "variables", "urls", "emails", "escapes", "accelerators",
          "pythonbraceformat")
MAX_CHARS = 1000


@dataclass(frozen=True)
class Entry:
    lang: str
    package: str  # source package
    source: str
    reference: str


def test_entries(deb_cache: Path, langs: tuple[str, ...]) -> Iterator[Entry]:
    """Raw (source, translation) pairs with something to protect, from the test
    packages: fetched into `deb_cache` (reused when there), never installed."""
    from seq2serve.model.data import debian_debs, messages
    from seq2serve.model.data.gettext import CREDIT_IDS, entry_pairs, read_mo

    conf = debian_debs.apt_conf(deb_cache / "apt")
    lists = deb_cache / "apt" / "lists"
    if not any(lists.glob("*_Contents-*")):
        debian_debs.apt_update(conf)
    listing = debian_debs.contents_listing(lists)
    index = debian_debs.packages_index(lists)
    # `seq2serve data`'s default budget: the same packages, so the same test split.
    selection = messages.select(listing, index, 1500, 600 << 20, 40 << 20)
    test = [d for d in selection.debs if messages.split_of_package(d.source) == "test"]
    paths = debian_debs.download(conf, deb_cache, test)
    seen: set[tuple[str, str]] = set()
    for deb in test:
        if deb.package not in paths:
            continue
        for lang, _, data in debian_debs.deb_catalogs(paths[deb.package]):
            if lang not in langs:
                continue
            catalog = read_mo(data)
            for entry in catalog.entries:
                pairs = entry_pairs(entry, catalog.nplurals)
                if isinstance(pairs, str) or entry.msgid in CREDIT_IDS:
                    continue
                for src, tgt in pairs:
                    if (not src.strip() or not tgt.strip() or len(src) > MAX_CHARS
                            or (lang, src) in seen or not ph.mask(src).changed):
                        continue
                    seen.add((lang, src))
                    yield Entry(lang, deb.source, src, tgt)


class Decoder:
    """Texts -> best translations, segmented and decoded as the server does."""

    def __init__(self, package_dir: Path, threads: int, batch: int = 32) -> None:
        package = load_package(package_dir)
        self.language = package.manifest.source_language
        self.limit = package.manifest.max_source_length
        self.tokenizer = package_tokenizer(package)
        self.engine = Engine(package, RunnerConfig(provider="cpu", intra_op_threads=threads),
                             default_limits())
        self.options = DecodingOptions()
        self.batch = batch

    def __call__(self, texts: list[str]) -> list[str]:
        plans = [plan(t, self.language, self.tokenizer.encode, self.limit) for t in texts]
        sources = [p.source_ids for pl in plans for p in pl.pieces]
        results = iter(generate_sorted(self.engine, sources, self.options, self.batch))
        out = []
        for pl in plans:
            nbests = [next(results) for _ in pl.pieces]
            out.append(join(pl, nbests, 1, self.tokenizer.decode)[0].text)
        return out


def protected(decode: Callable[[list[str]], list[str]],
              texts: list[str]) -> tuple[list[str], list[bool]]:
    masked = [ph.mask(t) for t in texts]
    restored = [ph.restore(m, o) for m, o in zip(masked, decode([m.text for m in masked]),
                                                   strict=True)]
    return [r.text for r in restored], [r.repaired for r in restored]


def intact(source: str, output: str) -> bool:
    """Every placeholder of the source as often in the output (accelerators: once)."""
    bare, accelerator = ph.split_accelerator(source)
    spans = ph.find(bare)
    if any(output.count(s.text) < bare.count(s.text) for s in spans):
        return False
    wanted = {s.text: bare.count(s.text) for s in spans}
    if any(output.count(text) != n for text, n in wanted.items()
           if not any(text in other and text != other for other in wanted)):
        return False
    return accelerator is None or _accelerators(output, accelerator.marker) == 1


def _accelerators(text: str, marker: str) -> int:
    if marker == "&":
        return len(ph._AMP_ACCEL.findall(text))
    return len(re.findall(r"_(?=[^\W\d_])", text))


def toolkit_passes(source: str, output: str) -> bool:
    """translate-toolkit's own placeholder checks, all of them passing."""
    from translate.filters import checks

    checker = checks.StandardChecker(checks.CheckerConfig(accelmarkers=["&", "_"]))
    for name in CHECKS:
        try:
            getattr(checker, name)(source, output)
        except checks.FilterFailure:
            return False
    return True


def sentinel_copy_rate(decode: Callable[[list[str]], list[str]], texts: list[str],
                       form: Callable[[int], str]) -> float:
    """The share of texts whose every sentinel, written as `form(k)`, the model
    copies exactly once by itself."""
    masked = [ph.mask(t) for t in texts]
    sources = [ph.SENTINEL.sub(lambda m: form(int(m[1])), m.text) for m in masked]
    ok = 0
    for m, out in zip(masked, decode(sources), strict=True):
        ok += all(out.count(form(k)) == 1 for k in range(len(m.spans)))
    return 100.0 * ok / max(len(texts), 1)


FORMS: dict[str, Callable[[int], str]] = {
    "{k}": lambda k: f"{{{k}}}",
    "%k (from 1)": lambda k: f"%{k + 1}",
    "@k@": lambda k: f"@{k}@",
    "<xk/>": lambda k: f"<x{k}/>",
    "PHk": lambda k: f"PH{k}",
}


def measure(package_dir: Path, entries: list[Entry], threads: int,
            forms: bool) -> dict[str, object]:
    from sacrebleu.metrics import CHRF

    decode = Decoder(package_dir, threads)
    sources = [e.source for e in entries]
    references = [e.reference for e in entries]
    start = time.perf_counter()
    plain = decode(sources)
    masked, repaired = protected(decode, sources)
    seconds = time.perf_counter() - start
    chrf = CHRF()
    record: dict[str, object] = {
        "package": str(package_dir), "entries": len(entries),
        "packages": len({e.package for e in entries}),
        "intact_protected": _share(intact(s, o) for s, o in zip(sources, masked, strict=True)),
        "intact_unprotected": _share(intact(s, o) for s, o in zip(sources, plain, strict=True)),
        "toolkit_checks_protected": _share(toolkit_passes(s, o)
                                           for s, o in zip(sources, masked, strict=True)),
        "toolkit_checks_unprotected": _share(toolkit_passes(s, o)
                                             for s, o in zip(sources, plain, strict=True)),
        "references_passing_toolkit_checks": _share(
            toolkit_passes(s, r) for s, r in zip(sources, references, strict=True)),
        "chrf_protected": round(chrf.corpus_score(masked, [references]).score, 2),
        "chrf_unprotected": round(chrf.corpus_score(plain, [references]).score, 2),
        "chrf_signature": str(chrf.get_signature()),
        "repaired": _share(repaired),
        "seconds": round(seconds, 1),
    }
    ex_plain = decode(list(EXAMPLES))
    ex_masked, ex_repaired = protected(decode, list(EXAMPLES))
    record["examples"] = [{"source": s, "unprotected": a, "protected": b, "repaired": r}
                          for s, a, b, r in zip(EXAMPLES, ex_plain, ex_masked, ex_repaired,
                                                strict=True)]
    if forms:
        record["sentinel_copy_rate"] = {name: round(sentinel_copy_rate(decode, sources, f), 2)
                                        for name, f in FORMS.items()}
    return record


def _share(flags: object) -> float:
    values = list(flags)  # type: ignore[call-overload]
    return round(100.0 * sum(values) / max(len(values), 1), 2)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m seq2serve.bench.quality.placeholders",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", type=Path, default=Path("models"),
                        help="folder of the en-de and en-fr packages (default: %(default)s)")
    parser.add_argument("--langs", default="de,fr")
    parser.add_argument("--deb-cache", type=Path, default=Path("data/debs"))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--max-entries", type=int, default=0, help="0: all of them")
    parser.add_argument("--forms", action="store_true",
                        help="also measure each candidate sentinel form's copy rate")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    langs = tuple(args.langs.split(","))
    entries = list(test_entries(args.deb_cache, langs))
    records = []
    for lang in langs:
        mine = [e for e in entries if e.lang == lang]
        if args.max_entries:
            mine = mine[:: max(1, len(mine) // args.max_entries)][:args.max_entries]
        records.append(measure(args.models / f"en-{lang}", mine, args.threads, args.forms))
        print(json.dumps(records[-1], ensure_ascii=False, indent=1), file=sys.stderr)
    if args.json:
        args.json.write_text(json.dumps(records, ensure_ascii=False, indent=1) + "\n",
                             encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
