"""The cross K/V of a running batch: one slot per source, kept in device memory.

The decoder graph groups its rows by source (K consecutive rows per source for
cross-attention), so the cross K/V tensors (per layer (B, H, S, Dh)) must hold
one entry per row group. A source takes a slot when it is admitted and keeps it
until it leaves; a source that leaves makes a hole, and the next newcomer's
encoder output is written into that hole. So an admission writes only the
newcomers' K/V and a departure writes nothing. (Joining and selecting whole
tensors instead, every departure copied every live source's K/V and every
admission copied them again: 40% of a running batch's time at 32 live greedy
sources on 2 cores.)

A hole still has K rows in the decoder call (idle rows whose outputs nobody
reads) until it is filled; once holes are more than a quarter of the slots,
`compact()` moves the live sources to the lowest slots in one copy and trims
the source axis to the longest of them.

The slots live where the encoder wrote them (device.py's Memory): on CPU host
arrays the decoder reads without a copy, on a device tensors that never cross
to the host: a newcomer is written in, a compaction gathers, and the decoder's
view takes the first slots, each by a small graph on the device. Only the
sources' lengths (and a shortlist's candidate ids) are kept on the host. The
source axis is always a whole number of SOURCE_WIDTH_MULTIPLE blocks, and a
row's padded positions are masked, so a source's floats do not depend on its
slot, its neighbours or the width (see runner.py).

A shortlist batch's slots also keep each source's candidates and their
projection columns (runner.ShortlistColumns), on a candidate axis of whole
WIDTH_MULTIPLE blocks: a newcomer with more candidates widens it (padding
-inf, never chosen, adding nothing to the normalisation), a compaction trims it.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort

from seq2serve.model.package.shortlist import PAD_CANDIDATE, padded_candidates
from seq2serve.server.engine.device import Memory, numpy_type
from seq2serve.server.engine.runner import EncoderState, ShortlistColumns, padded_width

# Compact once holes * COMPACT_WHEN > used slots.
COMPACT_WHEN = 4


class SourceSlots:
    def __init__(self, memory: Memory):
        self._memory = memory
        self.reset()

    def reset(self) -> None:
        self._k: list[ort.OrtValue] = []  # per layer (capacity, H, W, Dh)
        self._v: list[ort.OrtValue] = []
        self._mask: ort.OrtValue | None = None  # (capacity, W) int64
        self._width = 0
        self._lengths = np.zeros(0, dtype=np.int64)  # (capacity,) 0 marks a hole
        # A shortlist batch's: (capacity, C) ids on the host, (capacity, D, C)
        # columns and (capacity, C) bias in device memory.
        self._candidates: np.ndarray | None = None
        self._columns: ort.OrtValue | None = None
        self._bias: ort.OrtValue | None = None
        self.used = 0  # slots [0, used) are in the decoder call
        self._view: EncoderState | None = None

    # -- plain numbers -----------------------------------------------------------------

    @property
    def live(self) -> int:
        return int(np.count_nonzero(self._lengths[:self.used]))

    @property
    def holes(self) -> int:
        return self.used - self.live

    @property
    def width(self) -> int:
        return self._width

    def should_compact(self) -> bool:
        return self.holes * COMPACT_WHEN > self.used

    # -- changes -----------------------------------------------------------------------

    def place(self, enc: EncoderState) -> np.ndarray:
        """Write enc's sources into the lowest holes, then new slots at the end;
        returns their slots (B,)."""
        count = enc.sources
        holes = np.flatnonzero(self._lengths[:self.used] == 0)[:count]
        slots = np.concatenate([holes, np.arange(self.used, self.used + count - holes.size)])
        used = max(self.used, int(slots.max()) + 1)
        self._reserve(used, max(self.width, enc.width), enc)
        put = self._memory.put
        self._k = [put(store, slots, new) for store, new in zip(self._k, enc.cross_k,
                                                                strict=True)]
        self._v = [put(store, slots, new) for store, new in zip(self._v, enc.cross_v,
                                                                strict=True)]
        assert self._mask is not None
        self._mask = put(self._mask, slots, enc.src_mask)
        self._lengths[slots] = enc.lengths
        if enc.shortlist is not None:
            self._place_shortlist(slots, enc.shortlist)
        self.used = used
        self._view = None
        return slots

    def release(self, slots: np.ndarray) -> None:
        """The sources in these slots left; trailing holes leave the call at once."""
        if slots.size == 0:
            return
        self._lengths[slots] = 0
        live = np.flatnonzero(self._lengths[:self.used])
        used = int(live[-1]) + 1 if live.size else 0
        if used != self.used:  # else the decoder's view stays as it is
            self.used = used
            self._view = None

    def compact(self) -> np.ndarray:
        """Move the live sources to the lowest slots, in order, and trim the
        source axis to the longest of them. Returns each old slot's new slot
        (-1 for a hole)."""
        live = np.flatnonzero(self._lengths[:self.used])
        moved = np.full(self.used, -1, dtype=np.int64)
        moved[live] = np.arange(live.size)
        width = padded_width(int(self._lengths[live].max())) if live.size else 0
        m = self._memory
        self._k = [m.take(a, live, 2, width) for a in self._k]  # one copy each
        self._v = [m.take(a, live, 2, width) for a in self._v]
        assert self._mask is not None
        self._mask = m.take(self._mask, live, 1, width)
        self._width = width
        self._lengths = self._lengths[live]
        if self._candidates is not None and self._columns is not None \
                and self._bias is not None:
            own = (self._candidates[live] != PAD_CANDIDATE).sum(axis=1)
            cols = padded_candidates([], int(own.max()) if own.size else 0).shape[1]
            self._candidates = self._candidates[live, :cols]
            self._columns = m.take(self._columns, live, 2, cols)
            self._bias = m.take(self._bias, live, 1, cols)
        self.used = int(live.size)
        self._view = None
        return moved

    # -- what the decoder reads ----------------------------------------------------------

    def encoder_state(self) -> EncoderState:
        """Slots [0, used) as the decoder's inputs (cached until the slots change)."""
        if self._view is None:
            used = self.used
            head = self._memory.head
            shortlist = None
            if self._candidates is not None and self._columns is not None \
                    and self._bias is not None:
                shortlist = ShortlistColumns(self._candidates[:used].copy(),
                                             head(self._columns, used),
                                             head(self._bias, used))
            assert self._mask is not None
            self._view = EncoderState(
                tuple(head(a, used) for a in self._k), tuple(head(a, used) for a in self._v),
                head(self._mask, used), self._lengths[:used].copy(), shortlist)
        return self._view

    def _place_shortlist(self, slots: np.ndarray, new: ShortlistColumns) -> None:
        """Write the newcomers' candidates and columns into their slots, widening
        the candidate axis (or the slots, as `_reserve` did the rest) first."""
        m = self._memory
        capacity = int(self._lengths.shape[0])
        width = max(new.width, 0 if self._candidates is None else self._candidates.shape[1])
        if self._candidates is None or self._columns is None or self._bias is None:
            dim = new.weight.shape()[1]
            self._candidates = np.full((capacity, width), PAD_CANDIDATE, dtype=np.int64)
            self._columns = m.zeros((capacity, dim, width), numpy_type(new.weight))
            self._bias = m.resize(m.zeros((capacity, 0), np.float32), 1, width, -np.inf)
        if self._candidates.shape != (capacity, width):
            candidates = np.full((capacity, width), PAD_CANDIDATE, dtype=np.int64)
            rows, old = min(self._candidates.shape[0], capacity), self._candidates.shape[1]
            candidates[:rows, :old] = self._candidates[:rows]
            self._candidates = candidates
            dim = self._columns.shape()[1]
            self._columns = m.fit(self._columns, (capacity, dim, width))
            self._bias = m.fit(self._bias, (capacity, width), -np.inf)
        self._candidates[slots] = PAD_CANDIDATE
        self._candidates[slots, :new.width] = new.candidates
        self._columns = m.put(self._columns, slots, new.weight)
        self._bias = m.put(self._bias, slots, new.bias, -np.inf)

    def _reserve(self, used: int, width: int, like: EncoderState) -> None:
        """Room for `used` slots at `width`: a new allocation (doubling the
        capacity) and one copy of the slots when either grows."""
        capacity = int(self._lengths.shape[0])
        if used <= capacity and width == self.width:
            return
        capacity = max(used, 2 * capacity) if used > capacity else capacity
        m = self._memory

        def grown(old: ort.OrtValue | None, value: ort.OrtValue) -> ort.OrtValue:
            if old is None:
                _, heads, _, dim = value.shape()
                return m.zeros((capacity, heads, width, dim), numpy_type(value))
            _, heads, _, dim = old.shape()
            return m.fit(old, (capacity, heads, width, dim))

        self._k = [grown(self._k[i] if self._k else None, v) for i, v in enumerate(like.cross_k)]
        self._v = [grown(self._v[i] if self._v else None, v) for i, v in enumerate(like.cross_v)]
        self._mask = m.zeros((capacity, width), np.int64) if self._mask is None \
            else m.fit(self._mask, (capacity, width))
        self._width = width
        lengths = np.zeros(capacity, dtype=np.int64)
        lengths[:self.used] = self._lengths[:self.used]
        self._lengths = lengths
