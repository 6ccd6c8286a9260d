"""Check an exported package against the PyTorch model it came from."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch

from seq2serve.export.onnx_graphs import sample_inputs
from seq2serve.model.package.manifest import (
    DECODER_FILE,
    ENCODER_INPUTS,
    MOVE_FILE,
    REORDER_FILE,
    SELECT_FILE,
    SHORTLIST_DECODER_FILE,
    decoder_inputs,
)
from seq2serve.model.package.session import EXACT_INT8_CONFIG
from seq2serve.model.package.shortlist import Projection, padded_candidates
from seq2serve.model.transformer import Seq2SeqTransformer


@dataclass
class Deviation:
    """Max abs differences between ONNX Runtime and PyTorch."""

    encoder: float
    cross_kv: float
    log_probs: float
    cache: float
    path_log_probs: float  # along PyTorch's greedy path (teacher forcing), every token
    argmax_flips: int  # steps where ORT's argmax leaves that path
    flip_margin: float  # the largest log-prob margin of such a flip (0.0: none)
    greedy_equal: bool  # decoding freely, the same tokens (informational: near-ties)
    greedy_rows: int
    alignment_equal: bool  # the decoder step's alignment output, ORT vs PyTorch
    finite: bool
    provider: str = "CPUExecutionProvider"

    def as_dict(self) -> dict[str, float | bool | int]:
        return dict(self.__dict__)


def cpu_session(path: Path, provider: str = "CPUExecutionProvider") -> ort.InferenceSession:

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    for key, value in EXACT_INT8_CONFIG.items():
        opts.add_session_config_entry(key, value)
    return ort.InferenceSession(str(path), opts, providers=[provider])


_NP_TYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16,
             "tensor(int64)": np.int64}


def feed(session: ort.InferenceSession, values: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Cast each input to the dtype the graph declares (fp16 graphs take fp16 caches)."""
    types = {i.name: _NP_TYPES.get(i.type) for i in session.get_inputs()}
    return {n: v.astype(types[n]) if types.get(n) else v for n, v in values.items()}


def _max_abs(ours: np.ndarray, ref: torch.Tensor) -> float:
    return float(np.abs(ours.astype(np.float32) - ref.numpy()).max())


def _decode(encoder: ort.InferenceSession, decoder: ort.InferenceSession,
            src_ids: np.ndarray, src_mask: np.ndarray, start_id: int, steps: int,
            choose: Callable[[int, np.ndarray], np.ndarray | None]) -> None:
    """Run the two graphs step by step; `choose(step, log_probs)` returns the next
    tokens (B,) or None to stop."""
    cross = encoder.run(None, feed(encoder, {"src_ids": src_ids, "src_mask": src_mask}))
    # Encoder outputs memory, cross_k.*, cross_v.*: decoder inputs of the same names.
    cross_kv = {o.name: v for o, v in zip(encoder.get_outputs(), cross, strict=True)
                if o.name != "memory"}
    b = src_ids.shape[0]
    _, heads, _, head_dim = cross_kv["cross_k.0"].shape
    # Each step is written at its own slot: the cache holds every step.
    empty = np.zeros((b, heads, steps, head_dim), dtype=cross_kv["cross_k.0"].dtype)
    cache = {i.name: empty for i in decoder.get_inputs() if i.name.startswith("self_")}
    cache_outputs = [o.name for o in decoder.get_outputs() if o.name.startswith("new_self_")]
    tokens: np.ndarray | None = np.full(b, start_id, dtype=np.int64)
    for step in range(steps):
        log_probs, *new_cache, _ = decoder.run(None, {
            "tokens": tokens, "positions": np.full(b, step, dtype=np.int64),
            **cache, **cross_kv, "src_mask": src_mask,
        })
        cache = {name.removeprefix("new_"): v
                 for name, v in zip(cache_outputs, new_cache, strict=True)}
        tokens = choose(step, log_probs)
        if tokens is None:
            return


def ort_greedy(encoder: ort.InferenceSession, decoder: ort.InferenceSession,
               src_ids: np.ndarray, src_mask: np.ndarray, *, start_id: int, eos_id: int,
               pad_id: int, max_len: int) -> np.ndarray:
    """Greedy decoding through the two graphs (a reference loop for verification;
    the server's engine is the fast path). Returns (B, <=max_len) like
    Seq2SeqTransformer.greedy."""
    done = np.zeros(src_ids.shape[0], dtype=bool)
    out: list[np.ndarray] = []

    def choose(_: int, log_probs: np.ndarray) -> np.ndarray | None:
        nonlocal done
        tokens = np.where(done, pad_id, log_probs.argmax(-1)).astype(np.int64)
        out.append(tokens)
        done = done | (tokens == eos_id)
        return None if done.all() else tokens

    _decode(encoder, decoder, src_ids, src_mask, start_id, max_len, choose)
    return np.stack(out, axis=1)


def ort_teacher_forced(encoder: ort.InferenceSession, decoder: ort.InferenceSession,
                       src_ids: np.ndarray, src_mask: np.ndarray, path: np.ndarray, *,
                       start_id: int) -> np.ndarray:
    """ONNX Runtime's log-probs (B, T, V) at every step of a given token path (B, T):
    step t is fed path[:, t-1], whatever the graph itself would have chosen."""
    out: list[np.ndarray] = []

    def choose(step: int, log_probs: np.ndarray) -> np.ndarray | None:
        out.append(log_probs.astype(np.float32))
        return path[:, step].astype(np.int64) if step + 1 < path.shape[1] else None

    _decode(encoder, decoder, src_ids, src_mask, start_id, path.shape[1], choose)
    return np.stack(out, axis=1)


def path_mask(path: np.ndarray, eos_id: int) -> np.ndarray:
    """(B, T) True up to and including each row's first EOS (padding after it)."""
    ended_before = np.cumsum(path == eos_id, axis=1) - (path == eos_id)
    valid: np.ndarray = ended_before == 0
    return valid


def argmax_flips(log_probs: np.ndarray, path: np.ndarray, valid: np.ndarray
                 ) -> tuple[int, float]:
    """Where a graph's argmax leaves the reference path: how often, and the largest
    margin by which it prefers its own token (0.0 when it never does). A flip
    inside the log-prob tolerance is a near-tie decided by float rounding, not a
    wrong graph."""
    chosen = log_probs.argmax(-1)  # (B, T)
    flips = (chosen != path) & valid
    if not flips.any():
        return 0, 0.0
    own = np.take_along_axis(log_probs, chosen[..., None], -1)[..., 0]
    ref = np.take_along_axis(log_probs, path[..., None], -1)[..., 0]
    return int(flips.sum()), float((own - ref)[flips].max())


def compare(model: Seq2SeqTransformer, encoder_path: Path, decoder_path: Path,
            sentences: list[list[int]], max_len: int = 32,
            provider: str = "CPUExecutionProvider") -> Deviation:
    """Run the same inputs through both; sentences are source token ids (with EOS).

    Greedy is checked by teacher forcing: ONNX Runtime's log-probs along
    PyTorch's greedy path (`path_log_probs`), and the steps where its argmax
    would leave that path with the margin it would leave it by
    (`argmax_flips`, `flip_margin`). Decoding freely, one near-tie flipped by
    rounding would make the two paths, and every later step, incomparable.
    """
    model = model.eval().float()
    encoder = cpu_session(encoder_path, provider)
    decoder = cpu_session(decoder_path, provider)
    enc_args, dec_args = sample_inputs(model, batch=3, beams=3, src_len=7, cached=4, seed=1)
    enc_feed = {s.name: t.numpy() for s, t in zip(ENCODER_INPUTS, enc_args, strict=True)}
    memory, *cross = encoder.run(None, feed(encoder, enc_feed))  # cross_k.*, cross_v.*
    layers = model.cfg.decoder_layers
    dec_feed = {s.name: t.numpy() for s, t
                in zip(decoder_inputs(layers), dec_args, strict=True)}
    # log_probs, new_self_k.*, new_self_v.*, alignment
    log_probs, *new_cache, alignment = decoder.run(None, feed(decoder, dec_feed))
    with torch.no_grad():
        ref_memory, ref_cross_k, ref_cross_v = model.encode(*enc_args)
        tokens, positions, *caches, step_mask = dec_args
        self_k, self_v, cross_k, cross_v = (caches[i * layers:(i + 1) * layers]
                                            for i in range(4))
        ref_log_probs, ref_new_k, ref_new_v, ref_alignment = model.decode_step(
            tokens, positions, self_k, self_v, cross_k, cross_v, step_mask)

    # A row's slots 0..position: what the step wrote and what later steps read. The
    # slots after it are masked; a graph that does not write the cache in place
    # need not carry them over (GroupQueryAttention copies only a row's past).
    written = (np.arange(new_cache[0].shape[2])[None, :]
               <= positions.numpy()[:, None])[:, None, :, None]  # (N, 1, T, 1)
    written = np.broadcast_to(written, new_cache[0].shape)
    cfg = model.cfg
    width = max(len(s) for s in sentences)
    src_ids = np.full((len(sentences), width), cfg.pad_id, dtype=np.int64)
    src_mask = np.zeros_like(src_ids)
    for i, s in enumerate(sentences):
        src_ids[i, : len(s)] = s
        src_mask[i, : len(s)] = 1
    ours = ort_greedy(encoder, decoder, src_ids, src_mask, start_id=cfg.decoder_start_id,
                      eos_id=cfg.eos_id, pad_id=cfg.pad_id, max_len=max_len)
    src_t, mask_t = torch.from_numpy(src_ids), torch.from_numpy(src_mask)
    with torch.no_grad():
        ref = model.greedy(src_t, mask_t, max_len)
        tgt_in = torch.cat([torch.full_like(ref[:, :1], cfg.decoder_start_id), ref[:, :-1]], 1)
        ref_path_lp = torch.log_softmax(model(src_t, mask_t, tgt_in).float(), -1).numpy()
    path = ref.numpy()
    path_lp = ort_teacher_forced(encoder, decoder, src_ids, src_mask, path,
                                 start_id=cfg.decoder_start_id)
    valid = path_mask(path, cfg.eos_id)
    flips, margin = argmax_flips(path_lp, path, valid)
    return Deviation(
        encoder=_max_abs(memory, ref_memory),
        cross_kv=max(map(_max_abs, cross, [*ref_cross_k, *ref_cross_v])),
        log_probs=_max_abs(log_probs, ref_log_probs),
        cache=max(float(np.abs(ours.astype(np.float32) - ref.numpy())[written].max())
                  for ours, ref in zip(new_cache, [*ref_new_k, *ref_new_v], strict=True)),
        path_log_probs=float(np.abs(path_lp - ref_path_lp)[valid].max()),
        argmax_flips=flips,
        flip_margin=margin,
        greedy_equal=ours.shape == path.shape and bool((ours == path).all()),
        greedy_rows=len(sentences),
        alignment_equal=bool((alignment == ref_alignment.numpy()).all()),
        finite=bool(np.isfinite(log_probs).all() and np.isfinite(memory).all()
                    and np.isfinite(path_lp).all()),
        provider=provider,
    )


def check_cache_graphs(package_dir: Path) -> None:
    """The reorder and move graphs must take and give the decoder's cache tensors
    (names, dtype) and move rows exactly, against numpy: reorder picks rows (moved,
    repeated, dropped); move rewrites the named rows and keeps the rest, a cycle
    included (rows read before any is written). The select graph must give each
    row's top k, as a sort does."""
    decoder = cpu_session(package_dir / DECODER_FILE)
    cache = {i.name: i.type for i in decoder.get_inputs() if i.name.startswith("self_")}
    rng = np.random.default_rng(0)
    values = {n: rng.standard_normal((5, 2, 3, 4)).astype(_NP_TYPES[t])
              for n, t in cache.items()}
    origin = np.array([3, 3, 0, 4], dtype=np.int64)
    moved = np.array([0, 1, 2], dtype=np.int64)
    moved_from = np.array([2, 0, 1], dtype=np.int64)  # a cycle: 0 <- 2 <- 1 <- 0
    for file, prefix, extra, expect in (
            (REORDER_FILE, "reordered_", {"beam_origin": origin}, lambda v: v[origin]),
            (MOVE_FILE, "moved_", {"moved_rows": moved[:, None], "moved_from": moved_from},
             lambda v: np.concatenate([v[moved_from], v[3:]]))):
        graph = cpu_session(package_dir / file)
        inputs = {i.name: i.type for i in graph.get_inputs()}
        wrong = {n: (t, inputs.get(n)) for n, t in cache.items() if inputs.get(n) != t}
        if wrong or len(inputs) != len(cache) + len(extra):
            raise ValueError(f"{file} does not match the decoder's cache inputs: {wrong}")
        outputs = graph.run(None, {**values, **extra})
        for out, name in zip(outputs, [o.name for o in graph.get_outputs()], strict=True):
            if not np.array_equal(out, expect(values[name.removeprefix(prefix)])):
                raise ValueError(f"{file} output {name} does not move the rows")
    # Rows as wide as the decoder's log-probs (the select graph may be built for that
    # width), else several chunks with a partial last one; ties, -inf, a flat row.
    width = next((o.shape[1] for o in decoder.get_outputs() if o.name == "log_probs"), None)
    width = width if isinstance(width, int) else 200
    log_probs = np.round(rng.standard_normal((4, width)) * 2).astype(np.float32) / 2
    log_probs[1, :5] = -np.inf
    log_probs[3] = 0.0
    select = cpu_session(package_dir / SELECT_FILE)
    for k in (1, 7, 40):
        top, ids = select.run(None, {"log_probs": log_probs, "k": np.array([k], dtype=np.int64)})
        order = np.argsort(-log_probs, axis=1, kind="stable")[:, :k]
        if not (np.array_equal(ids, order)
                and np.array_equal(top, np.take_along_axis(log_probs, order, axis=1))):
            raise ValueError(f"{SELECT_FILE} does not select each row's best log-probs "
                             f"(k = {k})")


def check_fp16(model: Seq2SeqTransformer, encoder_path: Path, decoder_path: Path,
               sentences: list[list[int]]) -> Deviation:
    """fp16 graphs are meant for CUDA; on a CPU-only machine ONNX Runtime's CPU
    provider runs them (slowly), which still measures the fp16 deviation."""
    provider = ("CUDAExecutionProvider" if "CUDAExecutionProvider"
                in ort.get_available_providers() else "CPUExecutionProvider")
    return compare(model, encoder_path, decoder_path, sentences, provider=provider)


def check_shortlist(package_dir: Path, projection: Projection, tolerance: float,
                    model: Seq2SeqTransformer | None = None) -> float:
    """The shortlist decoder against the full one on the same sample step: for
    candidate sets of several sizes (padded to one width, one source with none
    but the specials), each row's log-probs over its candidates must be the full
    decoder's renormalised over them (within `tolerance`), every padded slot
    -inf, and the cache and alignment outputs the full decoder's. With `model`,
    the same against PyTorch's decode_step (fp32 graphs). Returns the largest
    deviation; raises ValueError past the tolerance."""
    full = cpu_session(package_dir / DECODER_FILE)
    short = cpu_session(package_dir / SHORTLIST_DECODER_FILE)
    layers = sum(1 for i in full.get_inputs() if i.name.startswith("self_k."))
    feeds = _sample_step(full, layers)
    sources = feeds["src_mask"].shape[0]
    rows = feeds["tokens"].shape[0]
    beams = rows // sources
    vocab = projection.weight.shape[1]
    rng = np.random.default_rng(2)
    sets = [np.unique(rng.choice(vocab, size=max(1, vocab * (i + 1) // (2 * sources)),
                                 replace=False)) for i in range(sources)]
    sets[0] = np.arange(min(4, vocab))  # the specials alone
    candidates = padded_candidates(sets)
    weight, bias = projection.gather(candidates)
    outputs = [o.name for o in full.get_outputs()]
    want = dict(zip(outputs, full.run(None, feeds), strict=True))
    got = dict(zip(outputs, short.run(outputs, {**feeds, "shortlist_weight": weight,
                                                 "shortlist_bias": bias}), strict=True))
    references = [want["log_probs"]]
    if model is not None:
        with torch.no_grad():
            step = [torch.from_numpy(feeds[s.name].astype(np.float32)
                                     if feeds[s.name].dtype == np.float16 else feeds[s.name])
                    for s in decoder_inputs(layers)]
            tokens, positions, *caches, mask = step
            self_k, self_v, cross_k, cross_v = (caches[i * layers:(i + 1) * layers]
                                                for i in range(4))
            references.append(model.decode_step(tokens, positions, self_k, self_v, cross_k,
                                                cross_v, mask)[0].numpy())
    worst = 0.0
    for row in range(rows):
        ids = sets[row // beams]
        lp = got["log_probs"][row]
        if not np.all(np.isneginf(lp[ids.size:])):
            raise ValueError(f"{SHORTLIST_DECODER_FILE}: a padded candidate slot is not -inf")
        for ref in references:
            chosen = ref[row, ids].astype(np.float64)
            renormalised = chosen - np.logaddexp.reduce(chosen)
            worst = max(worst, float(np.abs(lp[:ids.size] - renormalised).max()))
    if not worst <= tolerance:
        raise ValueError(f"{SHORTLIST_DECODER_FILE}: log-probs over the candidates deviate "
                         f"by {worst:.3g} from the full decoder's renormalised over them "
                         f"(tolerance {tolerance:g})")
    for name in outputs[1:]:
        if not np.array_equal(got[name], want[name]):
            raise ValueError(f"{SHORTLIST_DECODER_FILE}: output {name} differs from "
                             f"{DECODER_FILE}'s")
    return worst


def _sample_step(decoder: ort.InferenceSession,
                 layers: int) -> dict[str, np.ndarray]:
    """A decoder step's inputs: three sources of two rows each at different
    positions, drawn caches and cross K/V, one padded source position."""
    rng = np.random.default_rng(1)
    types = {i.name: _NP_TYPES.get(i.type, np.float32) for i in decoder.get_inputs()}
    shapes = {i.name: i.shape for i in decoder.get_inputs()}
    heads, head_dim = shapes["self_k.0"][1], shapes["self_k.0"][3]
    if not isinstance(heads, int) or not isinstance(head_dim, int):
        raise ValueError(f"{DECODER_FILE}: the cache's head axes are not fixed sizes")
    sources, beams, src_len, slots = 3, 2, 7, 6
    n = sources * beams
    feeds: dict[str, np.ndarray] = {
        "tokens": rng.integers(4, 8, size=n).astype(np.int64),
        "positions": (np.arange(n) % (slots - 1)).astype(np.int64),
    }
    for i in range(layers):
        for name, shape in ((f"self_k.{i}", (n, heads, slots, head_dim)),
                            (f"self_v.{i}", (n, heads, slots, head_dim)),
                            (f"cross_k.{i}", (sources, heads, src_len, head_dim)),
                            (f"cross_v.{i}", (sources, heads, src_len, head_dim))):
            feeds[name] = rng.standard_normal(shape).astype(types[name])
    mask = np.ones((sources, src_len), dtype=np.int64)
    mask[-1, -2:] = 0
    feeds["src_mask"] = mask
    return feeds

