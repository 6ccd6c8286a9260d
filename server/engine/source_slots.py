"""The cross K/V of a running batch: one slot per source, kept on the host.

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

The host arrays are the single copy: on CPU the OrtValues the decoder reads
wrap them (no copy); on CUDA they are uploaded when the slots change (an
admission or a compaction, not per step). The source axis is always a whole
number of SOURCE_WIDTH_MULTIPLE blocks, and a row's padded positions are
masked, so a source's floats do not depend on its slot, its neighbours or the
width (see runner.py).

A shortlist batch's slots also keep each source's candidates and their
projection columns (runner.ShortlistColumns), on a candidate axis of whole
WIDTH_MULTIPLE blocks: a newcomer with more candidates widens it (padding
-inf, never chosen, adding nothing to the normalisation), a compaction trims it.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnxruntime as ort

from seq2serve.model.package.shortlist import PAD_CANDIDATE, padded_candidates
from seq2serve.server.engine.runner import EncoderState, ShortlistColumns, padded_width

# Compact once holes * COMPACT_WHEN > used slots.
COMPACT_WHEN = 4


class SourceSlots:
    def __init__(self, to_device: Callable[[np.ndarray], ort.OrtValue]):
        self._to_device = to_device
        self.reset()

    def reset(self) -> None:
        self._k: list[np.ndarray] = []  # per layer (capacity, H, W, Dh)
        self._v: list[np.ndarray] = []
        self._mask = np.zeros((0, 0), dtype=np.int64)  # (capacity, W)
        self._lengths = np.zeros(0, dtype=np.int64)  # (capacity,) 0 marks a hole
        # A shortlist batch's: (capacity, C) ids, (capacity, D, C) columns, (capacity, C) bias.
        self._candidates: np.ndarray | None = None
        self._columns: np.ndarray | None = None
        self._bias: np.ndarray | None = None
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
        return int(self._mask.shape[1])

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
        width = enc.width
        for stored, values in ((self._k, enc.cross_k), (self._v, enc.cross_v)):
            for array, value in zip(stored, values, strict=True):
                array[slots, :, :width] = value.numpy()
                array[slots, :, width:] = 0
        self._mask[slots] = 0
        self._mask[slots, :width] = enc.src_mask.numpy()
        self._lengths[slots] = enc.lengths
        if enc.shortlist is not None:
            self._place_shortlist(slots, used, enc.shortlist)
        self.used = used
        self._view = None
        return slots

    def release(self, slots: np.ndarray) -> None:
        """The sources in these slots left; trailing holes leave the call at once."""
        if slots.size == 0:
            return
        self._lengths[slots] = 0
        live = np.flatnonzero(self._lengths[:self.used])
        self.used = int(live[-1]) + 1 if live.size else 0
        self._view = None

    def compact(self) -> np.ndarray:
        """Move the live sources to the lowest slots, in order, and trim the
        source axis to the longest of them. Returns each old slot's new slot
        (-1 for a hole)."""
        live = np.flatnonzero(self._lengths[:self.used])
        moved = np.full(self.used, -1, dtype=np.int64)
        moved[live] = np.arange(live.size)
        width = padded_width(int(self._lengths[live].max())) if live.size else 0
        self._k = [a[live, :, :width] for a in self._k]  # fancy indexing: fresh arrays
        self._v = [a[live, :, :width] for a in self._v]
        self._mask = self._mask[live, :width]
        self._lengths = self._lengths[live]
        if self._candidates is not None and self._columns is not None \
                and self._bias is not None:
            own = (self._candidates[live] != PAD_CANDIDATE).sum(axis=1)
            cols = padded_candidates([], int(own.max()) if own.size else 0).shape[1]
            self._candidates = self._candidates[live, :cols]
            self._columns = self._columns[live, :, :cols]
            self._bias = self._bias[live, :cols]
        self.used = int(live.size)
        self._view = None
        return moved

    # -- what the decoder reads ----------------------------------------------------------

    def encoder_state(self) -> EncoderState:
        """Slots [0, used) as the decoder's inputs (cached until the slots change)."""
        if self._view is None:
            used = self.used
            shortlist = None
            if self._candidates is not None and self._columns is not None \
                    and self._bias is not None:
                shortlist = ShortlistColumns(self._candidates[:used].copy(),
                                             self._to_device(self._columns[:used]),
                                             self._to_device(self._bias[:used]))
            self._view = EncoderState(
                tuple(self._to_device(a[:used]) for a in self._k),
                tuple(self._to_device(a[:used]) for a in self._v),
                self._to_device(self._mask[:used]), self._lengths[:used].copy(), shortlist)
        return self._view

    def _place_shortlist(self, slots: np.ndarray, used: int, new: ShortlistColumns) -> None:
        """Write the newcomers' candidates and columns into their slots, widening
        the candidate axis (or the slots, as `_reserve` did the rest) first."""
        capacity = int(self._lengths.shape[0])
        columns, bias = new.weight.numpy(), new.bias.numpy()
        width = max(new.width, 0 if self._candidates is None else self._candidates.shape[1])
        if (self._candidates is None or self._columns is None or self._bias is None
                or self._candidates.shape != (capacity, width)):
            candidates = np.full((capacity, width), PAD_CANDIDATE, dtype=np.int64)
            stored = np.zeros((capacity, columns.shape[1], width), dtype=columns.dtype)
            biases = np.full((capacity, width), -np.inf, dtype=np.float32)
            if self._candidates is not None and self._columns is not None \
                    and self._bias is not None:
                rows, old = min(self.used, capacity), self._candidates.shape[1]
                candidates[:rows, :old] = self._candidates[:rows]
                stored[:rows, :, :old] = self._columns[:rows]
                biases[:rows, :old] = self._bias[:rows]
            self._candidates, self._columns, self._bias = candidates, stored, biases
        cols = new.width
        self._candidates[slots] = PAD_CANDIDATE
        self._candidates[slots, :cols] = new.candidates
        self._columns[slots] = 0
        self._columns[slots, :, :cols] = columns
        self._bias[slots] = -np.inf
        self._bias[slots, :cols] = bias

    def _reserve(self, used: int, width: int, like: EncoderState) -> None:
        """Room for `used` slots at `width`: a new allocation (doubling the
        capacity) and one copy of the slots in use when either grows."""
        capacity = int(self._lengths.shape[0])
        if used <= capacity and width == self.width:
            return
        capacity = max(used, 2 * capacity) if used > capacity else capacity

        def grown(old: np.ndarray | None, value: ort.OrtValue) -> np.ndarray:
            _, heads, _, dim = value.shape()
            dtype = old.dtype if old is not None else value.numpy().dtype
            new = np.zeros((capacity, heads, width, dim), dtype=dtype)
            if old is not None and self.used:
                new[:self.used, :, :old.shape[2]] = old[:self.used]
            return new

        self._k = [grown(self._k[i] if self._k else None, v) for i, v in enumerate(like.cross_k)]
        self._v = [grown(self._v[i] if self._v else None, v) for i, v in enumerate(like.cross_v)]
        mask = np.zeros((capacity, width), dtype=np.int64)
        mask[:self.used, :self.width] = self._mask[:self.used]
        lengths = np.zeros(capacity, dtype=np.int64)
        lengths[:self.used] = self._lengths[:self.used]
        self._mask, self._lengths = mask, lengths
