"""`seq2serve translate`: translate texts on a running server and print the results.

    seq2serve translate "Open the file" --from en --to de
    seq2serve translate - --model opus-mt-en-de < lines.txt > lines.de

One output line per input (standard input: one text per line); with
`--n-best N` (N > 1) the hypotheses of an input are one per line and inputs
are separated by a blank line.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from collections.abc import Iterator

import grpc

from seq2serve.server.client import (
    Seq2ServeClient,
    add_call_arguments,
    add_software_arguments,
    decoding_options,
    hypothesis_lines,
    report_rpc_error,
    software_text,
)

PROG = "seq2serve translate"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("text", nargs="+",
                        help='text to translate; "-" reads standard input, one text per line')
    parser.add_argument("--from", dest="source_language", metavar="LANG",
                        help="source language (with --to, picks the model when --model is "
                        "not given)")
    parser.add_argument("--to", dest="target_language", metavar="LANG",
                        help="target language")
    add_call_arguments(parser)
    add_software_arguments(parser)
    parser.add_argument("--batch-size", type=int, default=32, metavar="N",
                        help="texts per call (default 32)")


def run(args: argparse.Namespace) -> int:
    if args.batch_size < 1:
        print(f"{PROG}: error: --batch-size must be >= 1, got {args.batch_size}",
              file=sys.stderr)
        return 2
    try:
        software = software_text(args)
    except ValueError as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return 2
    n_best = bool(args.n_best and args.n_best > 1)
    first = True
    try:
        with Seq2ServeClient(args.server, args.timeout) as client:
            if args.wait > 0:
                client.wait_until_serving(args.wait)
            number = 0
            for batch in _batches(_texts(args.text), args.batch_size):
                for hyps in client.translate(batch, args.model, args.source_language,
                                             args.target_language, software,
                                             **decoding_options(args)):
                    if n_best and not first:
                        print()
                    first = False
                    print("\n".join(hypothesis_lines(hyps, n_best, args.scores)), flush=True)
                    number += 1
                    if hyps and hyps[0].finish_reason == "length":
                        print(f"{PROG}: note: text {number} stopped at its length limit "
                              "(max_length): its translation is cut", file=sys.stderr)
    except grpc.RpcError as error:
        return report_rpc_error(PROG, error)
    except TimeoutError as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return 1
    return 0


def _texts(arguments: list[str]) -> Iterator[str]:
    for text in arguments:
        if text == "-":
            # Lazily, so a pipe's first results print before its last line is read.
            yield from (line.rstrip("\n") for line in sys.stdin)
        else:
            yield text


def _batches(texts: Iterator[str], size: int) -> Iterator[list[str]]:
    while batch := list(itertools.islice(texts, size)):
        yield batch
