"""`seq2serve data` for program messages: fetch, build, write; and the mixed corpora.

Output (`--messages-out`, default data/messages): one folder per pair
(`en-de/`, `en-fr/`) with `{train,valid,test}.src/.tgt/.kind/.pkg`
(`.kind` is always `message`, `.pkg` the source package of the pair) and
`corpus.json`, plus `packages.json` and `DATA_CARD.md`. With DDTP built too,
`--mixed-out` (default data/mixed) holds the written mix of both (`corpus.py`).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from seq2serve.model.data import debian_debs, messages, mix
from seq2serve.model.data.debian_debs import LANGS, Deb
from seq2serve.model.data.gettext import NORMALIZATION
from seq2serve.model.data.messages import MessageCorpus, Selection
from seq2serve.model.data.messages_card import messages_card
from seq2serve.model.data.registry import fail as _fail
from seq2serve.model.data.registry import log as _log
from seq2serve.model.data.registry import refuse_overwrite

MB = 1 << 20


def configure(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "program messages (gettext catalogs from Debian packages; see "
        "docs/data-card-messages.md)")
    group.add_argument("--messages-out", type=Path, default=Path("data/messages"),
                       help="output directory (default: %(default)s)")
    group.add_argument("--mixed-out", type=Path, default=Path("data/mixed"),
                       help="DDTP + messages training mix, written when both are built, "
                       "or alone from existing --out and --messages-out with --corpora mix "
                       "(default: %(default)s)")
    group.add_argument("--ddtp-repeat", type=int, default=1,
                       help="DDTP's training pairs appear this many times in the mix, to "
                       "weight the smaller corpus up (default: %(default)s)")
    group.add_argument("--messages-repeat", type=int, default=1,
                       help="the messages corpus's weight in a mix (default: %(default)s)")
    group.add_argument("--deb-cache", type=Path, default=Path("data/debs"),
                       help="downloaded .debs and the private apt state; kept, so a rerun "
                       "resumes (default: %(default)s)")
    group.add_argument("--max-packages", type=int, default=1500,
                       help="at most this many .debs (default: %(default)s)")
    group.add_argument("--max-download-mb", type=float, default=600,
                       help="at most this many MiB of .debs in all (default: %(default)s)")
    group.add_argument("--max-deb-mb", type=float, default=40,
                       help="skip any single .deb larger than this (default: %(default)s)")
    group.add_argument("--per-package", type=int, default=messages.DEFAULT_PER_PACKAGE,
                       help="at most this many pairs per source package and language "
                       "(default: %(default)s)")
    group.add_argument("--catalogs-from", type=Path, metavar="DIR",
                       help="read DIR/<package>/usr/share/locale/{de,fr}/LC_MESSAGES/*.mo "
                       "(packages unpacked with dpkg-deb -x) instead of apt (offline, tests)")


def run(args: argparse.Namespace, langs: list[str],
        no_update: bool | None = None) -> int:
    no_update = args.no_update if no_update is None else no_update
    unknown = [lang for lang in langs if lang not in LANGS]
    if unknown:
        return _fail(f"program messages exist for {', '.join(LANGS)} only, not {unknown}")
    out: Path = args.messages_out
    if (refused := refuse_overwrite(out, args.force)) is not None:
        return refused
    started = time.monotonic()
    if args.catalogs_from:
        listing = debian_debs.tree_listing(args.catalogs_from)
        selection = messages.select(
            listing, {p: Deb(p, p, 0) for p in listing}, args.max_packages, 1 << 62, 1 << 62)
        chosen = {d.package for d in selection.debs}
        catalogs: Iterator[tuple[str, str, bytes]] = (
            (package, lang, data)
            for package, lang, _, data in debian_debs.tree_catalogs(args.catalogs_from)
            if package in chosen)
        downloaded = 0
    else:
        try:
            selection, paths = fetch(args, no_update)
        except (OSError, subprocess.CalledProcessError) as exc:
            return _fail(f"fetching packages failed ({exc})")
        downloaded = sum(p.stat().st_size for p in paths.values())
        catalogs = _deb_catalogs(selection, paths)
    corpora = messages.build(catalogs, langs, args.per_package)
    seconds = time.monotonic() - started
    meta = {"packages": len(selection.debs), "download_bytes": downloaded,
            "seconds": round(seconds, 1)}
    write_atomically(out, args.force, lambda tmp: write(tmp, corpora, selection, meta))
    for corpus in corpora:
        counts = {s: len(rows) for s, rows in corpus.splits.items()}
        print(f"messages {corpus.name}: {counts} from {len(corpus.packages)} source packages, "
              f"{corpus.catalogs} catalogs")
    print(f"wrote {out} ({len(selection.debs)} packages, {downloaded / MB:.1f} MiB of .debs, "
          f"{seconds:.0f} s)")
    return 0


def fetch(args: argparse.Namespace, no_update: bool) -> tuple[Selection, dict[str, Path]]:
    apt_root = args.deb_cache / "apt"
    conf = debian_debs.apt_conf(apt_root)
    lists = apt_root / "lists"
    if not (no_update and any(lists.glob("*_Contents-*"))):
        debian_debs.apt_update(conf)
    listing = debian_debs.contents_listing(lists)
    index = debian_debs.packages_index(lists)
    selection = messages.select(listing, index, args.max_packages,
                                int(args.max_download_mb * MB), int(args.max_deb_mb * MB))
    total = sum(d.size for d in selection.debs)
    _log(f"{len(listing)} packages ship de/fr catalogs; {len(selection.excluded)} held out "
         f"or related; fetching {len(selection.debs)} ({total / MB:.0f} MiB)")
    with _progress(total, "debs") as advance:
        paths = debian_debs.download(conf, args.deb_cache, selection.debs, advance)
    return selection, paths


def _deb_catalogs(selection: Selection, paths: dict[str, Path]
                  ) -> Iterator[tuple[str, str, bytes]]:
    with _progress(len(paths), "unpack") as advance:
        for deb in selection.debs:
            if deb.package not in paths:
                continue
            try:
                for lang, _, data in debian_debs.deb_catalogs(paths[deb.package]):
                    yield deb.source, lang, data
            except (OSError, subprocess.CalledProcessError, EOFError) as exc:
                _log(f"cannot read {paths[deb.package].name} ({exc}); skipped")
            advance(1)


# --------------------------------------------------------------------------- output


def write(directory: Path, corpora: list[MessageCorpus], selection: Selection,
          meta: dict[str, object]) -> None:
    for corpus in corpora:
        folder = directory / corpus.name
        folder.mkdir(parents=True)
        for split, rows in corpus.splits.items():
            columns = {"pkg": [r[0] for r in rows], "src": [r[1] for r in rows],
                       "tgt": [r[2] for r in rows], "kind": ["message"] * len(rows)}
            for ext, lines in columns.items():
                (folder / f"{split}.{ext}").write_text("".join(f"{x}\n" for x in lines),
                                                       encoding="utf-8", newline="\n")
        info = {
            "task": "translate", "src_lang": "en", "tgt_lang": corpus.lang,
            "counts": corpus.counts(), "dropped": dict(sorted(corpus.dropped.items())),
            "normalization": NORMALIZATION,
            "split_rule": f"int(sha256(source package)) % 100: 0-{messages.TEST_PERCENT - 1} "
                          f"test, then {messages.VALID_PERCENT} valid, else train",
            "source": {"name": "Debian gettext catalogs (usr/share/locale/<lang>/LC_MESSAGES)",
                       "held_out_packages": sorted(messages.HELD_OUT_PACKAGES),
                       "held_out_reason": messages.HELD_OUT_REASON},
        }
        (folder / "corpus.json").write_text(json.dumps(info, indent=2, ensure_ascii=False) + "\n",
                                            encoding="utf-8")
    packages = {"selected": [[d.package, d.source, d.size] for d in selection.debs],
                "excluded": selection.excluded, "skipped": dict(selection.skipped), **meta}
    (directory / "packages.json").write_text(json.dumps(packages, indent=1) + "\n",
                                             encoding="utf-8")
    (directory / "DATA_CARD.md").write_text(messages_card(corpora, selection, meta),
                                            encoding="utf-8")


def write_mixed(ddtp_dir: Path, messages_dir: Path, out: Path, force: bool,
                ddtp_repeat: int = 1) -> list[str]:
    """`out/en-<lang>`: the written DDTP + messages mix of older releases (`seq2serve
    data --corpora mix` writes it through `corpus.write_copies`): valid and test the
    two corpora's own, train without any of their pairs, DDTP's train pairs
    `ddtp_repeat` times."""
    if ddtp_repeat < 1:
        raise ValueError(f"ddtp_repeat must be >= 1, got {ddtp_repeat}")
    names = sorted(p.name for p in messages_dir.iterdir()
                   if (p / "corpus.json").is_file() and (ddtp_dir / p.name).is_dir())

    def fill(tmp: Path) -> None:
        for name in names:
            mix.write_copies(tmp / name, [(ddtp_dir / name, ddtp_repeat),
                                          (messages_dir / name, 1)],
                             record={"ddtp_repeat": ddtp_repeat})

    write_atomically(out, force, fill)
    return names


_read_rows = mix.read_rows  # the older name


def write_atomically(out: Path, force: bool, fill: Callable[[Path], None]) -> None:
    """Fill a temp dir beside `out`, then swap it in: an interrupted run never
    leaves a half-written corpus."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        fill(tmp)
        if out.exists():
            if any(out.iterdir()) and not force:
                raise FileExistsError(f"{out} is not empty (use --force)")
            old = out.with_name(f".{out.name}.old-{os.getpid()}")
            os.replace(out, old)
            os.replace(tmp, out)
            shutil.rmtree(old)
        else:
            os.replace(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)


class _progress:
    """tqdm when it is installed (the `train` extra), else nothing: `seq2serve
    data` must run before torch and friends are installed."""

    def __init__(self, total: int, unit: str):
        self.total, self.unit, self.bar = total, unit, None

    def __enter__(self) -> Callable[[int], None]:
        try:
            from tqdm import tqdm
        except ImportError:
            return lambda n: None
        scale = self.unit == "debs"
        self.bar = tqdm(total=self.total, unit="B" if scale else " pkg", unit_scale=scale,
                        desc=self.unit, file=sys.stderr, mininterval=1.0)
        return self.bar.update

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.close()
