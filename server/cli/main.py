"""The `seq2serve` console command.

Each subcommand lives in its own module exposing `configure(parser)` and
`run(args) -> int`. Modules are imported only when their subcommand runs, so
`seq2serve serve` never imports torch and `seq2serve --help` is instant.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "data": ("seq2serve.model.data.corpus", "build training corpora from Debian: "
             "translation and summarization from its translated package descriptions (DDTP), "
             "translation from the gettext message catalogs of its programs, and their mix"),
    "train": ("seq2serve.model.train.trainer", "train a tokenizer and a transformer on a corpus "
              "(resumable)"),
    # The families are listed by `seq2serve export --help` (model/families/registry.py),
    # which this module may not import: client commands never load the model side.
    "export": ("seq2serve.export.exporter", "export a seq2serve checkpoint, or a Hugging "
               "Face folder or hub id of a supported family (see its --help), to a "
               "verified ONNX model package"),
    "shortlist-gate": ("seq2serve.bench.quality.shortlist_gate", "decode test splits with a "
                       "package over its vocabulary shortlist and over the whole vocabulary: "
                       "BLEU, chrF and identical outputs, and whether the shortlist may be "
                       "on by default"),
    "check-package": ("seq2serve.model.package.placement", "list the nodes of model "
                      "packages an execution provider has no kernel for (they would run on "
                      "the CPU); exit 1 when there are any"),
    "serve": ("seq2serve.server.app", "serve model packages over gRPC (health, reflection, "
              "Prometheus metrics)"),
    "bench": ("seq2serve.bench.engine.harness", "benchmark the engine side by side with "
              "Hugging Face generate() and CTranslate2 (tokens/s, Markdown table, --json)"),
    "translate": ("seq2serve.server.cli.translate", "translate texts on a running seq2serve "
                  "server"),
    "translate-file": ("seq2serve.server.cli.translate_file", "translate a whole file (gettext "
                       ".po/.pot, XLIFF, .srt, .txt, .html) on a running seq2serve server; "
                       "translations are marked for review"),
    "summarize": ("seq2serve.server.cli.summarize", "summarize text files on a running "
                  "seq2serve server"),
    "health": ("seq2serve.server.cli.health", "exit 0 when a server's gRPC health service "
               "says SERVING, 1 otherwise (for container and load-balancer checks)"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="seq2serve",
        description="Train, export and serve encoder-decoder transformers for translation "
        "and summarization.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (_, help_text) in COMMANDS.items():
        sub.add_parser(name, help=help_text, add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in COMMANDS:
        build_parser().parse_args(argv)  # prints usage or help, exits
        return 2
    name, rest = argv[0], argv[1:]
    module_name, help_text = COMMANDS[name]
    module = importlib.import_module(module_name)
    parser = argparse.ArgumentParser(prog=f"seq2serve {name}", description=help_text)
    module.configure(parser)
    return int(module.run(parser.parse_args(rest)) or 0)


if __name__ == "__main__":
    sys.exit(main())
