"""Which models are loaded, while the server runs: states, leases, a memory budget.

Each served model (registry.ModelHandle) is in one state (`ModelState`): available
(found and verified, not loaded), loading, ready, unloading, or failed (with its
error). A request holds a lease on every model of its route (both legs of a chain)
from admission to its answer (`lease`): a model with a lease is never unloaded
under it. A request for a model that is not loaded loads it and waits, up to
`wait_s` (then Unavailable: 503 with Retry-After), while other models answer.

With a budget, loading a model whose cost (known from its files and engines before
it loads: assembly.package_cost) would pass it unloads the least recently used idle
models first; when the models with leases hold too much, the load is refused at once
(OverBudget naming the budget: gRPC RESOURCE_EXHAUSTED, HTTP 503 with Retry-After),
never queued. There is a budget per resource (`Resource`): host memory
(`--max-model-memory`) and the device's (`--max-device-memory`, for models whose
provider is a device), each model costing its own bytes of each; one arithmetic
keeps them all, and unloads only models that free a resource that is short. A model
counts from the moment it starts loading until it is really unloaded: one an
operator or a rescan unloads (removed from the registry's listing meanwhile) still
counts while its last requests finish.

Loads and unloads run one at a time on one thread of their own (ONNX Runtime work
blocks), so the budget's arithmetic never sees two at once; the states are kept
under one lock, read by the event loop and the control calls. Waiting is on
concurrent futures, which any event loop (and a plain thread) can await.

An operator's unload (the control API, a package removed from disk) holds the model
out: requests for it are refused until it is loaded again, and it is unloaded once
its last lease ends, so a stream in flight finishes first.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from enum import Enum
from typing import Generic, Protocol, TypeVar

from seq2serve.server.batching.scheduler import Scheduler
from seq2serve.server.batching.worker import ModelWorker
from seq2serve.server.core.errors import DeadlineExceeded, OverBudget, Unavailable

log = logging.getLogger("seq2serve.server")
# How long a request waits for its model to load before it is told to retry.
DEFAULT_WAIT_S = 60.0


class ModelState(str, Enum):
    AVAILABLE = "available"  # found and verified; loaded when asked
    LOADING = "loading"
    READY = "ready"
    UNLOADING = "unloading"  # waits for its requests to finish, then unloads
    FAILED = "failed"  # would not load; its error says why


RESIDENT = (ModelState.LOADING, ModelState.READY, ModelState.UNLOADING)


class Resource(Enum):
    """What a budget holds; the value says it in a refusal."""

    HOST = "memory"  # the process's memory: every model's `cost`
    DEVICE = "device memory"  # the device's (--device-id): a model's `device_cost`

    @property
    def option(self) -> str:
        """The setting of its budget (server/config.py's flag; its test holds them equal)."""
        return "--max-model-memory" if self is Resource.HOST else "--max-device-memory"

    def cost(self, handle: Resident) -> int:
        return handle.cost if self is Resource.HOST else handle.device_cost


@dataclass(frozen=True)
class Loaded:
    """What a loaded model runs on: its queue and one worker per engine."""

    scheduler: Scheduler
    workers: tuple[ModelWorker, ...]


class Resident(Protocol):
    """What residency reads and keeps of a served model (registry.ModelHandle has it:
    a protocol, so that the registry imports this module and not the other way)."""

    name: str
    cost: int  # bytes of host memory it holds once loaded
    device_cost: int  # bytes of the device's memory it holds (0: not on a device)
    loaded: Loaded | None
    state: ModelState
    error: str
    leases: int
    last_used: float
    held_out: bool


H = TypeVar("H", bound=Resident)


def _no_build(handle: Resident) -> Loaded:
    raise Unavailable(f"model {handle.name!r} cannot be loaded: this server has no loader")


def _no_stop(handle: Resident, loaded: Loaded) -> None:
    for worker in loaded.workers:
        worker.stop(drain=True, timeout=None)


class Residency(Generic[H]):
    """The models' states and leases (see the module docstring). `build` and `stop`
    are the assembly's (engines are built there); `changed` is told of every state
    change (the registry's generation, the metrics)."""

    def __init__(self, handles: Callable[[], Iterable[H]],
                 changed: Callable[[H], None]) -> None:
        self._handles = handles
        self._changed = changed
        self._lock = threading.RLock()
        self._jobs = ThreadPoolExecutor(1, thread_name_prefix="seq2serve-models")
        self._loads: dict[int, Future[None]] = {}  # id(handle): its pending load
        # id(handle): each model loading, ready or unloading, whether the registry still
        # lists it or not (a rescan removes a model before its requests finish).
        self._held: dict[int, H] = {}
        self.build: Callable[[H], Loaded] = _no_build
        self.stop: Callable[[H, Loaded], None] = _no_stop
        # Called once an unloaded model's memory is freed (the assembly hands the heap
        # back to the system).
        self.freed: Callable[[], None] = lambda: None
        # Bytes the loaded models may hold of each resource; absent or 0 = no budget.
        self.budgets: dict[Resource, int] = {}
        self.wait_s = DEFAULT_WAIT_S

    # -- what is held ------------------------------------------------------------------

    def held(self) -> list[H]:
        """The models loading, ready or unloading (listed by the registry or not)."""
        with self._lock:
            return list(self._held.values())

    def resident(self, resource: Resource = Resource.HOST) -> int:
        """The bytes of `resource` the loaded (and loading, and unloading) models hold,
        by their costs."""
        with self._lock:
            return sum(resource.cost(h) for h in self._held.values())

    def short_of(self, handle: H) -> Resource | None:
        """The first resource whose budget `handle` would pass beside the models held
        now (none unloaded); None when it fits every budget."""
        with self._lock:
            shortfalls = self._shortfalls(handle)
        return next(iter(shortfalls), None)

    def _shortfalls(self, handle: H) -> dict[Resource, int]:
        """Per resource whose budget `handle` would pass: the bytes short."""
        short = {}
        for resource, budget in self.budgets.items():
            if budget and resource.cost(handle):
                need = self.resident(resource) + resource.cost(handle) - budget
                if need > 0:
                    short[resource] = need
        return short

    def _set(self, handle: H, state: ModelState, error: str = "") -> None:
        handle.state, handle.error = state, error
        if state in RESIDENT:
            self._held[id(handle)] = handle
        else:
            self._held.pop(id(handle), None)
        self._changed(handle)

    # -- requests ----------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def lease(self, handles: Sequence[H],
                    deadline: float | None = None) -> AsyncIterator[None]:
        """Hold `handles` loaded for a request: each loaded first where it is not
        (waiting up to `wait_s`, or the deadline), none unloaded until this ends."""
        unique = list({id(h): h for h in handles}.values())
        loads = self._acquire(unique)
        try:
            for handle, load in loads:
                await self._wait(handle, load, deadline)
            yield
        finally:
            self._release(unique)

    def _acquire(self, handles: Sequence[H]
                 ) -> list[tuple[H, Future[None]]]:
        with self._lock:
            for handle in handles:
                _check_servable(handle)
            now = time.monotonic()
            for handle in handles:
                handle.leases += 1
                handle.last_used = now
            try:
                return [(h, self._submit_load(h)) for h in handles
                        if h.state is not ModelState.READY]
            except Unavailable:  # stopping: no lease is kept
                self._release(handles)
                raise

    def _release(self, handles: Sequence[H]) -> None:
        with self._lock:
            now = time.monotonic()
            for handle in handles:
                handle.leases -= 1
                handle.last_used = now
                if handle.leases == 0 and handle.held_out \
                        and handle.state is ModelState.UNLOADING:
                    with contextlib.suppress(Unavailable):  # stopping: close() unloads all
                        self._submit(self._unload_job, handle)

    async def _wait(self, handle: H, load: Future[None],
                    deadline: float | None) -> None:
        timeout = self.wait_s
        by_deadline = deadline is not None and deadline - time.monotonic() < timeout
        if deadline is not None:
            timeout = min(timeout, max(0.0, deadline - time.monotonic()))
        try:
            await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(load)), timeout)
        except asyncio.TimeoutError:
            if by_deadline:
                raise DeadlineExceeded(f"the deadline passed while model {handle.name!r} "
                                       "loaded") from None
            raise Unavailable(f"model {handle.name!r} is still loading (waited "
                              f"{self.wait_s:g} s, --load-wait-s); retry shortly") from None

    # -- the control calls -------------------------------------------------------------

    def load(self, handle: H) -> Future[None]:
        """Load `handle` (again, after a failure or an operator's unload); the future
        ends when it is ready (or raises why not)."""
        with self._lock:
            handle.held_out = False
            if handle.state is ModelState.FAILED:
                self._set(handle, ModelState.AVAILABLE)
            return self._submit_load(handle)

    def unload(self, handle: H) -> Future[None]:
        """Hold `handle` out and unload it once its requests have finished; the
        future ends when this job has run (the model may still wait for its leases:
        its state then says unloading)."""
        with self._lock:
            handle.held_out = True
            return self._submit(self._unload_job, handle)

    def close(self) -> None:
        """Stop taking jobs; the one running finishes."""
        self._jobs.shutdown(wait=True, cancel_futures=True)

    # -- the jobs (on the one jobs thread) ----------------------------------------------

    def _submit(self, job: Callable[[H], None], handle: H) -> Future[None]:
        try:
            return self._jobs.submit(job, handle)
        except RuntimeError:  # closed: the server is stopping
            raise Unavailable("the server is shutting down; retry on another replica") from None

    def _submit_load(self, handle: H) -> Future[None]:
        pending = self._loads.get(id(handle))
        if pending is not None and not pending.done():
            return pending
        future = self._submit(self._load_job, handle)
        self._loads[id(handle)] = future
        future.add_done_callback(lambda _: self._forget(handle, future))
        return future

    def _forget(self, handle: H, future: Future[None]) -> None:
        with self._lock:
            if self._loads.get(id(handle)) is future:
                del self._loads[id(handle)]

    def _load_job(self, handle: H) -> None:
        with self._lock:
            if handle.state is ModelState.READY:
                return
            _check_servable(handle)
            if handle.state is ModelState.UNLOADING and handle.loaded is not None:
                self._set(handle, ModelState.READY)  # loaded again before it went
                return
            victims = self._victims(handle)
            for victim in victims:
                self._set(victim, ModelState.UNLOADING)
        for victim in victims:  # gone before the new one takes their memory
            log.info("unloading %s (least recently used, idle) to fit %s in the memory "
                     "budget", victim.name, handle.name)
            self._stop_now(victim)
        with self._lock:
            self._set(handle, ModelState.LOADING)
        try:
            loaded = self.build(handle)
        except Exception as e:  # noqa: BLE001 - any failure is this model's, not the server's
            error = " ".join(str(e).split()) or type(e).__name__
            log.error("model %s failed to load: %s", handle.name, error)
            with self._lock:
                self._set(handle, ModelState.FAILED, error)
            raise Unavailable(f"model {handle.name!r} failed to load: {error}") from None
        with self._lock:
            handle.loaded = loaded
            self._set(handle, ModelState.READY)

    def _victims(self, handle: H) -> list[H]:
        """The least recently used idle models to unload so that `handle` fits every
        budget (each one frees some of a resource that is short); OverBudget naming
        the budget when those cannot free enough."""
        needs = self._shortfalls(handle)
        if not needs:
            return []
        idle = sorted((h for h in self._handles() if h is not handle
                       and h.state is ModelState.READY and h.leases == 0),
                      key=lambda h: h.last_used)
        chosen: list[H] = []
        for victim in idle:
            if not any(need > 0 and r.cost(victim) for r, need in needs.items()):
                continue  # frees nothing that is short
            chosen.append(victim)
            needs = {r: need - r.cost(victim) for r, need in needs.items()}
        for resource, need in needs.items():
            if need > 0:
                raise OverBudget(self._refusal(handle, resource))
        return chosen

    def _refusal(self, handle: H, resource: Resource) -> str:
        budget, cost = self.budgets[resource], resource.cost(handle)
        named = f"the {resource.value} budget of {budget} bytes ({resource.option})"
        if cost > budget:
            return (f"model {handle.name!r} needs {cost} bytes of {resource.value}, more "
                    f"than {named}: raise it, or serve a smaller package")
        busy = sorted(h.name for h in self._held.values() if h.leases and resource.cost(h))
        return (f"model {handle.name!r} needs {cost} bytes and {named} has "
                f"{budget - self.resident(resource)} free; the models holding the rest have "
                f"requests in flight ({', '.join(busy) or 'none'}): retry when they finish")

    def _unload_job(self, handle: H) -> None:
        with self._lock:
            if not handle.held_out or handle.state not in (ModelState.READY,
                                                           ModelState.UNLOADING):
                return
            self._set(handle, ModelState.UNLOADING)
            if handle.leases:
                return  # the last lease's release runs this again
        self._stop_now(handle)

    def _stop_now(self, handle: H) -> None:
        loaded, handle.loaded = handle.loaded, None
        if loaded is not None:
            self.stop(handle, loaded)
        del loaded  # the last reference to its engines and sessions
        self.freed()
        with self._lock:
            self._set(handle, ModelState.AVAILABLE)
        log.info("unloaded %s", handle.name)


def _check_servable(handle: Resident) -> None:
    """Refuse a model that failed, or that an operator unloaded, before any lease."""
    if handle.state is ModelState.FAILED:
        raise Unavailable(f"model {handle.name!r} failed to load: {handle.error} (fix the "
                          "package; LoadModel retries)")
    if handle.held_out:
        raise Unavailable(f"model {handle.name!r} is unloaded by the operator (LoadModel, "
                          "POST /v1/models/NAME/load loads it again)")
