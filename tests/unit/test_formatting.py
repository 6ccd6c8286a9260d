"""Formatting never changes the words: paired tags are taken off before the model and put
back around the words the alignment links to theirs (core/formatting.py)."""

import random
import re

from seq2serve.server.core.alignment import compose
from seq2serve.server.core.formatting import model_text, split
from seq2serve.server.core.placeholders import mask

_TAGS = re.compile(r"</?[A-Za-z][^>]*>")


def link(output: str, target: str, source_text: str, source: str) -> tuple:
    """The link of `target` (a word of output) to `source` (a word of source_text)."""
    t, s = output.index(target), source_text.index(source)
    return ((t, t + len(target)), (s, s + len(source)))


def test_the_model_reads_the_text_without_its_paired_tags():
    masked = mask("but it is <i>quite expensive</i> for a <b>small</b> office")
    assert model_text(masked) == "but it is quite expensive for a small office"
    # Other placeholders stay masked, numbered from 0 as the plain text has them.
    masked = mask("Copy <b>{0}</b> to <a href='x'>%s</a> now, &Dave")
    assert model_text(masked) == "Copy {0} to {1} now, Dave"
    assert model_text(mask("no tags {0} here")) == "no tags {0} here"


def test_spans_go_to_the_words_the_alignment_links_even_reordered():
    masked = mask("The <b>red</b> cat sleeps on the <i>old chair</i>.")
    formatting = split(masked)
    assert formatting is not None
    source = formatting.plain.text
    output = "Le chat rouge dort sur la vieille chaise."
    links = [link(output, "rouge", source, "red"), link(output, "chat", source, "cat"),
             link(output, "vieille", source, "old"), link(output, "chaise", source, "chair")]
    restored = formatting.restore(output, links)
    assert restored.text == "Le chat <b>rouge</b> dort sur la <i>vieille chaise</i>."
    assert not restored.repaired


def test_the_words_are_the_plain_translations_whatever_the_links():
    rng = random.Random(7)
    text = ("Tom &amp; Jerry <b>run</b> through <a href='/h'>the <i>big</i> house</a>, "
            "<b>{0}</b> times.")
    formatting = split(mask(text))
    assert formatting is not None and formatting.escaped
    source = formatting.plain.text
    assert source == "Tom & Jerry run through the big house, {0} times."
    output = "Tom & Jerry rennen {0} mal durch das große Haus."
    for _ in range(200):
        links = [((a, a + rng.randint(1, 4)), (b, b + rng.randint(1, 4)))
                 for a, b in ((rng.randrange(len(output)), rng.randrange(len(source)))
                              for _ in range(rng.randint(0, 8)))]
        restored = formatting.restore(output, links).text
        assert _TAGS.sub("", restored).replace("&amp;", "&") == output
        # Tags come back well nested, each exactly once.
        stack = []
        for tag in _TAGS.findall(restored):
            if tag.startswith("</"):
                assert stack and stack.pop() == tag[2:-1]
            else:
                stack.append(re.match(r"<(\w+)", tag)[1])
        assert not stack


def test_a_span_no_word_is_linked_to_goes_to_the_nearest_linked_word():
    formatting = split(mask("The meeting starts at <i>nine</i> tomorrow."))
    assert formatting is not None
    source = formatting.plain.text
    output = "Das Treffen beginnt morgen."
    links = [link(output, "Treffen", source, "meeting"), link(output, "morgen", source,
                                                             "tomorrow")]
    assert formatting.restore(output, links).text == "Das Treffen beginnt <i>morgen</i>."


def test_a_pair_inside_another_stays_inside_it():
    formatting = split(mask("Open <a href='/f'>the <b>new</b> file</a> now."))
    assert formatting is not None
    source = formatting.plain.text
    output = "Öffnen Sie jetzt die neue Datei."
    links = [link(output, "die", source, "the"), link(output, "neue", source, "new"),
             link(output, "Datei", source, "file"), link(output, "jetzt", source, "now")]
    assert formatting.restore(output, links).text == \
        "Öffnen Sie jetzt <a href='/f'>die <b>neue</b> Datei</a>."


def test_siblings_that_claim_one_word_nest_and_overlaps_are_trimmed():
    formatting = split(mask("the <b>contact</b> <i>form</i> and <u>the help</u>"))
    assert formatting is not None
    source = formatting.plain.text
    output = "das Kontaktformular und die Hilfe"
    links = [link(output, "Kontaktformular", source, "contact"),
             link(output, "Kontaktformular", source, "form"),
             ((output.index("die"), output.index("die") + 3),
              (source.index("the help"), source.index("the help") + 3)),
             link(output, "Hilfe", source, "help")]
    assert formatting.restore(output, links).text == \
        "das <b><i>Kontaktformular</i></b> und <u>die Hilfe</u>"


def test_a_chain_composes_its_legs_links_through_the_english():
    # de -> en: "Das Haus" -> "The house"; en (repaired) -> fr: "La maison".
    first = [((0, 3), (0, 3)), ((4, 9), (4, 8))]
    second = [((0, 2), (0, 3)), ((3, 9), (4, 9))]
    assert compose(second, "The house", "The house", first) == [((0, 2), (0, 3)),
                                                               ((3, 9), (4, 8))]
    # The English the second leg read differs from the first's output (a repair):
    # characters are matched where the two agree.
    assert compose([((0, 5), (2, 7))], "A house", "The house", first) == [((0, 5), (4, 8))]


def test_a_stray_link_does_not_stretch_a_span_over_words_that_translate_others():
    # The attention gave "Wir" to "Sundays" too: the span keeps to the run of words
    # with the most links into it (a link per token: "Sonn", "tags"), and does not
    # swallow "arbeiten nie am".
    formatting = split(mask("We <b>never</b> work on <i>Sundays</i>."))
    assert formatting is not None
    source = formatting.plain.text
    output = "Wir arbeiten nie am Sonntags."
    links = [link(output, "Wir", source, "Sundays"), link(output, "arbeiten", source, "work"),
             link(output, "nie", source, "never"), link(output, "am", source, "on"),
             link(output, "Sonn", source, "Sundays"), link(output, "tags", source, "Sundays")]
    assert formatting.restore(output, links).text == \
        "Wir arbeiten <b>nie</b> am <i>Sonntags</i>."


def test_an_article_given_to_the_noun_goes_back_to_the_unlinked_article():
    formatting = split(mask("La <b>maison</b> est très <i>grande</i>."))
    assert formatting is not None
    source = formatting.plain.text
    output = "The house is very big."
    # "The" attended to "maison" (the noun it agrees with); "La" got no link.
    links = [link(output, "The", source, "maison"), link(output, "house", source, "maison"),
             link(output, "is", source, "est"), link(output, "very", source, "très"),
             link(output, "big", source, "grande")]
    assert formatting.restore(output, links).text == "The <b>house</b> is very <i>big</i>."
    # Not when the pair has as many words as its range: "<i>old chair</i>" keeps both.
    formatting = split(mask("on the <i>old chair</i>"))
    assert formatting is not None
    output = "sur la vieille chaise"
    links = [link(output, "vieille", formatting.plain.text, "old"),
             link(output, "chaise", formatting.plain.text, "chair")]
    assert formatting.restore(output, links).text == "sur la <i>vieille chaise</i>"


def test_pairs_around_nothing_come_back_whatever_the_translation():
    formatting = split(mask("<b> </b>"))
    assert formatting is not None and formatting.plain.text == " "
    assert formatting.restore("", []).text == "<b></b>"
    formatting = split(mask("A <i>b</i> c"))
    assert formatting is not None
    assert formatting.restore("", []).text == "<i></i>"


def test_formatting_is_taken_off_without_placeholder_protection_too():
    # protect_placeholders off leaves `%s` and `_now` to the model, never the pairs.
    masked = mask("Open <b>%s</b> _now {0}", placeholders=False)
    assert model_text(masked) == "Open %s _now {0}"
    assert not split(mask("Open %s <br/> _now", placeholders=False))


def test_a_placeholder_the_model_drops_goes_where_it_goes_without_formatting():
    from seq2serve.server.core.placeholders import restore

    output = "Besuchen Sie die Seite heute."  # the model dropped {0}
    plain_text = restore(mask("Visit the site at {0} today."), output)
    formatting = split(mask("Visit <b>the site</b> at {0} today."))
    assert formatting is not None
    source = formatting.plain.text
    formatted = formatting.restore(output, [link(output, "Seite", source, "site")])
    assert _TAGS.sub("", formatted.text) == plain_text.text
    assert formatted.repaired and plain_text.repaired
    assert "<b>" in formatted.text
