"""`seq2serve health`: ask a server's gRPC health service whether it is SERVING.

Exit status 0 when it is, 1 for anything else (NOT_SERVING while models load or
while draining, an unknown service, no answer), so it drops straight into a
Docker `HEALTHCHECK`, a shell `until` loop or a load balancer's check script.
Docker reserves exit status 2, hence one failure status. One line is printed:
the status on stdout when SERVING, the reason on stderr otherwise.

The default server is read from the variables `serve` reads, SEQ2SERVE_HOST
(a wildcard means loopback) and SEQ2SERVE_PORT, so the image's HEALTHCHECK
follows however the container was configured.
"""

from __future__ import annotations

import argparse
import sys

import grpc

from seq2serve.server.client import Seq2ServeClient, default_target

PROG = "seq2serve health"
DEFAULT_TIMEOUT_S = 5.0


def configure(parser: argparse.ArgumentParser) -> None:
    target = default_target()
    parser.add_argument("--server", default=target, metavar="HOST:PORT",
                        help=f"the seq2serve server (default {target}, from $SEQ2SERVE_HOST "
                        "and $SEQ2SERVE_PORT when set)")
    parser.add_argument("--service", default="", metavar="NAME",
                        help="a service's status, e.g. seq2serve.v1.Translator (default: "
                        "the whole server)")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, metavar="S",
                        help=f"deadline of the check in seconds (default {DEFAULT_TIMEOUT_S:g})")


def run(args: argparse.Namespace) -> int:
    if not args.timeout > 0:
        print(f"{PROG}: error: --timeout must be > 0, got {args.timeout:g}", file=sys.stderr)
        return 1
    with Seq2ServeClient(args.server, timeout=args.timeout) as client:
        try:
            status = client.health(args.service)
        except grpc.RpcError as e:
            code = e.code().name if isinstance(e, grpc.Call) else "UNKNOWN"
            details = e.details() if isinstance(e, grpc.Call) else str(e)
            details = " ".join(str(details).split())  # one line, whatever gRPC said
            what = f"service {args.service!r}" if args.service else "server"
            print(f"{PROG}: {args.server} {what}: {code}: {details}", file=sys.stderr)
            return 1
    if status == "SERVING":
        print(status)
        return 0
    print(f"{PROG}: {args.server}: {status}", file=sys.stderr)
    return 1
