"""Hugging Face generate() as the parity tests' reference: each source's n-best
under the folder's own generation settings, scored as the engine scores."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch


def reference_nbest(model: Any, batch: Mapping[str, Any],
                    **overrides: object) -> list[list[tuple[list[int], float]]]:
    """generate() under the folder's generation_config (plus `overrides`): per
    source its n-best (the tokens after the start, up to EOS; score): beam
    search's sequences_scores, or greedy's sum of the chosen tokens' log-probs,
    a forced token counting 0 (its processed log-prob, as the engine sums); under
    renormalize_logits, of generate()'s processed and renormalized scores. A
    multilingual model's target language is the override forced_bos_token_id (one
    per call: a batch of one target language)."""
    gen = model.generation_config
    n = int(overrides.get("num_return_sequences", 1))  # type: ignore[call-overload]
    with torch.no_grad():
        out = model.generate(**batch, output_scores=True, output_logits=True,
                             return_dict_in_generate=True, **overrides)
    eos = gen.eos_token_id
    seqs = out.sequences[:, 1:]
    if out.get("sequences_scores") is not None:
        scores = out.sequences_scores.tolist()
    elif overrides.get("renormalize_logits", gen.renormalize_logits) is True:
        # generate()'s own processed scores: log-softmax after every processor
        # (renormalize_logits), a forced token's 0 among them.
        chosen = torch.stack(out.scores, 1).gather(2, seqs[:, :, None])[..., 0]
        ended = torch.cumsum((seqs == eos).int(), 1) - (seqs == eos).int()
        # the padding after EOS is a banned token's -inf
        scores = torch.where(ended == 0, chosen, 0.0).sum(1).tolist()
    else:
        chosen = torch.stack(out.logits, 1).log_softmax(-1).gather(2, seqs[:, :, None])[..., 0]
        # generate()'s own rule: max_new_tokens, else max_length - 1, else 20 new tokens
        asked = overrides.get("max_new_tokens")
        limit = (int(asked) if asked is not None  # type: ignore[call-overload]
                 else gen.max_length - 1 if gen.max_length is not None else 20)
        if overrides.get("forced_bos_token_id", gen.forced_bos_token_id) is not None:
            chosen[:, 0] = 0.0
        if gen.forced_eos_token_id is not None and chosen.shape[1] == limit:
            chosen[:, limit - 1] = torch.where(seqs[:, limit - 1] == eos, 0.0,
                                               chosen[:, limit - 1])
        ended = torch.cumsum((seqs == eos).int(), 1) - (seqs == eos).int()
        scores = (chosen * (ended == 0)).sum(1).tolist()
    found = []
    for row in seqs.tolist():
        tokens = row[: row.index(eos)] if eos in row else row
        found.append(tokens)  # what follows EOS is padding; a pad before it was generated
    return [[(found[i * n + j], scores[i * n + j]) for j in range(n)]
            for i in range(len(found) // n)]


def reference_nbest_by_pair(model: Any, encode: Callable[[list[str], str], Mapping[str, Any]],
                            texts: Sequence[str], pairs: Sequence[tuple[str, int]],
                            **overrides: object) -> list[list[tuple[list[int], float]]]:
    """reference_nbest for a multilingual model's sources of several language pairs:
    text i in pairs[i] = (source language as its tokenizer's `src_lang`, target
    language token), one generate() call per pair (generate() takes one target
    language per call); the n-best lists in the texts' order. `encode(texts,
    src_lang)`: the padded batch the family's tokenizer makes."""
    found: dict[int, list[tuple[list[int], float]]] = {}
    for pair in dict.fromkeys(pairs):
        rows = [i for i, p in enumerate(pairs) if p == pair]
        batch = encode([texts[i] for i in rows], pair[0])
        nbest = reference_nbest(model, batch, forced_bos_token_id=pair[1], **overrides)
        found.update(zip(rows, nbest, strict=True))
    return [found[i] for i in range(len(texts))]
