"""Model states, leases and the memory budget (server/core/residency.py), on stand-in
models whose loads and unloads are recorded: which model is loaded when, and which
one the budget unloads, without ONNX Runtime."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable
from types import SimpleNamespace
from typing import Any, TypeVar

import pytest

from seq2serve.server.assembly import batch_limits
from seq2serve.server.batching.scheduler import Scheduler
from seq2serve.server.config import ServerConfig
from seq2serve.server.core.errors import OverBudget, Unavailable
from seq2serve.server.core.registry import ModelHandle, ModelRegistry
from seq2serve.server.core.residency import Loaded, ModelState, Resource
from seq2serve.server.metrics import MODEL_STATES

T = TypeVar("T")


def run(work: Awaitable[T]) -> T:
    async def wrapped() -> T:
        return await work

    return asyncio.run(wrapped())


class Recorder:
    """The registry's build and stop, recording the order of loads and unloads;
    `broken` names models whose load raises; `gate` holds loads until it is set."""

    def __init__(self, registry: ModelRegistry, broken: tuple[str, ...] = ()) -> None:
        self.events: list[str] = []
        self.broken = set(broken)
        self.gate = threading.Event()
        self.gate.set()
        self.most = 0  # the most bytes the resident models ever held
        self.most_on_device = 0
        registry.residency.build = self.build
        registry.residency.stop = self.stop
        self.registry = registry
        registry.on_change = self.changed

    def build(self, handle: ModelHandle) -> Loaded:
        self.gate.wait(30)
        if handle.name in self.broken:
            raise RuntimeError(f"{handle.name}/encoder.onnx: not an ONNX model")
        self.events.append(f"load {handle.name}")
        return Loaded(Scheduler(batch_limits(ServerConfig(models_dir=None))), ())

    def stop(self, handle: ModelHandle, loaded: Loaded) -> None:
        self.events.append(f"unload {handle.name}")

    def changed(self, handle: ModelHandle) -> None:
        self.most = max(self.most, self.registry.residency.resident())
        self.most_on_device = max(self.most_on_device,
                                  self.registry.residency.resident(Resource.DEVICE))


def stand_in(name: str, cost: int, device_cost: int = 0) -> ModelHandle:
    manifest = SimpleNamespace(task="translate", source_language=name[:2],
                               target_language=name[3:], languages=None)
    return ModelHandle(name, SimpleNamespace(manifest=manifest),  # type: ignore[arg-type]
                       None, None, cost=cost, device_cost=device_cost)  # type: ignore[arg-type]


def registry_of(*names: str, cost: int = 10, budget: int = 0, device_cost: int = 0,
                device_budget: int = 0,
                broken: tuple[str, ...] = ()) -> tuple[ModelRegistry, Recorder]:
    """Stand-ins of `names`, each costing `cost` bytes of host memory and `device_cost`
    of the device's (a model on a device provider), under those budgets."""
    registry = ModelRegistry()
    for name in names:
        registry.add(stand_in(name, cost, device_cost))
    registry.residency.budgets = {Resource.HOST: budget, Resource.DEVICE: device_budget}
    registry.loaded()
    return registry, Recorder(registry, broken)


def use(registry: ModelRegistry, *names: str) -> None:
    """One request over `names` (a chain's two legs), from lease to answer."""
    async def request() -> None:
        handles = [registry.find(n) for n in names]
        async with registry.residency.lease(handles):
            assert all(h.state is ModelState.READY for h in handles)

    run(request())


def states(registry: ModelRegistry) -> dict[str, str]:
    return {h.name: h.state.value for h in registry.handles()}


def test_the_states_are_the_metrics_states() -> None:
    assert tuple(s.value for s in ModelState) == MODEL_STATES


def test_a_lazy_model_loads_at_its_first_request_and_only_then() -> None:
    registry, recorder = registry_of("en-de", "de-en")
    assert states(registry) == {"en-de": "available", "de-en": "available"}
    use(registry, "en-de")
    use(registry, "en-de")
    assert recorder.events == ["load en-de"]
    assert states(registry) == {"en-de": "ready", "de-en": "available"}
    registry.close()


def test_the_budget_unloads_the_least_recently_used_idle_model() -> None:
    registry, recorder = registry_of("en-de", "de-en", "en-fr", budget=25)
    use(registry, "en-de")
    use(registry, "de-en")
    use(registry, "en-de")  # de-en is now the least recently used
    use(registry, "en-fr")
    assert recorder.events == ["load en-de", "load de-en", "unload de-en", "load en-fr"]
    assert states(registry) == {"en-de": "ready", "de-en": "available", "en-fr": "ready"}
    assert recorder.most <= 25
    registry.close()


def test_a_busy_model_is_never_unloaded_and_a_load_past_the_budget_is_refused() -> None:
    registry, recorder = registry_of("en-de", "de-en", "en-fr", budget=25)

    async def chain_holding_two_then_a_third() -> str:
        # A chain holds both its legs across awaits; a third model cannot fit.
        async with registry.residency.lease([registry.find("en-de"), registry.find("de-en")]):
            await asyncio.sleep(0)
            with pytest.raises(OverBudget) as refused:
                async with registry.residency.lease([registry.find("en-fr")]):
                    pass
            return refused.value.message

    message = run(chain_holding_two_then_a_third())
    assert "memory budget of 25 bytes (--max-model-memory)" in message
    assert "de-en, en-de" in message  # the busy models, named
    assert recorder.events == ["load en-de", "load de-en"]
    use(registry, "en-fr")  # once they are idle, the same load fits
    assert recorder.events[-2:] == ["unload en-de", "load en-fr"]
    assert registry.find("en-fr").leases == 0 == registry.find("de-en").leases
    registry.close()


def test_a_model_larger_than_the_budget_is_refused_naming_it() -> None:
    registry, recorder = registry_of("en-de", cost=30, budget=25)
    with pytest.raises(OverBudget, match="needs 30 bytes"):
        use(registry, "en-de")
    assert recorder.events == []
    assert states(registry) == {"en-de": "available"}
    registry.close()


def test_the_device_budget_unloads_the_least_recently_used_idle_model_and_names_itself(
        ) -> None:
    # Models on a device: 5 bytes of host memory (no host budget), 10 of the device's.
    registry, recorder = registry_of("en-de", "de-en", "en-fr", cost=5, device_cost=10,
                                     device_budget=25)
    use(registry, "en-de")
    use(registry, "de-en")
    use(registry, "en-de")  # de-en is now the least recently used
    use(registry, "en-fr")
    assert recorder.events == ["load en-de", "load de-en", "unload de-en", "load en-fr"]
    assert (recorder.most_on_device, recorder.most) == (20, 10)  # within 25; no host budget

    async def both_busy_then_a_third() -> str:
        async with registry.residency.lease([registry.find("en-de"), registry.find("en-fr")]):
            with pytest.raises(OverBudget) as refused:
                async with registry.residency.lease([registry.find("de-en")]):
                    pass
            return refused.value.message

    assert run(both_busy_then_a_third()) == (
        "model 'de-en' needs 10 bytes and the device memory budget of 25 bytes "
        "(--max-device-memory) has 5 free; the models holding the rest have requests in "
        "flight (en-de, en-fr): retry when they finish")
    registry.close()


def test_a_model_larger_than_the_device_budget_is_refused_naming_it() -> None:
    registry, recorder = registry_of("en-de", cost=5, device_cost=30, budget=100,
                                     device_budget=25)
    with pytest.raises(OverBudget) as refused:
        use(registry, "en-de")
    assert refused.value.message == (
        "model 'en-de' needs 30 bytes of device memory, more than the device memory budget "
        "of 25 bytes (--max-device-memory): raise it, or serve a smaller package")
    assert recorder.events == []
    registry.close()


def test_each_budget_is_kept_and_only_models_freeing_the_short_one_are_unloaded() -> None:
    registry = ModelRegistry()
    # en-de holds host memory only; de-en and en-fr hold the device's too.
    for handle in (stand_in("en-de", 10), stand_in("de-en", 10, 10), stand_in("en-fr", 5, 10)):
        registry.add(handle)
    registry.residency.budgets = {Resource.HOST: 30, Resource.DEVICE: 15}
    registry.loaded()
    recorder = Recorder(registry)
    use(registry, "en-de")
    use(registry, "de-en")
    use(registry, "en-fr")  # the device is short: en-de (least recently used) frees none
    assert recorder.events == ["load en-de", "load de-en", "unload de-en", "load en-fr"]
    assert (recorder.most, recorder.most_on_device) == (20, 10)
    assert registry.residency.short_of(registry.find("de-en")) is Resource.DEVICE
    registry.residency.budgets[Resource.HOST] = 20
    use(registry, "de-en")  # both short now: en-de for the host, en-fr for the device
    assert recorder.events[-3:] == ["unload en-de", "unload en-fr", "load de-en"]
    assert states(registry) == {"en-de": "available", "de-en": "ready", "en-fr": "available"}
    registry.close()


def test_a_model_a_rescan_removed_counts_in_the_budget_until_it_is_unloaded() -> None:
    registry, recorder = registry_of("en-de", "de-en", budget=15)
    old = registry.find("en-de")

    async def removed_while_a_request_holds_it() -> tuple[str, str]:
        async with registry.residency.lease([old]):
            # What ModelWorkers.rescan does with a package removed or changed on disk.
            registry.remove("en-de")
            await asyncio.wrap_future(registry.residency.unload(old))
            assert old.state is ModelState.UNLOADING
            assert registry.residency.resident() == 10
            with pytest.raises(OverBudget) as refused:
                async with registry.residency.lease([registry.find("de-en")]):
                    pass
            registry.add(stand_in("en-de", 10))  # the changed package, served again
            with pytest.raises(OverBudget):
                async with registry.residency.lease([registry.find("en-de")]):
                    pass
            return refused.value.message, old.state.value

    message, state = run(removed_while_a_request_holds_it())
    assert "has 5 free" in message and "(en-de)" in message  # the one unloading, named
    assert state == "unloading"
    use(registry, "de-en")  # the request ended, the old model went: it fits
    assert recorder.events == ["load en-de", "unload en-de", "load de-en"]
    assert old.state is ModelState.AVAILABLE and recorder.most <= 15
    registry.close()


def test_an_unload_waits_for_the_requests_holding_the_model() -> None:
    registry, recorder = registry_of("en-de")
    handle = registry.find("en-de")

    async def unload_during_a_request() -> list[str]:
        async with registry.residency.lease([handle]):
            await asyncio.wrap_future(registry.residency.unload(handle))
            seen = [handle.state.value, *recorder.events]
            with pytest.raises(Unavailable, match="unloaded by the operator"):
                async with registry.residency.lease([handle]):
                    pass  # a new request is refused meanwhile
            return seen

    assert run(unload_during_a_request()) == ["unloading", "load en-de"]
    registry.residency.unload(handle).result(30)  # runs after the one the release queued
    assert recorder.events == ["load en-de", "unload en-de"]
    assert handle.state is ModelState.AVAILABLE
    registry.residency.load(handle).result(30)  # again, by LoadModel
    assert recorder.events == ["load en-de", "unload en-de", "load en-de"]
    registry.close()


def test_a_model_that_fails_to_load_says_why_and_the_others_keep_serving() -> None:
    registry, recorder = registry_of("en-de", "de-en", broken=("en-de",))
    with pytest.raises(Unavailable, match="failed to load: en-de/encoder.onnx: not an ONNX"):
        use(registry, "en-de")
    handle = registry.find("en-de")
    assert (handle.state, handle.error) == (ModelState.FAILED,
                                            "en-de/encoder.onnx: not an ONNX model")
    use(registry, "de-en")
    with pytest.raises(Unavailable, match="failed to load"):  # not retried per request
        use(registry, "en-de")
    recorder.broken.clear()
    registry.residency.load(handle).result(30)  # LoadModel retries
    assert handle.state is ModelState.READY and handle.error == ""
    registry.close()


def test_a_request_waits_for_its_model_and_others_answer_meanwhile() -> None:
    registry, recorder = registry_of("en-de", "de-en")
    use(registry, "de-en")
    recorder.gate.clear()  # en-de's load holds

    async def both() -> list[Any]:
        slow = asyncio.ensure_future(_lease(registry, "en-de"))
        await asyncio.sleep(0.05)
        fast = await _lease(registry, "de-en")  # answered while en-de loads
        seen = [fast, slow.done(), registry.find("en-de").state.value]
        recorder.gate.set()
        return [*seen, await slow]

    assert run(both()) == ["de-en", False, "loading", "en-de"]
    registry.close()


def test_past_the_wait_a_request_is_told_to_retry() -> None:
    registry, recorder = registry_of("en-de")
    registry.residency.wait_s = 0.0
    recorder.gate.clear()
    with pytest.raises(Unavailable, match="still loading .* --load-wait-s"):
        use(registry, "en-de")
    recorder.gate.set()
    registry.close()


async def _lease(registry: ModelRegistry, name: str) -> str:
    async with registry.residency.lease([registry.find(name)]):
        return name


def test_a_refusal_past_the_budget_is_resource_exhausted_and_a_503_to_retry() -> None:
    import grpc

    from seq2serve.server.api.grpc_errors import STATUS
    from seq2serve.server.api.http.app import error_response

    refusal = OverBudget("the memory budget of 25 bytes (--max-model-memory) is held")
    assert STATUS[refusal.kind] is grpc.StatusCode.RESOURCE_EXHAUSTED
    answer = error_response(refusal)
    assert answer.status_code == 503 and answer.headers["Retry-After"]
