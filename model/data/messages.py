"""The program-messages corpus: en->de and en->fr pairs from Debian's gettext catalogs.

Choosing packages (never the held-out ones), cleaning every catalog entry
(`gettext.py`), capping each program, splitting by source package and
deduplicating. Fetching is `debian_debs.py`; the card is `messages_card.py`.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from seq2serve.model.data.debian_debs import Deb, Listing
from seq2serve.model.data.gettext import Catalog, MoError, clean_pair, entry_pairs, read_mo

# Held out for an independent evaluation of the shipped models on software
# messages (the set itself is kept outside this project): no catalog of these
# Debian binary packages may reach any split, nor, to keep near-copies out, any
# other binary of their source packages or any catalog of the same text domain
# family (gtk30 -> gtk40, see `domain_family`)..
HELD_OUT_PACKAGES = frozenset("""
    coreutils tar grep sed findutils diffutils wget bash gawk make xz-utils gettext
    gettext-base nano procps libparted-i18n man-db binutils-common gcc-12-locales dpkg apt
    aptitude-common debconf-i18n e2fsprogs-l10n util-linux-locales gnupg-l10n libc-l10n
    network-manager systemd login sudo git libglib2.0-data libgtk-3-common vlc-l10n
    transmission-gtk gparted-common synaptic filezilla-common pidgin-data audacity-data
    gnome-control-center-data nautilus-data evince-common totem-common rhythmbox-data
    gnumeric-common claws-mail-i18n mutt gnucash-common thunar-data mousepad gedit-common
""".split())
HELD_OUT_REASON = ("held out for an independent evaluation set of software-message "
                   "translations kept outside the project")

SPLITS = ("train", "valid", "test")  # dedupe priority: a pair shared with train stays in train
TEST_PERCENT, VALID_PERCENT = 3, 3
DEFAULT_PER_PACKAGE = 1000


def split_of_package(source: str) -> str:
    """Deterministic split by source package: ~3% test, ~3% valid, the rest train."""
    bucket = int(hashlib.sha256(source.encode("utf-8")).hexdigest(), 16) % 100
    if bucket < TEST_PERCENT:
        return "test"
    return "valid" if bucket < TEST_PERCENT + VALID_PERCENT else "train"


def domain_family(domain: str) -> str:
    """A text domain without its version digits and separators: gtk30 and
    gtk40, glib20, gnome-control-center-2.0 -> one family each."""
    return re.sub(r"[\d._-]+", "", domain.lower())


# --------------------------------------------------------------------------- selection


@dataclass
class Selection:
    debs: list[Deb]
    excluded: dict[str, str]  # package -> why (held-out and its relatives)
    skipped: Counter[str] = field(default_factory=Counter)  # over a cap, not in the index


def exclusions(listing: Listing, sources: dict[str, str]) -> dict[str, str]:
    """Every package whose catalogs must stay out, with the reason."""
    held_sources = {sources.get(p, p) for p in HELD_OUT_PACKAGES}
    families = {domain_family(d) for p in HELD_OUT_PACKAGES for _, d in listing.get(p, ())}
    out: dict[str, str] = {}
    for package, catalogs in listing.items():
        if package in HELD_OUT_PACKAGES:
            out[package] = "held out"
        elif sources.get(package, package) in held_sources:
            out[package] = f"same source package as a held-out one ({sources[package]})"
        elif hit := sorted(d for _, d in catalogs if domain_family(d) in families):
            out[package] = f"same catalog family as a held-out one ({', '.join(hit)})"
    return out


def select(listing: Listing, index: dict[str, Deb], max_packages: int, max_bytes: int,
           max_deb_bytes: int) -> Selection:
    """Packages to fetch: smallest .deb first (many programs for few bytes)
    until the package or byte budget is spent; no held-out package or relative."""
    sources = {p: d.source for p, d in index.items()}
    excluded = exclusions(listing, sources)
    selection = Selection([], excluded)
    total = 0
    for package in sorted(listing, key=lambda p: (index[p].size if p in index else 0, p)):
        if package in excluded:
            continue
        deb = index.get(package)
        if deb is None:
            selection.skipped["not in the Packages index"] += 1
        elif deb.size > max_deb_bytes:
            selection.skipped["larger than --max-deb-mb"] += 1
        elif len(selection.debs) >= max_packages or total + deb.size > max_bytes:
            selection.skipped["over --max-packages/--max-download-mb"] += 1
        else:
            selection.debs.append(deb)
            total += deb.size
    return selection


# --------------------------------------------------------------------------- corpus

Row = tuple[str, str, str]  # (source package, English, translation)


@dataclass
class MessageCorpus:
    lang: str
    splits: dict[str, list[Row]] = field(default_factory=lambda: {s: [] for s in SPLITS})
    dropped: Counter[str] = field(default_factory=Counter)
    packages: Counter[str] = field(default_factory=Counter)  # source package -> pairs kept
    catalogs: int = 0

    @property
    def name(self) -> str:
        return f"en-{self.lang}"

    def counts(self) -> dict[str, dict[str, int]]:
        return {s: {"message": len(rows)} if rows else {} for s, rows in self.splits.items()}

    def source_overlap(self) -> dict[str, int]:
        train = {src for _, src, _ in self.splits["train"]}
        return {s: sum(src in train for _, src, _ in self.splits[s]) for s in ("test", "valid")}


def build(catalogs: Iterable[tuple[str, str, bytes]], langs: Iterable[str],
          per_package: int = DEFAULT_PER_PACKAGE) -> list[MessageCorpus]:
    """Corpora from (source package, lang, .mo bytes) triples.

    Per source package and language: clean every entry, drop exact repeats,
    keep at most `per_package` pairs (the lowest sha256 of the pair, so the
    choice is deterministic and not biased to the start of a catalog). Then
    split by source package; an identical pair in several packages is kept
    once, in train if any of its packages is a train package, else valid,
    else test, so evaluation never repeats a training pair and training keeps
    the common UI strings ("Cancel").
    """
    corpora = {lang: MessageCorpus(lang) for lang in langs}
    pairs: dict[tuple[str, str], set[tuple[str, str]]] = {}
    for source, lang, data in catalogs:
        if lang not in corpora:
            continue
        corpus = corpora[lang]
        try:
            catalog = read_mo(data)
        except MoError as exc:
            corpus.dropped[f"unreadable catalog: {exc}"] += 1
            continue
        corpus.catalogs += 1
        pairs.setdefault((source, lang), set()).update(_clean_catalog(catalog, corpus.dropped))
    by_pair: dict[str, dict[tuple[str, str], set[str]]] = {lang: {} for lang in corpora}
    for (source, lang), kept in sorted(pairs.items()):
        ranked = sorted(kept, key=lambda p: hashlib.sha256(f"{p[0]}\t{p[1]}".encode()).digest())
        if len(ranked) > per_package:
            corpora[lang].dropped["over the per-package cap"] += len(ranked) - per_package
        for pair in ranked[:per_package]:
            by_pair[lang].setdefault(pair, set()).add(source)
    for lang, corpus in corpora.items():
        for (src, tgt), sources in by_pair[lang].items():
            where = {s: split_of_package(s) for s in sorted(sources)}
            split = next(s for s in SPLITS if s in where.values())
            owner = next(s for s, sp in where.items() if sp == split)
            corpus.dropped["duplicate"] += len(sources) - 1
            corpus.splits[split].append((owner, src, tgt))
            corpus.packages[owner] += 1
        for rows in corpus.splits.values():
            rows.sort(key=lambda r: (r[0], hashlib.sha256(f"{r[1]}\t{r[2]}".encode()).digest()))
    return list(corpora.values())


def _clean_catalog(catalog: Catalog, dropped: Counter[str]) -> set[tuple[str, str]]:
    kept: set[tuple[str, str]] = set()
    nplurals = catalog.nplurals
    for entry in catalog.entries:
        texts = entry_pairs(entry, nplurals)
        if isinstance(texts, str):
            dropped[texts] += 1
            continue
        for src, tgt in texts:
            result = clean_pair(src, tgt)
            if isinstance(result, str):
                dropped[result] += 1
            elif result in kept:
                dropped["duplicate"] += 1
            else:
                kept.add(result)
    return kept
