"""`seq2serve translate-file --http URL`: the file as a document job on the server's
HTTP door (POST /v1/jobs), its progress polled (GET /v1/jobs/{id}) and shown, the
translated file downloaded. The server reads and writes the file (its document
limits apply) and keeps the job on disk, so a restart of the server does not lose it
(--jobs-dir); this side only waits.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from tqdm import tqdm  # type: ignore[import-untyped]  # tqdm ships no type information

POLL_S = 0.5  # between two looks at the job
FINISHED = ("done", "error")


class JobFailed(Exception):
    """The server refused the file or the job failed; the message is the server's."""


@dataclass(frozen=True)
class Translated:
    data: bytes
    name: str  # the file's name as the server wrote it (a .pot's is NAME.LANG.po)
    report: str


def translate_on_server(args: argparse.Namespace, path: Path) -> Translated:
    try:
        return _translate(args, path)
    except httpx.HTTPError as e:  # unreachable, a timeout, a broken answer
        raise JobFailed(f"{args.http}: {e}") from None


def _translate(args: argparse.Namespace, path: Path) -> Translated:
    fields: dict[str, Any] = {"source": args.source_language or "auto",
                              "target": args.target_language,
                              "overwrite": "true" if args.overwrite else "false"}
    software = args.software
    if software.protect_placeholders is not None:
        fields["protect_placeholders"] = "true" if software.protect_placeholders else "false"
    if software.glossary:
        fields["glossary"] = software.glossary
    if software.terms:
        fields["terms"] = json.dumps(dict(software.terms))
    if software.do_not_translate:
        fields["do_not_translate"] = list(software.do_not_translate)
    if args.api_key:
        fields["api_key"] = args.api_key
    with httpx.Client(base_url=args.http, timeout=args.timeout or 60.0) as http:
        job = _answer(http.post("/v1/jobs", data=fields,
                                files={"file": (path.name, path.read_bytes())}))
        with tqdm(unit="text", desc=path.name, file=sys.stderr,
                  disable=True if args.no_progress else None) as bar:
            while True:
                _show(bar, job)
                if job["state"] in FINISHED:
                    break
                time.sleep(POLL_S)
                job = _answer(http.get(f"/v1/jobs/{job['id']}"))
        if job["state"] == "error":
            raise JobFailed(str(job.get("error") or "the job failed"))
        download = http.get(job["translatedFileUrl"])
        _answer(download, json_body=False)
        return Translated(download.content, str(job["outputName"]), str(job["report"]))


def _show(bar: tqdm, job: dict[str, Any]) -> None:
    progress = job.get("progress") or {}
    total, done = int(progress.get("total") or 0), int(progress.get("done") or 0)
    if total:
        bar.total = total
        bar.update(done - bar.n)
    left = job.get("secondsRemaining")
    bar.set_postfix_str(f"{job['state']}" + (f", about {left} s left" if left is not None
                                             else ""))


def _answer(response: httpx.Response, json_body: bool = True) -> Any:
    if response.status_code >= 400:
        try:
            message = response.json().get("error") or response.text
        except ValueError:
            message = response.text
        raise JobFailed(f"HTTP {response.status_code}: {str(message)[:500]}")
    return response.json() if json_body else None
