"""`seq2serve data --corpora everyday`: fetch, build and write the everyday corpus
(its written three-corpus mix is `corpus.py`'s).

Output (`--everyday-out`, default data/everyday): one folder per pair with
`{train,valid,test}.src/.tgt/.kind/.pkg` (`.kind` is `sentence`,
`paragraph` or `word`, `.pkg` the binary package) and `corpus.json`, plus
`packages.json`, `sources.json` (the measured figures per package) and
`DATA_CARD.md`. Fetching reuses the messages corpus's private apt state and
.deb cache (`debian_debs.py`): bounded, cached, resumable.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path

from seq2serve.model.data import debian_debs, everyday, messages_data
from seq2serve.model.data.everyday import EverydayCorpus, Member
from seq2serve.model.data.everyday_card import everyday_card
from seq2serve.model.data.gettext import NORMALIZATION
from seq2serve.model.data.registry import fail as _fail
from seq2serve.model.data.registry import log as _log
from seq2serve.model.data.registry import refuse_overwrite

MB = 1 << 20


def configure(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "everyday corpus (game dialogue, manuals, captions and dictionary examples from "
        "Debian packages; see docs/data-card-everyday.md)")
    group.add_argument("--everyday-out", type=Path, default=Path("data/everyday"),
                       help="output directory (default: %(default)s)")
    group.add_argument("--everyday-mix-out", type=Path, default=Path("data/mixed-everyday"),
                       help="DDTP + messages + everyday training mix, written with the "
                       "everyday corpus when --out and --messages-out hold built corpora, or "
                       "alone with --corpora everyday-mix (default: %(default)s)")
    group.add_argument("--everyday-repeat", type=int, default=3,
                       help="the everyday corpus's training pairs appear this many times in "
                       "the mix (DDTP's: --ddtp-repeat) (default: %(default)s)")
    group.add_argument("--everyday-from", type=Path, metavar="DIR",
                       help="read DIR/<package>/... (packages unpacked with dpkg-deb -x) "
                       "instead of apt (offline, tests)")


def run(args: argparse.Namespace, langs: list[str],
        no_update: bool | None = None) -> int:
    no_update = args.no_update if no_update is None else no_update
    unknown = [lang for lang in langs if lang not in everyday.LANGS]
    if unknown:
        return _fail(f"the everyday corpus exists for {', '.join(everyday.LANGS)} only, "
                     f"not {unknown}")
    out: Path = args.everyday_out
    if (refused := refuse_overwrite(out, args.force)) is not None:
        return refused
    started = time.monotonic()
    if args.everyday_from:
        members: Iterator[Member] = tree_members(args.everyday_from)
        downloaded = 0
        taken = sorted(p.name for p in args.everyday_from.iterdir() if p.is_dir())
    else:
        try:
            debs, paths = fetch(args, no_update)
        except (OSError, subprocess.CalledProcessError) as exc:
            return _fail(f"fetching packages failed ({exc})")
        downloaded = sum(p.stat().st_size for p in paths.values())
        members = deb_members(debs, paths)
        taken = sorted(paths)
    members = _measured(members, stats := {})
    corpora = everyday.build(members, langs)
    meta = {"packages": taken, "download_bytes": downloaded,
            "seconds": round(time.monotonic() - started, 1)}
    messages_data.write_atomically(out, args.force,
                                   lambda tmp: write(tmp, corpora, stats, meta))
    for corpus in corpora:
        counts = {s: len(rows) for s, rows in corpus.splits.items()}
        print(f"everyday {corpus.name}: {counts} from {len(corpus.packages)} packages")
    print(f"wrote {out} ({len(taken)} packages, {downloaded / MB:.1f} MiB of .debs)")
    return 0


def fetch(args: argparse.Namespace, no_update: bool
          ) -> tuple[list[debian_debs.Deb], dict[str, Path]]:
    apt_root = args.deb_cache / "apt"
    conf = debian_debs.apt_conf(apt_root)
    lists = apt_root / "lists"
    if not (no_update and any(lists.glob("*_Packages*"))):
        debian_debs.apt_update(conf)
    index = debian_debs.packages_index(lists)
    missing = [p for p in everyday.PACKAGES if p not in index]
    if missing:
        _log(f"not in the Packages index, skipped: {', '.join(missing)}")
    debs = [index[p] for p in everyday.PACKAGES if p in index]
    _log(f"fetching {len(debs)} packages ({sum(d.size for d in debs) / MB:.0f} MiB)")
    return debs, debian_debs.download(conf, args.deb_cache, debs)


def deb_members(debs: list[debian_debs.Deb], paths: dict[str, Path]) -> Iterator[Member]:
    """The wanted members of each .deb, streamed from `dpkg-deb --fsys-tarfile`."""
    for deb in debs:
        if deb.package not in paths:
            continue
        try:
            with subprocess.Popen(["dpkg-deb", "--fsys-tarfile", str(paths[deb.package])],
                                  stdout=subprocess.PIPE) as proc:
                assert proc.stdout is not None
                with tarfile.open(fileobj=proc.stdout, mode="r|*") as tar:
                    for member in tar:
                        name = member.name.removeprefix("./")
                        if member.isfile() and everyday.wanted(name):
                            handle = tar.extractfile(member)
                            if handle is not None:
                                yield deb.package, deb.source, name, handle.read()
        except (OSError, tarfile.TarError, EOFError) as exc:
            _log(f"cannot read {paths[deb.package].name} ({exc}); skipped")


def tree_members(root: Path) -> Iterator[Member]:
    """`root/<package>/...` as unpacked by `dpkg-deb -x`; the source package is
    read from `root/<package>/SOURCE` when present, else the package's name."""
    for package_dir in sorted(p for p in root.iterdir() if p.is_dir()):
        marker = package_dir / "SOURCE"
        source = marker.read_text("utf-8").strip() if marker.is_file() else package_dir.name
        for path in sorted(p for p in package_dir.rglob("*") if p.is_file()):
            name = path.relative_to(package_dir).as_posix()
            if not path.is_symlink() and everyday.wanted(name):
                yield package_dir.name, source, name, path.read_bytes()


def _measured(members: Iterator[Member], stats: dict[str, dict[str, object]]
              ) -> Iterator[Member]:
    """Pass members through, remembering which packages gave which members."""
    for member in members:
        stats.setdefault(member[0], {"source": member[1], "members": 0})
        stats[member[0]]["members"] = int(str(stats[member[0]]["members"])) + 1
        yield member


# --------------------------------------------------------------------------- output


def write(directory: Path, corpora: list[EverydayCorpus], stats: dict[str, dict[str, object]],
          meta: dict[str, object]) -> None:
    sources: dict[str, dict[str, object]] = {}
    for corpus in corpora:
        folder = directory / corpus.name
        folder.mkdir(parents=True)
        for split, rows in corpus.splits.items():
            for ext, col in (("pkg", 0), ("kind", 1), ("src", 2), ("tgt", 3)):
                (folder / f"{split}.{ext}").write_text("".join(f"{r[col]}\n" for r in rows),
                                                       encoding="utf-8", newline="\n")
        info = {
            "task": "translate", "src_lang": "en", "tgt_lang": corpus.lang,
            "counts": corpus.counts(), "dropped": dict(sorted(corpus.dropped.items())),
            "normalization": NORMALIZATION,
            "split_rule": "catalogs by binary package (named test/valid packages; a package "
                          "whose source package is test/valid in the messages corpus goes "
                          "there too); stamps and dictionary examples by int(sha256(English)) "
                          f"% 100: 0-{everyday.ENTRY_TEST_PERCENT - 1} test, then "
                          f"{everyday.ENTRY_VALID_PERCENT} valid",
            "source": {"name": "Debian packages: game, manual and dictionary translations",
                       "packages": list(everyday.PACKAGES),
                       "test_packages": sorted(everyday.TEST_PACKAGES),
                       "valid_packages": sorted(everyday.VALID_PACKAGES)},
        }
        (folder / "corpus.json").write_text(json.dumps(info, indent=2, ensure_ascii=False)
                                            + "\n", encoding="utf-8")
        write_handwritten(directory / f"{corpus.name}-handwritten", corpus.lang)
        for split, rows in corpus.splits.items():
            for package in {r[0] for r in rows}:
                entry = sources.setdefault(package, {"source": stats.get(package, {}).get(
                    "source", package)})
                kept = [r for r in rows if r[0] == package]
                entry[f"{corpus.name} {split}"] = everyday.measure(r[2] for r in kept)
    (directory / "sources.json").write_text(json.dumps(sources, indent=1, sort_keys=True)
                                            + "\n", encoding="utf-8")
    (directory / "packages.json").write_text(json.dumps(meta, indent=1) + "\n",
                                             encoding="utf-8")
    (directory / "DATA_CARD.md").write_text(everyday_card(corpora, meta), encoding="utf-8")


def write_handwritten(folder: Path, lang: str) -> None:
    """The hand-written test set as a corpus folder with a test split only, so
    `seq2serve train --score CKPT --data <folder> --split test` scores it."""
    pairs = everyday.handwritten(lang)
    folder.mkdir(parents=True)
    for ext, lines in (("src", [s for s, _ in pairs]), ("tgt", [t for _, t in pairs]),
                       ("kind", ["sentence"] * len(pairs))):
        (folder / f"test.{ext}").write_text("".join(f"{x}\n" for x in lines),
                                            encoding="utf-8", newline="\n")
    info = {"task": "translate", "src_lang": "en", "tgt_lang": lang,
            "counts": {"test": {"sentence": len(pairs)}},
            "source": {"name": "hand-written everyday sentences",
                       "file": "model/data/testsets/everyday.tsv"}}
    (folder / "corpus.json").write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
