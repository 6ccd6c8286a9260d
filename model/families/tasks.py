"""The task a Hugging Face folder is exported for (`export --task`), and what the
folder's config.json says of it in `task_specific_params`.

An entry of task_specific_params names a task by its key ("summarization",
"summarization_xsum", "translation_en_to_de") and holds that task's parameters.
transformers' summarization and translation pipelines (4.x; transformers 5 removed
them with `task_specific_params` support, `pipelines.REMOVED_TASKS`) applied the entry
whose key is the pipeline's task ("summarization", "translation_en_to_fr") to a copy
of the model's generation config: `prefix` popped as the text prefix, the rest through
`GenerationConfig.update` (a key it has replaced, `max_length` leaving a
`max_new_tokens` of the generation config in force). A package for that task takes
them the same way, as its generation defaults (a request's options still override);
an entry the pipeline would not apply (`summarization_xsum` to "summarization") names
the task and nothing more.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

SUMMARIZE = "summarize"
TRANSLATE = "translate"
KINDS = (SUMMARIZE, TRANSLATE)
# A language as T5's keys name it (translation_en_to_de): an ISO 639 code.
_LANGUAGE = re.compile(r"[a-z]{2,3}")
_TRANSLATION_KEY = re.compile(r"translation_([a-z]{2,3})_to_([a-z]{2,3})")
TASK_FORMS = "summarize, translate, or translate:SRC-TGT (ISO 639 codes, e.g. translate:en-fr)"


@dataclass(frozen=True)
class TaskRequest:
    """What `export --task` asks: a kind and, for translation, maybe its languages."""

    kind: str
    source_language: str | None = None
    target_language: str | None = None

    @classmethod
    def parse(cls, text: str) -> TaskRequest:
        """`summarize`, `translate` or `translate:en-fr`; ValueError naming the forms."""
        kind, _, pair = text.partition(":")
        if kind not in KINDS or (pair and kind != TRANSLATE):
            raise ValueError(f"--task must be {TASK_FORMS}; got {text!r}")
        if not pair:
            return cls(kind)
        languages = pair.split("-")
        if len(languages) != 2 or not all(_LANGUAGE.fullmatch(x) for x in languages):
            raise ValueError(f"--task {text}: the languages must be SRC-TGT, two ISO 639 "
                             f"codes in lower case (translate:en-fr)")
        if languages[0] == languages[1]:
            raise ValueError(f"--task {text}: source and target language are the same")
        return cls(kind, languages[0], languages[1])

    @property
    def pair(self) -> tuple[str, str] | None:
        if self.source_language is None or self.target_language is None:
            return None
        return self.source_language, self.target_language

    def __str__(self) -> str:
        pair = self.pair
        return self.kind if pair is None else f"{self.kind}:{pair[0]}-{pair[1]}"


@dataclass(frozen=True)
class Task:
    """The task resolved against a folder: its kind and languages; the
    task_specific_params entry applied (`entry`, None where none is) with its
    generation parameters (`params`, `prefix` removed) and the text prefix."""

    kind: str
    source_language: str
    target_language: str
    entry: str | None = None
    params: Mapping[str, Any] = field(default_factory=dict)
    prefix: str = ""

    def generation_settings(self, settings: Mapping[str, Any]) -> dict[str, Any]:
        """generate()'s settings for this task: the folder's, the entry's
        parameters replacing theirs (`GenerationConfig.update`)."""
        return {**settings, **self.params}

    def origin(self) -> dict[str, Any]:
        """What the manifest says of it (exporter.source.task)."""
        said: dict[str, Any] = {"task": str(TaskRequest(
            self.kind, *((self.source_language, self.target_language)
                         if self.kind == TRANSLATE else ())))}
        if self.entry is None:
            said["task_specific_params"] = None
            return said
        said["task_specific_params"] = {
            "entry": self.entry, "applied": dict(self.params), "prefix": self.prefix,
            "how": "over generation_config as transformers' pipeline for the task applied "
                   "them (GenerationConfig.update): the package's defaults, a request's "
                   "options override them"}
        return said


def named_tasks(hf_config: Mapping[str, Any]) -> dict[str, TaskRequest]:
    """task_specific_params' entries that name a task: key -> the task."""
    params = hf_config.get("task_specific_params")
    found: dict[str, TaskRequest] = {}
    for key in params if isinstance(params, dict) else ():
        if key == "summarization" or key.startswith("summarization_"):
            found[key] = TaskRequest(SUMMARIZE)
        elif match := _TRANSLATION_KEY.fullmatch(key):
            found[key] = TaskRequest(TRANSLATE, match[1], match[2])
    return found


def _entry(hf_config: Mapping[str, Any], key: str) -> tuple[dict[str, Any], str] | None:
    """The entry `key` as the pipeline takes it: (parameters, prefix)."""
    params = hf_config.get("task_specific_params")
    value = params.get(key) if isinstance(params, dict) else None
    if not isinstance(value, dict):
        return None
    value = dict(value)
    prefix = value.pop("prefix", "")
    return value, prefix if isinstance(prefix, str) else ""


def resolve(hf_config: Mapping[str, Any], asked: TaskRequest | None, tasks: tuple[str, ...],
            family: str, problems: list[str]) -> Task | None:
    """The task to export a `family` folder (which may do `tasks`) for: `asked`, else
    the one the folder names; None with the problem appended where the folder names
    several (the list), none, or no languages for a translation."""
    named = named_tasks(hf_config)
    choices = list(dict.fromkeys(named.values()))
    listed = ", ".join(str(c) for c in choices)
    if asked is None:
        if not choices:
            problems.append(f"config.json: task_specific_params names no task and a {family} "
                            f"folder must say its task: export it with --task ({TASK_FORMS})")
            return None
        if len(choices) > 1:
            problems.append(f"config.json: task_specific_params names {len(choices)} tasks "
                            f"({listed}): choose one with --task")
            return None
        asked = choices[0]
    if asked.kind not in tasks:
        problems.append(f"--task {asked}: a {family} model does {' or '.join(tasks)}")
        return None
    if asked.kind == SUMMARIZE:
        params, prefix = _entry(hf_config, "summarization") or ({}, "")
        entry = "summarization" if "summarization" in named else None
        return Task(SUMMARIZE, "en", "en", entry, params, prefix)
    pair = asked.pair
    if pair is None:
        pairs = [c.pair for c in choices if c.kind == TRANSLATE and c.pair is not None]
        if len(pairs) != 1:
            which = ("names no translation languages" if not pairs else
                     f"names {len(pairs)} translations ({listed})")
            problems.append(f"--task translate: config.json's task_specific_params {which}: "
                            "say which with --task translate:SRC-TGT (e.g. translate:en-fr)")
            return None
        pair = pairs[0]
    key = f"translation_{pair[0]}_to_{pair[1]}"
    found = _entry(hf_config, key)
    if found is None:
        return Task(TRANSLATE, pair[0], pair[1])
    return Task(TRANSLATE, pair[0], pair[1], key, *found)
