"""`seq2serve summarize`: summarize text files on a running server.

    seq2serve summarize README.txt
    some-command | seq2serve summarize - --truncate

Each FILE (or standard input, "-") is one text; the summaries print in FILE
order, one line each (with `--n-best N`, N > 1: one line per hypothesis and a
blank line between files).
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
            texts.append(sys.stdin.read() if name == "-"
                         else Path(name).read_text(encoding="utf-8"))
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
        if n_best and i:
            print()
        print("\n".join(hypothesis_lines(summary.hypotheses, n_best, args.scores)))
    return 0
