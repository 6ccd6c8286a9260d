"""`seq2serve summarize`: summarize text files on a running server.

    seq2serve summarize README.txt
    some-command | seq2serve summarize - --truncate

Each FILE (or standard input, "-") is one text, as it is (its line breaks as
written), but for its final line break (`\n` or `\r\n`), which ends its last line
and is not part of the text: `echo "$TEXT" | seq2serve summarize -` summarizes
$TEXT, as /summarize and gRPC given $TEXT do. The summaries print in FILE order,
one line each (with `--n-best N`, N > 1: one line per hypothesis and a blank line
between files).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import grpc

from seq2serve.server.client import (
    Seq2ServeClient,
    add_call_arguments,
    decoding_options,
    hypothesis_lines,
    report_rpc_error,
)

PROG = "seq2serve summarize"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("files", nargs="+", metavar="FILE",
                        help='a UTF-8 text file to summarize, "-" for standard input')
    parser.add_argument("--truncate", action="store_true",
                        help="cut inputs longer than the model's limit instead of failing")
    add_call_arguments(parser)


def run(args: argparse.Namespace) -> int:
    texts = []
    for name in args.files:
        try:
            texts.append(_without_final_break(_read(name)))
        except (OSError, UnicodeDecodeError) as error:
            print(f"{PROG}: error: cannot read {name}: {error}", file=sys.stderr)
            return 1
    n_best = bool(args.n_best and args.n_best > 1)
    try:
        with Seq2ServeClient(args.server, args.timeout) as client:
            if args.wait > 0:
                client.wait_until_serving(args.wait)
            summaries = client.summarize(texts, args.model, args.truncate,
                                         **decoding_options(args))
    except grpc.RpcError as error:
        return report_rpc_error(PROG, error)
    except TimeoutError as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return 1
    for i, (name, summary) in enumerate(zip(args.files, summaries, strict=True)):
        if summary.truncated:
            print(f"{PROG}: note: {name} was cut to the model's input limit", file=sys.stderr)
        if summary.hypotheses and summary.hypotheses[0].finish_reason == "length":
            print(f"{PROG}: note: {name}'s summary stopped at its length limit (max_length)",
                  file=sys.stderr)
        if n_best and i:
            print()
        print("\n".join(hypothesis_lines(summary.hypotheses, n_best, args.scores)))
    return 0


def _read(name: str) -> str:
    """The file's (or, for "-", standard input's) text, its line breaks untranslated
    (Python's text mode would turn a file's "\r\n" into "\n")."""
    if name != "-":
        return Path(name).read_bytes().decode("utf-8")
    stream = getattr(sys.stdin, "buffer", None)  # a test's StringIO has none
    return stream.read().decode("utf-8") if stream is not None else sys.stdin.read()


def _without_final_break(text: str) -> str:
    """The text without the line break that ends its last line, if it has one."""
    for ending in ("\r\n", "\n"):
        if text.endswith(ending):
            return text[:-len(ending)]
    return text
