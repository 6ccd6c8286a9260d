"""Which Debian packages ship German/French gettext catalogs, and fetching them.

apt does all network work, in a private state directory under the cache
(its own lists and package cache, so neither the system's apt state nor
another user's `apt-get update` is touched): `apt-get update` with the
Contents index target enabled (the same target apt-file enables), then
`apt-get download` of the chosen binary packages, which are never installed.
Catalogs are read out of each .deb with `dpkg-deb --fsys-tarfile`, the
streaming form of `dpkg-deb -x` that lets us keep only the `.mo` members.
"""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys
import tarfile
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import lz4.frame

from seq2serve.model.data.registry import log as _log

LANGS = ("de", "fr")
CATALOG_PATH = re.compile(r"^(?:\./)?usr/share/locale/(de|fr)/LC_MESSAGES/([^/]+)\.mo$")
_CONTENTS_LINE = re.compile(rb"^usr/share/locale/(de|fr)/LC_MESSAGES/([^/\s]+)\.mo\s+(\S+)$",
                            re.M)
_URI_LINE = re.compile(r"^'(?P<uri>[^']+)' (?P<file>\S+) (?P<size>\d+) SHA256:(?P<sha>[0-9a-f]+)",
                       re.M)

APT_CONF = """\
Dir::State::Lists "{root}/lists";
Dir::Cache "{root}/cache";
Acquire::Languages "none";
Acquire::IndexTargets::deb::Contents-deb {{
    MetaKey "$(COMPONENT)/Contents-$(ARCHITECTURE)";
    ShortDescription "Contents-$(ARCHITECTURE)";
    Description "$(RELEASE)/$(COMPONENT) $(ARCHITECTURE) Contents (deb)";
    flatMetaKey "Contents-$(ARCHITECTURE)";
    flatDescription "$(RELEASE) Contents (deb)";
    KeepCompressed "true";
    DefaultEnabled "true";
}};
"""

Listing = dict[str, set[tuple[str, str]]]  # binary package -> {(lang, domain)}


@dataclass(frozen=True)
class Deb:
    package: str
    source: str
    size: int  # bytes, from the Packages index (the .deb apt will fetch)


def apt_conf(root: Path) -> Path:
    """Write the private apt configuration under `root` and return its path."""
    for sub in ("lists/partial", "cache/archives/partial"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    conf = root.resolve() / "apt.conf"
    conf.write_text(APT_CONF.format(root=root.resolve()), encoding="utf-8")
    return conf


def apt_update(conf: Path) -> None:
    _log(f"apt-get -c {conf} update (Packages and Contents indexes)")
    subprocess.run(["apt-get", "-c", str(conf), "update"], check=True, stdout=sys.stderr)


def _read_lz4_or_plain(path: Path) -> bytes:
    data = path.read_bytes()
    return lz4.frame.decompress(data) if path.suffix == ".lz4" else data


def contents_listing(lists: Path) -> Listing:
    """Binary packages shipping usr/share/locale/{de,fr}/LC_MESSAGES/*.mo, from
    every Contents-* index in apt's lists directory."""
    listing: Listing = {}
    files = sorted(p for p in lists.iterdir() if "_Contents-" in p.name)
    if not files:
        raise FileNotFoundError(f"no Contents index in {lists} (apt-get update first)")
    for path in files:
        for match in _CONTENTS_LINE.finditer(_read_lz4_or_plain(path)):
            lang, domain = match[1].decode(), match[2].decode("utf-8", "replace")
            for qualified in match[3].split(b","):
                package = qualified.rsplit(b"/", 1)[-1].decode()
                listing.setdefault(package, set()).add((lang, domain))
    return listing


def packages_index(lists: Path) -> dict[str, Deb]:
    """Package -> Deb from every *_Packages index. A later file overrides an
    earlier one (updates and security sort after the base suite), which is
    usually apt's candidate; sizes only steer the budget, apt reports the real ones."""
    index: dict[str, Deb] = {}
    for path in sorted(p for p in lists.iterdir() if re.search(r"_Packages(\.lz4)?$", p.name)):
        for stanza in _read_lz4_or_plain(path).decode("utf-8", "replace").split("\n\n"):
            fields = dict(line.split(": ", 1) for line in stanza.split("\n")
                          if ": " in line and not line[:1].isspace())
            if "Package" in fields and "Size" in fields:
                source = fields.get("Source", fields["Package"]).split()[0]
                index[fields["Package"]] = Deb(fields["Package"], source, int(fields["Size"]))
    return index


# --------------------------------------------------------------------------- download


def download(conf: Path, debs_dir: Path, debs: list[Deb],
             progress: Callable[[int], None] | None = None, chunk: int = 25,
             parallel: int = 8) -> dict[str, Path]:
    """Fetch `debs` into `debs_dir` with `apt-get download`, skipping any file
    already there with the expected size and SHA-256 (so an interrupted run
    resumes). Returns package -> .deb path for every package that is present;
    one that apt cannot fetch is reported and left out."""
    debs_dir.mkdir(parents=True, exist_ok=True)
    names = [d.package for d in debs]
    expected: dict[str, tuple[str, int, str]] = {}
    for i in range(0, len(names), 200):
        out = _apt(conf, debs_dir, ["download", "--print-uris", *names[i:i + 200]])
        for match in _URI_LINE.finditer(out):
            package = match["file"].split("_", 1)[0]
            expected[package] = (match["file"], int(match["size"]), match["sha"])
    present: dict[str, Path] = {}
    missing: list[str] = []
    for name in names:
        if name not in expected:
            # apt prints no URI for a file it finds in place with the right hash
            cached = sorted(debs_dir.glob(f"{name}_*.deb"), key=lambda p: p.stat().st_mtime)
            if cached:
                present[name] = cached[-1]
                if progress:
                    progress(cached[-1].stat().st_size)
            else:
                _log(f"apt cannot download {name}; skipped")
            continue
        file, size, sha = expected[name]
        path = debs_dir / file
        if path.is_file() and path.stat().st_size == size and _sha256(path) == sha:
            present[name] = path
            if progress:
                progress(size)
        else:
            missing.append(name)
    def fetch(batch: list[str]) -> list[str]:
        try:
            _apt(conf, debs_dir, ["download", *batch])
        except subprocess.CalledProcessError:
            for name in batch:  # one bad package must not sink its neighbours
                try:
                    _apt(conf, debs_dir, ["download", name])
                except subprocess.CalledProcessError:
                    _log(f"apt-get download {name} failed; skipped")
        return batch

    # Small .debs are bound by the round trip per file, not the bandwidth: a few
    # apt-get processes at once (each writes only its own files).
    batches = [missing[i:i + chunk] for i in range(0, len(missing), chunk)]
    with ThreadPoolExecutor(max_workers=parallel) as pool:
        for batch in pool.map(fetch, batches):
            for name in batch:
                file, size, _ = expected[name]
                if (debs_dir / file).is_file():
                    present[name] = debs_dir / file
                    if progress:
                        progress(size)
    return present


def _apt(conf: Path, cwd: Path, args: list[str]) -> str:
    return subprocess.run(["apt-get", "-c", str(conf), "-q", *args], cwd=cwd, check=True,
                          capture_output=True, text=True).stdout


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# --------------------------------------------------------------------------- catalogs


def deb_catalogs(deb: Path) -> Iterator[tuple[str, str, bytes]]:
    """(lang, domain, .mo bytes) of every de/fr catalog in a .deb, read from
    `dpkg-deb --fsys-tarfile` (nothing is written to disk)."""
    with subprocess.Popen(["dpkg-deb", "--fsys-tarfile", str(deb)],
                          stdout=subprocess.PIPE) as proc:
        assert proc.stdout is not None
        with tarfile.open(fileobj=proc.stdout, mode="r|*") as tar:
            for member in tar:
                match = CATALOG_PATH.match(member.name)
                if match and member.isfile():
                    handle = tar.extractfile(member)
                    if handle is not None:
                        yield match[1], match[2], handle.read()
    if proc.returncode:
        raise subprocess.CalledProcessError(proc.returncode, proc.args)


def tree_catalogs(root: Path) -> Iterator[tuple[str, str, str, bytes]]:
    """(package, lang, domain, .mo bytes) from `root/<package>/usr/share/locale/...`,
    i.e. packages already unpacked with `dpkg-deb -x` (offline use, tests)."""
    for package_dir in sorted(p for p in root.iterdir() if p.is_dir()):
        for lang in LANGS:
            folder = package_dir / "usr/share/locale" / lang / "LC_MESSAGES"
            for mo in sorted(folder.glob("*.mo")) if folder.is_dir() else []:
                if mo.is_file() and not mo.is_symlink():
                    yield package_dir.name, lang, mo.stem, mo.read_bytes()


def tree_listing(root: Path) -> Listing:
    listing: Listing = {}
    for package, lang, domain, _ in tree_catalogs(root):
        listing.setdefault(package, set()).add((lang, domain))
    return listing
