"""A whole file's texts through a translate function, queued together so they batch.

The file's distinct texts are cut into chunks of at most one request's worth
(the server's `max_texts_per_request`) and up to `window` chunks are in flight
at once: enough to keep the scheduler's batches full, while the queue, and so
the memory of a 5,000-entry catalog, stays bounded. A chunk refused because the
queue is full (`busy`) is sent again after a short wait. A text longer than
`max_chars` is not sent: its entry is left as it was and counted as skipped.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

from seq2serve.server.core.documents.base import Document

TranslateTexts = Callable[[Sequence[str]], Awaitable[Sequence[str]]]
Progress = Callable[[int, int], None]  # (texts done, texts in all)

DEFAULT_WINDOW = 4
BUSY_RETRIES = 8
BUSY_WAIT_S = 0.1


async def translate_texts(texts: Sequence[str], translate: TranslateTexts, *, chunk_size: int,
                          max_chars: int | None = None, window: int = DEFAULT_WINDOW,
                          progress: Progress | None = None,
                          busy: Callable[[Exception], bool] = lambda e: False,
                          ) -> list[str | None]:
    """One translation per text (None: not sent, over `max_chars`); each distinct text
    is translated once, blank texts are their own translation."""
    if chunk_size < 1 or window < 1:
        raise ValueError(f"chunk_size and window must be >= 1, got {chunk_size}, {window}")
    distinct = [t for t in dict.fromkeys(texts) if t.strip()
                and (max_chars is None or len(t) <= max_chars)]
    chunks = [distinct[i:i + chunk_size] for i in range(0, len(distinct), chunk_size)]
    gate = asyncio.Semaphore(window)
    done = 0

    async def run(chunk: list[str]) -> Sequence[str]:
        nonlocal done
        async with gate:
            for attempt in range(BUSY_RETRIES + 1):
                try:
                    out = await translate(chunk)
                    break
                except Exception as e:
                    if attempt == BUSY_RETRIES or not busy(e):
                        raise
                    await asyncio.sleep(BUSY_WAIT_S * 2 ** attempt)
        if len(out) != len(chunk):
            raise RuntimeError(f"{len(chunk)} texts sent, {len(out)} translations came back")
        done += len(chunk)
        if progress is not None:
            progress(done, len(distinct))
        return out

    if progress is not None:
        progress(0, len(distinct))
    tasks = [asyncio.ensure_future(run(chunk)) for chunk in chunks]
    try:
        results = await asyncio.gather(*tasks)
    finally:  # one chunk failed: the others are not waited for
        for task in tasks:
            task.cancel()
    found = {t: out for chunk, outs in zip(chunks, results, strict=True)
             for t, out in zip(chunk, outs, strict=True)}
    return [found.get(t, t if not t.strip() else None) for t in texts]


async def translate_document(document: Document, translate: TranslateTexts, *,
                             chunk_size: int, max_chars: int | None = None,
                             window: int = DEFAULT_WINDOW, progress: Progress | None = None,
                             busy: Callable[[Exception], bool] = lambda e: False,
                             limit_setting: str = "the server's character limit") -> bytes:
    """The document written with its texts translated (see `translate_texts`);
    `limit_setting` names what raises `max_chars`, for the note on texts not sent."""
    translations = await translate_texts(document.texts, translate, chunk_size=chunk_size,
                                         max_chars=max_chars, window=window,
                                         progress=progress, busy=busy)
    skipped = sum(1 for t in translations if t is None)
    if skipped:
        document.tally.notes.append(f"{skipped} texts over {max_chars} characters not sent "
                                    f"(the limit is {limit_setting})")
    # Writing a large catalog takes a while: off the event loop, as its parsing is.
    return await asyncio.get_running_loop().run_in_executor(None, document.write, translations)
