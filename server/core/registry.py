"""The served models and the routes between their languages.

The registry holds what is served (one handle per model: its package, tokenizer,
engine, scheduler and workers, built by server/assembly.py) and answers how a
request is served (`route`: the model it names, a direct model of its pair, a chain
of two through English). Until every model is loaded it answers Unavailable: what is
served is not known yet. `generation` counts the changes to what is served, so that
what a door derives from it is derived again when it moves.

A multilingual model (its manifest's `languages`: NLLB-200, M2M100, mBART-50) serves
every ordered pair of its languages; a model of one pair, that pair. A request's codes
reach a model's languages by CLDR's rules (model/package/languages.py: aliases such as
iw for he, a region dropped, nb for no, never another script). One rule chooses the
model of a pair for every door (`route`; `routes` lists its choice for every pair):

1. the candidates: each model of the task that has both languages (after its own
   mapping of the codes, so that a model that would change the script is none);
2. of a bilingual and a multilingual candidate, the bilingual one
   (`prefer_multilingual` turns that round);
3. among the rest, the first of `prefer_models` (`--prefer-model`, in its order);
4. then a model that has both codes exactly (fa-AF: NLLB's Dari) before one that has
   only their languages (M2M100's Persian);
5. then by model name.

Chains through English are only for pairs no model serves.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from seq2serve.model.package.languages import (
    MULTILINGUAL,
    UNDETERMINED,
    CodeTable,
    Languages,
    Match,
    english_name,
)
from seq2serve.model.package.manifest import Manifest, ModelPackage
from seq2serve.model.package.tokenizer import Tokenizer
from seq2serve.server.batching.scheduler import Scheduler
from seq2serve.server.batching.worker import ModelWorker
from seq2serve.server.core.errors import InvalidArgument, NotFound, Unavailable, echo
from seq2serve.server.core.residency import Loaded, ModelState, Residency
from seq2serve.server.engine.options import OptionLimits, Resolvable, ResolvedOptions

log = logging.getLogger("seq2serve.server")
# After ONNX Runtime runs are terminated, how long their threads may take to end
# (the flag is checked between kernels: milliseconds).
TERMINATE_JOIN_S = 10.0


class ModelEngine(Protocol):
    """What the core asks of a served model's engine (engine/engine.py's Engine)."""

    limits: OptionLimits

    @property
    def max_positions(self) -> int: ...

    @property
    def provider(self) -> str: ...

    def resolve(self, options: Resolvable) -> ResolvedOptions: ...


@dataclass
class ModelHandle:
    """A served model, loaded or not (core/residency.py keeps its state)."""

    name: str
    package: ModelPackage
    tokenizer: Tokenizer
    # Its options, limits and provider as every engine of it has them, known before
    # it loads (assembly.PackageOptions).
    engine: ModelEngine
    cost: int = 0  # bytes of host memory it holds once loaded (assembly.package_cost)
    device_cost: int = 0  # bytes of the device's memory it holds (assembly.device_cost)
    loaded: Loaded | None = None
    state: ModelState = ModelState.AVAILABLE
    error: str = ""  # why it failed to load
    leases: int = 0  # requests holding it (residency.lease)
    last_used: float = 0.0  # time.monotonic() of its last lease
    held_out: bool = False  # an operator unloaded it: requests are refused

    @property
    def manifest(self) -> Manifest:
        return self.package.manifest

    @property
    def scheduler(self) -> Scheduler:
        """Its queue; only a request holding a lease asks (the model is loaded)."""
        if self.loaded is None:
            raise Unavailable(f"model {self.name!r} is not loaded")
        return self.loaded.scheduler

    @property
    def workers(self) -> tuple[ModelWorker, ...]:
        """One per engine, all taking from `scheduler`; () while not loaded."""
        return () if self.loaded is None else self.loaded.workers

    @functools.cached_property
    def digest(self) -> str:
        return self.manifest.digest

    @property
    def batches(self) -> int:
        return sum(w.batches for w in self.workers)

    def encode(self, text: str, language: int | None = None) -> list[int]:
        """A text's token ids as the model reads them: after the package's input
        prefix (T5's "summarize: "), when it has one; a multilingual model's with
        its source `language` token."""
        return self.tokenizer.encode(self.manifest.input_prefix + text, language)

    @property
    def languages(self) -> Languages | None:
        """A multilingual model's languages; None for a model of one pair."""
        return self.manifest.languages

    def language_codes(self) -> list[str]:
        """The languages this model reads and writes, by the codes requests use."""
        if self.languages is not None:
            return list(self.languages.listed())
        return list(dict.fromkeys((self.manifest.source_language,
                                   self.manifest.target_language)))

    @functools.cached_property
    def codes(self) -> CodeTable:
        """This model's languages by every code a request may use."""
        if self.languages is not None:
            return self.languages.table
        return CodeTable.of(self.language_codes())

    def match(self, code: str) -> Match | None:
        """A request's code as this model has it, or None where it has not."""
        return self.codes.find(code)

    def listed_code(self, code: str) -> str | None:
        """A request's language code as this model lists it, or None where it does not
        have it."""
        found = self.match(code)
        if found is None:
            return None
        return found.own if self.languages is None else self.languages.listed_code(found.own)

    def pair(self, source: str, target: str) -> tuple[Leg, bool] | None:
        """This model's leg for source -> target and whether it has both codes exactly;
        None where it does not translate that pair ("": a model of one pair's own
        language; a multilingual model needs both)."""
        if self.languages is None:
            found = []
            for code, own in ((source, self.manifest.source_language),
                              (target, self.manifest.target_language)):
                match = self.match(code) if code else Match(own, True)
                if match is None or match.own != own:
                    return None
                found.append(match.exact)
            return _leg(self, source, target), all(found)
        a = self.match(source) if source else None
        b = self.match(target) if target else None
        if a is None or b is None or a.own == b.own:
            return None
        return _leg(self, source, target), a.exact and b.exact

    @property
    def provider(self) -> str:
        return self.engine.provider


# Most chained pairs an error message names one by one.
LISTED_CHAINS = 12

# The language every chain goes through: each shipped model reads or writes it.
PIVOT = "en"


@dataclass(frozen=True)
class Leg:
    """One model of a route and the pair it translates there (the languages whose
    tokens a multilingual model is given)."""

    handle: ModelHandle
    source_language: str
    target_language: str

    def tokens(self) -> tuple[int | None, int | None]:
        """A multilingual model's source and target language tokens; (None, None)
        for a model of one pair."""
        languages = self.handle.languages
        if languages is None:
            return None, None
        return languages.token(self.source_language), languages.token(self.target_language)


@dataclass(frozen=True)
class Route:
    """The models that serve a language pair, in order: one (direct), two (a chain
    through PIVOT), or none (source and target the same language: the text itself)."""

    source_language: str
    target_language: str
    legs: tuple[Leg, ...]

    @property
    def models(self) -> tuple[ModelHandle, ...]:
        return tuple(leg.handle for leg in self.legs)

    @property
    def chained(self) -> bool:
        return len(self.models) > 1

    @property
    def kind(self) -> str:
        """The metrics' route label: "direct", "chained" or "same_language"."""
        return {0: "same_language", 1: "direct"}.get(len(self.models), "chained")

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(h.name for h in self.models)

    @property
    def name(self) -> str:
        """The model's name; a chain's names joined by "+"; "" for the text itself."""
        return "+".join(self.names)


class ModelRegistry:
    def __init__(self, prefer_multilingual: bool = False,
                 prefer_models: Sequence[str] = ()) -> None:
        self._handles: dict[str, ModelHandle] = {}
        # Whether a multilingual model serving a pair wins over a bilingual one.
        self.prefer_multilingual = prefer_multilingual
        # The models that win a pair among several of the preferred kind, first first.
        self.prefer_models = tuple(prefer_models)
        self._routes: tuple[int, list[Route]] | None = None  # (generation, routes)
        self.ready = False
        # Counts the changes to what is served (a model added, removed, failed):
        # what a door derives from the served models is derived again when it moves.
        self.generation = 0
        self._failed: frozenset[str] = frozenset()  # the models that failed to load
        self.residency = Residency[ModelHandle](lambda: list(self._handles.values()),
                                                self._changed)
        # Told of every model's state change (the metrics, set by the assembly).
        self.on_change: Callable[[ModelHandle], None] = lambda handle: None

    def _changed(self, handle: ModelHandle) -> None:
        # Routes change when a model fails or recovers, not when one loads or unloads
        # (a 200-language model's 40,000 routes are not listed again for each load).
        failed = frozenset(h.name for h in self._handles.values()
                           if h.state is ModelState.FAILED)
        if failed != self._failed:
            self._failed = failed
            self.generation += 1
        self.on_change(handle)

    def add(self, handle: ModelHandle) -> None:
        """Serve a model (server/assembly.py checks that its name is new)."""
        self._handles[handle.name] = handle
        self.generation += 1

    def remove(self, name: str) -> ModelHandle | None:
        """Serve `name` no more (its package left the folder); the caller unloads it."""
        handle = self._handles.pop(name, None)
        self.generation += 1
        return handle

    def serves(self, handle: ModelHandle) -> bool:
        """Whether `handle` is still served (not removed by a rescan)."""
        return self._handles.get(handle.name) is handle

    def find(self, name: str) -> ModelHandle:
        """The model of that name; NotFound naming the models there are."""
        handle = self._handles.get(name)
        if handle is None:
            raise NotFound(f"model {echo(name)} is not served; available: "
                           f"{', '.join(sorted(self._handles)) or 'none'}")
        return handle

    def loaded(self) -> None:
        """Every model is loaded: what is served is known, requests may be routed."""
        self.ready = True
        self.generation += 1

    def handles(self) -> list[ModelHandle]:
        """The models loaded so far (all of them once `ready`)."""
        return list(self._handles.values())

    def require_ready(self) -> None:
        """Raise Unavailable until every model is loaded: before that, what is served
        is not yet known (a pair still loading is not a pair this server lacks)."""
        if not self.ready:
            raise Unavailable("models are still loading; retry shortly")

    def pick(self, task: str, name: str, source_language: str = "",
             target_language: str = "") -> ModelHandle:
        """The one model that serves `task` (by name, else by language pair)."""
        route = self.route(task, name, source_language, target_language, chains=False)
        return route.models[-1]

    def route(self, task: str, name: str, source_language: str = "",
              target_language: str = "", *, chains: bool = True) -> Route:
        """How a request is served: the model it names (its languages checked); else,
        both languages given, the model the rule chooses (the module's docstring);
        else, for translation, a chain of two through English (de->fr = de->en,
        en->fr); else source and target the same served language (`Route.models`
        empty: the text comes back unchanged). A request without both languages (a
        summary) gets the one model of its task that fits, or is told to name one."""
        self.require_ready()
        if name:
            handle = self.find(name)
            if handle.manifest.task != task:
                raise InvalidArgument(f"model {name!r} is a {handle.manifest.task} model, not "
                                      f"{task}")
            return _direct_route(handle, source_language, target_language)
        if source_language and target_language:
            leg = self._choose(task, source_language, target_language)
            if leg is not None:
                return Route(leg.source_language, leg.target_language, (leg,))
        else:
            found = self._candidates(task, source_language, target_language)
            if len(found) == 1:
                return Route(found[0][0].source_language, found[0][0].target_language,
                             (found[0][0],))
            if len(found) > 1:
                raise InvalidArgument(
                    f"model is required: {len(found)} {task} models match (set model, or "
                    f"source_language and target_language); available: {self._served()}")
        if chains and task == "translate" and source_language and target_language:
            same = self._same_language(source_language, target_language)
            if same is not None:
                return Route(same, same, ())
            chain = self._chain(source_language, target_language)
            if chain is not None:
                return chain
        raise NotFound(f"no {task} model for source_language={echo(source_language)} "
                       f"target_language={echo(target_language)}; available: "
                       f"{self._served(chains=chains and task == 'translate') or 'none'}")

    def _candidates(self, task: str, source: str, target: str) -> list[tuple[Leg, bool]]:
        """Each model of `task` that translates source -> target as it maps the codes,
        with its leg and whether it has both codes exactly."""
        # A model that failed to load serves nothing: another may serve its pairs.
        return [found for h in self._handles.values() if h.manifest.task == task
                and h.state is not ModelState.FAILED
                and (found := h.pair(source, target)) is not None]

    def _choose(self, task: str, source: str, target: str) -> Leg | None:
        """The rule (the module's docstring): the leg of the model that serves the
        pair, or None where none does."""
        found = self._candidates(task, source, target)
        kind = [c for c in found
                if (c[0].handle.languages is not None) == self.prefer_multilingual] or found
        if not kind:
            return None
        return min(kind, key=lambda c: (self._preference(c[0].handle.name), not c[1],
                                        c[0].handle.name))[0]

    def _preference(self, name: str) -> int:
        """A model's place in `prefer_models` (those not named after them all)."""
        return self.prefer_models.index(name) if name in self.prefer_models \
            else len(self.prefer_models)

    def _same_language(self, source: str, target: str) -> str | None:
        """The listed code where source and target name one served language."""
        for handle in self._handles.values():
            if handle.manifest.task == "translate":
                a, b = handle.listed_code(source), handle.listed_code(target)
                if a is not None and a == b:
                    return a
        return None

    def _chain(self, source: str, target: str) -> Route | None:
        """source -> PIVOT -> target, each leg's model chosen by the rule, or None.
        Never a model chained with itself, and never through a pivot that is an end."""
        if PIVOT in (source, target) or source == target:
            return None
        first = self._choose("translate", source, PIVOT)
        second = self._choose("translate", PIVOT, target)
        if first is None or second is None or first.handle is second.handle:
            return None
        return Route(source, target, (first, second))

    def listed_code(self, code: str) -> str:
        """A request's language code as the served models list it (a multilingual
        model's pt-BR or por_Latn is its pt): a model's that has the code exactly
        first, then by model name; the code itself where none has it."""
        found = [(not m.exact, h.name, h) for h in self._handles.values()
                 if h.manifest.task == "translate" and (m := h.match(code)) is not None]
        if not found:
            return code
        listed = min(found, key=lambda f: f[:2])[2].listed_code(code)
        return code if listed is None else listed

    def language_name(self, code: str) -> str | None:
        """A listed code's English name: CLDR's (with its script or region: "Chinese
        (Traditional)", "Persian (Afghanistan)"), else the one a package lists it with."""
        name = english_name(code)
        if name is not None:
            return name
        for handle in self._handles.values():
            if handle.languages is not None and (name := handle.languages.names.get(code)):
                return name
        return None

    def languages(self) -> set[str]:
        """Every language a translation model reads or writes."""
        return {code for h in self._handles.values() if h.manifest.task == "translate"
                for code in h.language_codes()}

    def routes(self) -> list[Route]:
        """Every translation pair served, direct or chained through English, sorted
        by pair: each pair a model lists, with the model the rule chooses for it
        (`route` answers the same for a request of that pair), else its chain.
        Computed once per `generation` (a 200-language model has 40,000 pairs)."""
        cached = self._routes
        if cached is None or cached[0] != self.generation:
            cached = self._routes = (self.generation, self._all_routes())
        return list(cached[1])

    def _all_routes(self) -> list[Route]:
        listed: set[tuple[str, str]] = set()
        for h in self._handles.values():
            if h.manifest.task == "translate":
                codes = h.language_codes()
                listed.update([(a, b) for a in codes for b in codes if a != b]
                              if h.languages is not None
                              else [(h.manifest.source_language, h.manifest.target_language)])
        out = [Route(source, target, (leg,)) for source, target in listed
               if (leg := self._choose("translate", source, target)) is not None]
        # Two codes no one model lists together: a model may still have both (NLLB's
        # nb is M2M100's listed no), else a chain may serve them.
        languages = sorted(self.languages())
        for source in languages:
            for target in languages:
                if (source == target or (source, target) in listed
                        or self._same_language(source, target) is not None):
                    continue
                if (leg := self._choose("translate", source, target)) is not None:
                    out.append(Route(source, target, (leg,)))
                elif chain := self._chain(source, target):
                    out.append(chain)
        return sorted(out, key=lambda r: (r.source_language, r.target_language, r.name))

    def _served(self, chains: bool = False) -> str:
        models = ", ".join(f"{h.name} ({h.manifest.task} {_pair_text(h)})"
                           for h in self._handles.values())
        chained = [r for r in self.routes() if r.chained] if chains else []
        if not chained:
            return models
        if len(chained) > LISTED_CHAINS:  # a message stays short: ListRoutes has them all
            return f"{models}; {len(chained)} pairs through {PIVOT} (ListRoutes, /languages)"
        return (f"{models}; through {PIVOT}: "
                + ", ".join(f"{r.source_language}->{r.target_language}" for r in chained))

    def close(self, drain: bool = True, timeout: float | None = None) -> None:
        """Stop every model's workers, all at once, within `timeout` for the whole
        close (None: as long as they take). drain: serve what is queued first;
        otherwise queued work fails with `Draining` (UNAVAILABLE) at once. What is
        still running at the deadline is terminated (its ONNX Runtime runs end),
        and every engine thread is joined before this returns."""
        self.residency.close()
        # The models a rescan removed but whose last requests still run, too.
        handles = {id(h): h for h in [*self._handles.values(), *self.residency.held()]}
        stop_workers([w for handle in handles.values() for w in handle.workers],
                     drain, timeout)


def stop_workers(workers: Sequence[ModelWorker], drain: bool, timeout: float | None) -> None:
    """Stop `workers` all at once, within `timeout` (see ModelRegistry.close)."""
    for worker in workers:  # all stop at once ...
        worker.stop(drain=drain, timeout=0)
    end = None if timeout is None else time.monotonic() + timeout
    for worker in workers:  # ... then share one deadline for the joins
        left = None if end is None else max(0.0, end - time.monotonic())
        worker.stop(drain=drain, timeout=left)
    late = [w for w in workers if w.running]
    for worker in late:  # every run ends at once ...
        worker.terminate(timeout=0)
    end = time.monotonic() + TERMINATE_JOIN_S
    for worker in late:  # ... and the threads are joined
        if not worker.terminate(timeout=max(0.0, end - time.monotonic())):
            log.error("model %s: an engine thread is still running %gs after its runs "
                      "were terminated", worker.name, TERMINATE_JOIN_S)
    if late:
        log.info("terminated the work in flight of %d engine(s) at the deadline", len(late))


def _pair_text(handle: ModelHandle) -> str:
    if handle.languages is not None:
        return f"{len(handle.languages.tokens)} languages, every pair"
    return f"{handle.manifest.source_language}->{handle.manifest.target_language}"


def _leg(handle: ModelHandle, source: str, target: str) -> Leg:
    """The leg of `handle` for source -> target: a multilingual model's languages as
    it lists them; a bilingual model's own pair."""
    if handle.languages is None:
        return Leg(handle, handle.manifest.source_language, handle.manifest.target_language)
    return Leg(handle, handle.listed_code(source) or source,
               handle.listed_code(target) or target)


def _direct_route(handle: ModelHandle, source: str, target: str) -> Route:
    """`handle` alone for the request's pair, each language one it has (else
    InvalidArgument naming the field and the model's languages). A multilingual model
    needs both; a model of one pair takes "" for its own language, and any code for a
    language its folder did not say (und)."""
    if handle.languages is not None:
        for field, code in (("source_language", source), ("target_language", target)):
            if not code:
                raise InvalidArgument(
                    f"{field} is required: model {handle.name!r} is multilingual (its "
                    f"languages: {_listing(handle.language_codes())})")
            if handle.match(code) is None:
                why = handle.codes.refusal(code)
                raise InvalidArgument(
                    f"{field}={echo(code)} is not a language of model {handle.name!r} ("
                    f"{why + '; ' if why else ''}its languages: "
                    f"{_listing(handle.language_codes())})")
        if handle.listed_code(source) == handle.listed_code(target):
            raise InvalidArgument(
                f"source_language and target_language are the same language "
                f"({echo(source)}); model {handle.name!r} translates between two")
    else:
        manifest = handle.manifest
        for side, code, own in (("source", source, manifest.source_language),
                                ("target", target, manifest.target_language)):
            found = handle.match(code) if code else None
            if code and own not in (UNDETERMINED, MULTILINGUAL) and (
                    found is None or found.own != own):
                raise InvalidArgument(
                    f"{side}_language={echo(code)} is not the {side} language of model "
                    f"{handle.name!r}{_because(handle, code)}, which translates "
                    f"{manifest.source_language}->{manifest.target_language}: "
                    f"{side}_language must be {own!r} or empty")
    leg = _leg(handle, source, target)
    return Route(leg.source_language, leg.target_language, (leg,))


# Most languages an error message names one by one.
LISTED_LANGUAGES = 12


def _listing(codes: Sequence[str]) -> str:
    """A model's languages for a message: all of a few; the first of many, with where
    to find the rest."""
    if len(codes) <= LISTED_LANGUAGES:
        return ", ".join(codes)
    return (f"{', '.join(codes[:LISTED_LANGUAGES])} and {len(codes) - LISTED_LANGUAGES} more: "
            "ListModels, /languages")


def _because(handle: ModelHandle, code: str) -> str:
    """Why a code is not the model's, where another script is why (" (written in
    Latn, the model's sr in Cyrl)"); "" else."""
    why = handle.codes.refusal(code)
    return f" ({why})" if why else ""
