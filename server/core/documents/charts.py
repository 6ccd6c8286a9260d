"""Charts in Office Open XML files (`word/charts/`, `ppt/charts/`, `xl/charts/`), and what
every Office Open XML package shares: its core properties and its language marks.

A chart part (`c:chartSpace`) shows the text of its titles and axis titles (rich
text: DrawingML paragraphs, runs.py) and the strings it caches from its data: each
series' name (`c:tx`: `c:strRef`'s `c:strCache`, or a literal `c:v`) and the
category labels (`c:cat`: `c:strCache`, `c:strLit`, a multi-level
`c:multiLvlStrCache`). Those are translated; numbers (`c:numCache`), the formulas
that say where the data is (`c:f`) and everything else stay as they are. What
PowerPoint and Word show is the cache; the workbook embedded beside the chart
(its data, which "Edit data" opens) is not translated.

`docProps/core.xml`: the title (`dc:title`) is translated and `dc:language` says the
target. Word marks languages in `w:lang` (of the default run properties, styles and
runs), DrawingML in the `lang` attribute of run properties, a chart in `c:lang`:
each is set to the target (language.py).
"""

from __future__ import annotations

from lxml import etree

from seq2serve.server.core.documents import runs
from seq2serve.server.core.documents.language import Target, put, put_text
from seq2serve.server.core.documents.mixed import Rules, paragraphs
from seq2serve.server.core.inline import Paragraph

C = "{http://schemas.openxmlformats.org/drawingml/2006/chart}"
DC = "{http://purl.org/dc/elements/1.1/}"
_CACHES = frozenset({C + "strCache", C + "strLit", C + "lvl"})


def _cached_string(element: etree._Element) -> bool:
    if element.tag != C + "v":
        return False
    parent = element.getparent()
    if parent is None:
        return False
    above = parent.getparent()
    return parent.tag == C + "tx" or (parent.tag == C + "pt" and above is not None
                                      and above.tag in _CACHES)


_CACHED = Rules(block=_cached_string, inline=lambda e: False, skip=lambda e: False)
_TITLE = Rules(block=lambda e: e.tag == DC + "title", inline=lambda e: False,
               skip=lambda e: False)


def chart_paragraphs(root: etree._Element) -> list[Paragraph]:
    """A chart's titles and axis titles, then its series names and category labels."""
    return runs.find(root, runs.DRAWING) + paragraphs(root, _CACHED)


def title_paragraphs(root: etree._Element) -> list[Paragraph]:
    """The title of a package's core properties (`docProps/core.xml`)."""
    return paragraphs(root, _TITLE)


def mark_core(root: etree._Element, target: Target) -> bool:
    """`dc:language` (core properties, OpenDocument's meta.xml) says the target."""
    return any([put_text(language, target.locale) for language in root.iter(DC + "language")
                if target.replaces(language.text)])


def mark_word(root: etree._Element, target: Target) -> bool:
    """Every `w:lang` says the target, for the script kind the target is written in."""
    name = runs.W + {"western": "val", "asian": "eastAsia", "complex": "bidi"}[target.kind]
    return any([put(lang, name, target.locale) for lang in root.iter(runs.W + "lang")
                if target.replaces(lang.get(name, "x"))])


def mark_drawing(root: etree._Element, target: Target) -> bool:
    """DrawingML run properties (`lang`), and a chart's own `c:lang`."""
    runs_marked = [put(element, "lang", target.locale) for element in root.iter(
        runs.A + "rPr", runs.A + "endParaRPr", runs.A + "defRPr")
        if target.replaces(element.get("lang"))]
    charts_marked = [put(lang, "val", target.locale) for lang in root.iter(C + "lang")
                     if target.replaces(lang.get("val"))]
    return any(runs_marked + charts_marked)
