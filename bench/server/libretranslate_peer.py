"""LibreTranslate on a seq2serve checkpoint, offline: the HTTP peer of the benchmarks.

    python -m seq2serve.bench.server.libretranslate_peer models/checkpoints/en-de \
        --work /tmp/lt-peer --port 5050 --intra-threads 2

LibreTranslate (installed in its own virtualenv, `.venv-lt`, beside the
project's: `.venv-lt/bin/pip install torch==2.13.0 libretranslate==1.9.6`)
translates with Argos Translate, which runs a CTranslate2 model from an Argos
package. `build_package` makes that package from a seq2serve checkpoint:

    <name>/metadata.json            languages and package type
    <name>/model/                   the CTranslate2 conversion (bench/engine/ctranslate2_model.py)
    <name>/sentencepiece.model      the checkpoint's tokenizer
    <name>/minisbd/rules.onnx       the sentence splitter (below)

Two things would make LibreTranslate reach the network, and are avoided here:

- Argos splits text into sentences with MiniSBD, whose per-language model is
  downloaded on first use. A package may carry its own MiniSBD model in
  `minisbd/` (Argos takes the first `*.onnx` there). `sbd_rules_model` writes one
  in MiniSBD's format (an ONNX graph over character ids with its vocabulary and
  config in the metadata) that needs no training: a sentence ends at `.`, `!` or
  `?` followed by a space and an upper-case letter, and at the end of a paragraph.
- With fewer than two packages installed LibreTranslate updates its models at
  start-up. The package index is a local `file://` folder whose index.json is
  empty, and `--load-only en,de` makes the update stop at once ("Unavailable
  language codes", printed as "Cannot update models (normal if you're
  offline)") instead of retrying MiniSBD downloads.

`start()` installs the package into a private Argos home (XDG_DATA_HOME,
XDG_CONFIG_HOME, XDG_CACHE_HOME, ARGOS_PACKAGES_DIR, ARGOS_PACKAGE_INDEX under the
work folder), starts `libretranslate --host 127.0.0.1 --port P --load-only en,de`
with Argos' decoding settings (ARGOS_BEAM_SIZE, ARGOS_COMPUTE_TYPE,
ARGOS_INTER_THREADS, ARGOS_INTRA_THREADS, ARGOS_BATCH_SIZE), waits a bounded time
for `/languages`, sends one warm-up translation (Argos loads the model and the
splitter on first use) and returns the running peer; `stop()` ends that process
by its PID.

What Argos does with a request: LibreTranslate translates a list `q` item by
item; Argos splits each text into paragraphs (newlines) and sentences, and
calls CTranslate2's `translate_batch` on the sentences of a paragraph with
`beam_size=max(1, ARGOS_BEAM_SIZE)`, `length_penalty=0.2`,
`replace_unknowns=True`, `max_batch_size=ARGOS_BATCH_SIZE` tokens; it keeps the
previous call's paragraphs in a cache. LibreTranslate then adjusts the final
punctuation and the case to the source's (`improve_translation_formatting`).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import zipfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LIBRETRANSLATE_VERSION = "1.9.6"
SBD_FILE = "rules.onnx"
LANGUAGE_NAMES = {"en": "English", "de": "German", "fr": "French"}

# MiniSBD's classes per character: 0 inside a token, 1 token end, 2 sentence end
# (3 and 4: multi-word tokens, never produced here).
TOKEN_END, SENTENCE_END, CLASSES = 1, 2, 5
# The splitter's character vocabulary: MiniSBD's <PAD> 0 and <UNK> 1, then the
# characters the rules look at. Terminators take the ids above SPACE_ID.
SPACE_ID = 2
SBD_UNITS = ["<PAD>", "<UNK>", " ", ".", "!", "?"]


def sbd_rules_model(path: Path, lang: str) -> Path:
    """Write a MiniSBD model (ONNX, opset 17) that splits by rule: a character
    ends a sentence when it is `.`, `!` or `?`, the next one is a space and the
    one after that is upper case (MiniSBD's `capitalized` feature); every
    character ends a token (MiniSBD drops the whitespace ones). MiniSBD itself
    ends a sentence at the end of each paragraph."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    def const(name: str, value: np.ndarray) -> onnx.NodeProto:
        return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(value, name))

    big = np.iinfo(np.int64).max
    nodes = [
        const("space_id", np.array(SPACE_ID, dtype=np.int64)),
        const("pad_id", np.array(0, dtype=np.int64)),
        const("one", np.array([1], dtype=np.int64)),
        const("two", np.array([2], dtype=np.int64)),
        const("end", np.array([big], dtype=np.int64)),
        const("axis1", np.array([1], dtype=np.int64)),
        const("zero_index", np.array(0, dtype=np.int64)),
        const("half", np.array(0.5, dtype=np.float32)),
        const("pad_one", np.array([0, 0, 0, 1], dtype=np.int64)),
        const("pad_two", np.array([0, 0, 0, 2], dtype=np.int64)),
        const("split", np.eye(CLASSES, dtype=np.float32)[SENTENCE_END]),
        const("token", np.eye(CLASSES, dtype=np.float32)[TOKEN_END]),
        # units (B, N): the next character's id, <PAD> past the end
        helper.make_node("Greater", ["units", "space_id"], ["terminator"]),
        helper.make_node("Slice", ["units", "one", "end", "axis1"], ["after"]),
        helper.make_node("Pad", ["after", "pad_one"], ["next"], mode="constant"),
        helper.make_node("Equal", ["next", "space_id"], ["next_space"]),
        helper.make_node("Equal", ["next", "pad_id"], ["next_pad"]),
        # features (B, N, 1): the character after next is upper case
        helper.make_node("Gather", ["features", "zero_index"], ["capital"], axis=2),
        helper.make_node("Slice", ["capital", "two", "end", "axis1"], ["later"]),
        helper.make_node("Pad", ["later", "pad_two"], ["capital_2"], mode="constant"),
        helper.make_node("Greater", ["capital_2", "half"], ["starts_upper"]),
        helper.make_node("And", ["next_space", "starts_upper"], ["new_sentence"]),
        helper.make_node("Or", ["new_sentence", "next_pad"], ["closes"]),
        helper.make_node("And", ["terminator", "closes"], ["boundary"]),
        helper.make_node("Unsqueeze", ["boundary", "two"], ["boundary_3d"]),
        helper.make_node("Where", ["boundary_3d", "split", "token"], ["logits"]),
    ]
    graph = helper.make_graph(
        nodes, "sbd_rules",
        [helper.make_tensor_value_info("units", TensorProto.INT64, ["B", "N"]),
         helper.make_tensor_value_info("features", TensorProto.FLOAT, ["B", "N", 1])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["B", "N", CLASSES])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                              producer_name="seq2serve")
    model.ir_version = 8  # readable by any onnxruntime of the last years
    vocab = {"lang": lang, "idx": 0, "cutoff": 0, "lower": False,
             "_id2unit": SBD_UNITS, "_unit2id": {u: i for i, u in enumerate(SBD_UNITS)}}
    config = {"feat_funcs": ["capitalized"], "max_seqlen": 1000, "batch_size": 32,
              "skip_newline": False, "no_ssplit": False, "use_dictionary": False,
              "num_dict_feat": 0}
    helper.set_model_props(model, {"lang_code": lang, "config": json.dumps(config),
                                   "vocab": json.dumps(vocab), "lexicon": "null"})
    onnx.checker.check_model(model, full_check=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


def _checkpoint_languages(checkpoint: Path) -> tuple[str, str]:
    from seq2serve.model.checkpoint import read_meta

    meta = read_meta(checkpoint)
    source, target = meta.get("src_lang"), meta.get("tgt_lang")
    if not source or not target:
        raise ValueError(f"{checkpoint}: config.json names no src_lang/tgt_lang")
    return str(source), str(target)


def build_package(checkpoint: Path, out: Path) -> Path:
    """Write the Argos package (.argosmodel zip) of a seq2serve checkpoint to `out`."""
    from seq2serve.bench.engine import ctranslate2_model

    source, target = _checkpoint_languages(checkpoint)
    name = f"translate-{source}_{target}-seq2serve"
    metadata = {"package_version": "1.0", "argos_version": "1.9.0", "type": "translate",
                "from_code": source, "from_name": LANGUAGE_NAMES.get(source, source),
                "to_code": target, "to_name": LANGUAGE_NAMES.get(target, target),
                "links": []}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / name
        model = ctranslate2_model.convert(checkpoint, root / "model")
        (model / ctranslate2_model.TOKENIZER_FILE).rename(root / "sentencepiece.model")
        sbd_rules_model(root / "minisbd" / SBD_FILE, source)
        (root / "metadata.json").write_text(json.dumps(metadata, indent=2) + "\n")
        (root / "README.md").write_text(
            f"{source} -> {target}: the seq2serve checkpoint {checkpoint.resolve().name}, "
            "converted by seq2serve.bench.server.libretranslate_peer.\n")
        out.parent.mkdir(parents=True, exist_ok=True)
        partial = out.with_name(f".{out.name}.partial")
        # Stored, not deflated: float32 weights hardly shrink and deflating 36 MB takes seconds.
        with zipfile.ZipFile(partial, "w", zipfile.ZIP_STORED) as archive:
            for file in sorted(root.rglob("*")):
                if file.is_file():
                    archive.write(file, file.relative_to(tmp).as_posix())
        os.replace(partial, out)
    return out


@dataclass(frozen=True)
class ArgosHome:
    """A private Argos Translate home: nothing is read from or written to ~."""

    root: Path

    @property
    def data(self) -> Path:  # XDG_DATA_HOME
        return self.root / "data"

    @property
    def packages(self) -> Path:  # ARGOS_PACKAGES_DIR
        return self.data / "argos-translate" / "packages"

    @property
    def index(self) -> Path:  # ARGOS_PACKAGE_INDEX: the "remote" index, a local folder
        return self.root / "index"

    def environment(self) -> dict[str, str]:
        return {"XDG_DATA_HOME": str(self.data), "XDG_CONFIG_HOME": str(self.root / "config"),
                "XDG_CACHE_HOME": str(self.root / "cache"),
                "ARGOS_PACKAGES_DIR": str(self.packages),
                "ARGOS_PACKAGE_INDEX": self.index.resolve().as_uri() + "/"}

    def install(self, package: Path) -> None:
        """Empty the home, unpack `package` into it (what `argospm install` does)
        and write the empty package indexes."""
        shutil.rmtree(self.root, ignore_errors=True)
        self.packages.mkdir(parents=True)
        with zipfile.ZipFile(package) as archive:
            archive.extractall(self.packages)
        for index in (self.index / "index.json", self.data / "argos-translate" / "index.json"):
            index.parent.mkdir(parents=True, exist_ok=True)
            index.write_text("[]\n")


@dataclass(frozen=True)
class PeerSettings:
    """LibreTranslate's and Argos' knobs for a benchmark run.

    intra_threads: CTranslate2 threads per translation (ARGOS_INTRA_THREADS; 0 is
    CTranslate2's default, 4 or the cores); inter_threads: translations run at
    once (ARGOS_INTER_THREADS); http_threads: waitress' request threads
    (`--threads`); compute_type: CTranslate2's load-time precision
    (ARGOS_COMPUTE_TYPE; int8 as the served seq2serve package); batch_size:
    Argos' `max_batch_size` in tokens within one text (ARGOS_BATCH_SIZE)."""

    beam_size: int = 4
    compute_type: str = "int8"
    intra_threads: int = 0
    inter_threads: int = 1
    http_threads: int = 4
    batch_size: int = 32

    def environment(self) -> dict[str, str]:
        return {"ARGOS_DEVICE_TYPE": "cpu", "ARGOS_CHUNK_TYPE": "MINISBD",
                "ARGOS_BEAM_SIZE": str(self.beam_size),
                "ARGOS_COMPUTE_TYPE": self.compute_type,
                "ARGOS_INTRA_THREADS": str(self.intra_threads),
                "ARGOS_INTER_THREADS": str(self.inter_threads),
                "ARGOS_BATCH_SIZE": str(self.batch_size)}


def libretranslate_command() -> Path:
    """The `libretranslate` of `.venv-lt` beside the project, else the one on PATH."""
    own = ROOT / ".venv-lt" / "bin" / "libretranslate"
    if own.is_file():
        return own
    found = shutil.which("libretranslate")
    if found is None:
        raise FileNotFoundError(
            f"no LibreTranslate: {own} is missing; install it with `python -m venv .venv-lt && "
            f".venv-lt/bin/pip install torch==2.13.0 libretranslate=={LIBRETRANSLATE_VERSION}`")
    return Path(found)


def package_key(checkpoint: Path) -> str:
    """A digest of the checkpoint's files and of the code that converts it: a
    cached package is reused only while both are unchanged."""
    from seq2serve.bench.engine import ctranslate2_model

    digest = hashlib.sha256()
    files = [*sorted(p for p in checkpoint.iterdir() if p.is_file() and p.suffix != ".pt"),
             Path(ctranslate2_model.__file__), Path(__file__)]
    for file in files:
        digest.update(file.name.encode() + b"\0" + file.read_bytes())
    return digest.hexdigest()[:12]


def cached_package(checkpoint: Path, work: Path) -> Path:
    """The Argos package of `checkpoint` under `work`, built once per package_key."""
    source, target = _checkpoint_languages(checkpoint)
    out = work / f"{source}-{target}-{package_key(checkpoint)}.argosmodel"
    return out if out.is_file() else build_package(checkpoint, out)


def _post_json(url: str, body: dict[str, object], timeout: float) -> object:
    request = urllib.request.Request(url, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())


def translate(url: str, texts: str | list[str], source: str = "en", target: str = "de",
              timeout: float = 120.0) -> object:
    """LibreTranslate's `translatedText` for `texts` (one string or a list)."""
    answer = _post_json(f"{url}/translate", {"q": texts, "source": source, "target": target,
                                             "format": "text"}, timeout)
    if not isinstance(answer, dict) or "translatedText" not in answer:
        raise RuntimeError(f"{url}/translate answered {answer!r}")
    return answer["translatedText"]


class RunningPeer:
    """A LibreTranslate process started by `start()`."""

    def __init__(self, process: subprocess.Popen[bytes], url: str, log: Path,
                 started_seconds: float):
        self.process = process
        self.url = url
        self.log = log
        self.started_seconds = started_seconds  # process start to a warm translation

    @property
    def pid(self) -> int:
        return self.process.pid

    def stop(self, wait_s: float = 20.0) -> None:
        """SIGTERM the process by its PID, SIGKILL if it has not exited in `wait_s`."""
        if self.process.poll() is not None:
            return
        os.kill(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(wait_s)
        except subprocess.TimeoutExpired:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def __enter__(self) -> RunningPeer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _log_tail(log: Path, lines: int = 20) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def _wait_ready(process: subprocess.Popen[bytes], url: str, log: Path, deadline: float,
                source: str) -> None:
    """Until `/languages` lists `source`, the process dies, or the deadline passes."""
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"libretranslate exited with status {process.returncode} "
                               f"before it served:\n{_log_tail(log)}")
        try:
            with urllib.request.urlopen(f"{url}/languages", timeout=2) as response:
                languages = json.loads(response.read())
            if any(lang.get("code") == source for lang in languages):
                return
        except (urllib.error.URLError, ConnectionError, TimeoutError, json.JSONDecodeError):
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"libretranslate did not serve {url}/languages in time:\n"
                               f"{_log_tail(log)}")
        time.sleep(0.2)


def start(checkpoint: Path, work: Path, port: int | None = None,
          settings: PeerSettings | None = None, start_timeout_s: float = 120.0,
          command: Path | None = None) -> RunningPeer:
    """Build (or reuse) the package, install it into `work/argos`, start
    LibreTranslate on 127.0.0.1, wait for it (at most `start_timeout_s`) and warm
    it up with one translation. Stop it with `.stop()` or a `with` block."""
    from seq2serve.bench.server.serving import free_port

    settings = settings or PeerSettings()
    work.mkdir(parents=True, exist_ok=True)
    source, target = _checkpoint_languages(checkpoint)
    home = ArgosHome(work / "argos")
    home.install(cached_package(checkpoint, work))
    port = port or free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, **home.environment(), **settings.environment()}
    args = [str(command or libretranslate_command()), "--host", "127.0.0.1", "--port", str(port),
            "--load-only", f"{source},{target}", "--threads", str(settings.http_threads)]
    log = work / "libretranslate.log"
    began = time.monotonic()
    with open(log, "wb") as out:
        process = subprocess.Popen(args, env=env, cwd=work, stdin=subprocess.DEVNULL,
                                   stdout=out, stderr=subprocess.STDOUT)
    peer = RunningPeer(process, url, log, 0.0)
    try:
        _wait_ready(process, url, log, began + start_timeout_s, source)
        translate(url, "Hello.", source, target, timeout=max(1.0, began + start_timeout_s
                                                                 - time.monotonic()))
    except BaseException:
        peer.stop()
        raise
    peer.started_seconds = time.monotonic() - began
    return peer


@contextmanager
def libretranslate(checkpoint: Path, work: Path, port: int | None = None,
                   settings: PeerSettings | None = None) -> Iterator[str]:
    """`start()` as a context: yields the URL, stops the process on exit."""
    with start(checkpoint, work, port, settings) as peer:
        yield peer.url


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m seq2serve.bench.server.libretranslate_peer",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("checkpoint", type=Path, help="seq2serve checkpoint directory")
    parser.add_argument("--work", type=Path, default=Path("/tmp/seq2serve-libretranslate"),
                        help="the package cache, the Argos home and the log")
    parser.add_argument("--port", type=int, default=None)
    parser.add_argument("--package-only", type=Path, metavar="OUT",
                        help="write the .argosmodel to OUT and exit")
    defaults = PeerSettings()
    parser.add_argument("--beam-size", type=int, default=defaults.beam_size)
    parser.add_argument("--compute-type", default=defaults.compute_type)
    parser.add_argument("--intra-threads", type=int, default=defaults.intra_threads)
    parser.add_argument("--inter-threads", type=int, default=defaults.inter_threads)
    parser.add_argument("--http-threads", type=int, default=defaults.http_threads)
    parser.add_argument("--batch-size", type=int, default=defaults.batch_size)
    args = parser.parse_args(argv)
    if args.package_only is not None:
        print(build_package(args.checkpoint, args.package_only))
        return 0
    settings = PeerSettings(args.beam_size, args.compute_type, args.intra_threads,
                            args.inter_threads, args.http_threads, args.batch_size)
    with start(args.checkpoint, args.work, args.port, settings) as peer:
        print(f"LibreTranslate {peer.url} (pid {peer.pid}, warm in {peer.started_seconds:.1f} s; "
              f"log {peer.log}); Ctrl-C stops it", flush=True)
        # Blocked only now: the child started with the default handlers.
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        signal.sigwait({signal.SIGINT, signal.SIGTERM})
    return 0


if __name__ == "__main__":
    sys.exit(main())
