"""format=html: blocks of text out of a fragment (one text per sentence, its inline tags
as tag pairs), translations back in, markup untouched."""

import random
import re
import sys

import pytest

from seq2serve.server.core.markup import MAX_INLINE_DEPTH, extract
from seq2serve.server.core.placeholders import SENTINEL, mask, restore

_WORDS = re.compile(r"\{\d+\}|[^\W\d_]+")


def model(masked: str) -> str:
    """A stand-in model: every word upper-cased, sentinels copied where they are."""
    return _WORDS.sub(lambda m: m.group(0) if SENTINEL.fullmatch(m.group(0))
                      else m.group(0).upper(), masked)


def through_core(text: str, model=model) -> str:
    """A text as the core translates it: masked, translated, restored."""
    masked = mask(text)
    return restore(masked, model(masked.text)).text


def upper(html: str, model=model) -> str:
    """The fragment with every block 'translated' to upper case through the core."""
    document = extract(html)
    return document.render([through_core(text, model) for text in document.texts])


def test_a_sentence_with_inline_tags_is_one_text():
    document = extract("<p>My name <b>is</b> Michael</p><p><b>Warning:</b> the disk is "
                       "almost full</p>")
    assert document.texts == ("My name <g1>is</g1> Michael",
                              "<g1>Warning:</g1> the disk is almost full")
    assert upper("<p>My name <b>is</b> Michael</p>") == "<p>MY NAME <b>IS</b> MICHAEL</p>"
    assert document.render(["Ich <g1>heiße</g1> Michael",
                            "<g1>Achtung:</g1> die Platte ist fast voll"]) == (
        "<p>Ich <b>heiße</b> Michael</p><p><b>Achtung:</b> die Platte ist fast voll</p>")


def test_the_bold_lands_on_the_words_the_model_moved_it_with():
    def reorder(masked: str) -> str:
        assert masked == "Please {0} open the file {1} and save it."
        return "Bitte speichern und {0} die Datei öffnen {1}."

    assert upper('<p>Please <b class="k">open the file</b> and save it.</p>', reorder) == \
        '<p>Bitte speichern und <b class="k">die Datei öffnen</b>.</p>'


def test_a_span_the_model_loses_goes_to_the_nearest_word_never_dropped():
    html = '<p>Please <a href="https://x.org/a?b=1&amp;c=2">open</a> the file.</p>'
    out = upper(html, lambda masked: "Bitte die Datei speichern.")
    # The core's repair puts the lost pair back before the full stop; the empty pair's
    # link goes to the word beside it, its href as it was.
    assert out == '<p>Bitte die Datei <a href="https://x.org/a?b=1&amp;c=2">speichern</a> .</p>'


def test_nested_links_images_and_code_ride_inside_the_sentence():
    html = ('<li>Open <a href="/f"><img src="i.png"> the <em>new</em> file</a> with '
            '<code>vi -R</code> and <span translate="no">Acme</span> now</li>')
    document = extract(html)
    # Each style is one flat pair (the link, the emphasis in the link), as for the office
    # formats; the image goes back inside the link it was in, nested tags as they were.
    assert document.texts == ("Open <x1/><g2> the </g2><g3>new</g3><g4> file</g4> with <x5/> "
                              "and <x6/> now",)
    assert upper(html) == ('<li>OPEN <a href="/f"><img src="i.png"> THE <em>NEW</em> FILE</a> '
                           'WITH <code>vi -R</code> AND <span translate="no">Acme</span> NOW</li>')


def test_blocks_separate_texts_inline_tags_do_not():
    html = ("<h1>A <i>title</i></h1><div>First line<br>second <u>line</u></div>"
            "<table><tr><td>one <sup>1</sup></td><td>two</td></tr></table>")
    assert extract(html).texts == ("A <g1>title</g1>", "First line", "second <g1>line</g1>",
                                   "one <g1>1</g1>", "two")


def test_a_block_in_one_style_is_its_plain_text():
    document = extract("<li><b>Tom &amp; Jerry</b></li><p><span>a <i>b</i></span></p>")
    assert document.texts == ("Tom & Jerry", "a <g1>b</g1>")
    assert document.render(["Tom & Jerry!", "x <g1>y</g1>"]) == \
        "<li><b>Tom &amp; Jerry!</b></li><p><span>x <i>y</i></span></p>"


@pytest.mark.parametrize("html", [
    "<p>a <b>b <i>c</b> d</i> e</p>",  # misnested
    "<p><b>bold<br>still bold</b> plain</p>",  # across a block boundary
    "<p>a <b>open to the end</p>",  # never closed
    "<p>" + "<span>" * (MAX_INLINE_DEPTH + 1) + "deep" + "</span>" * (MAX_INLINE_DEPTH + 1)
    + "</p>",
])
def test_inline_tags_that_do_not_nest_split_the_block_as_before(html):
    document = extract(html)
    assert all("<g" not in text and "<x" not in text for text in document.texts)
    assert len(document.texts) > 1 or html.count("<span>") > MAX_INLINE_DEPTH
    assert document.render(document.texts) == html
    assert upper(html) == re.sub(r">([^<]+)<", lambda m: ">" + m.group(1).upper() + "<", html)


def test_whitespace_stays_around_the_runs():
    document = extract("<li>\n    Save the\n file  </li>\n<li>&nbsp;Open&#160;</li>")
    assert document.texts == ("Save the\n file", "Open")
    assert document.render(["A", "B"]) == "<li>\n    A  </li>\n<li>&nbsp;B&#160;</li>"


def test_entities_are_unescaped_for_the_model_and_escaped_back():
    document = extract("<p>Tom &amp; Jerry &lt;3 &copy; caf&eacute;</p>")
    assert document.texts == ("Tom & Jerry <3 © café",)
    assert document.render(["Tom & Jerry <3"]) == "<p>Tom &amp; Jerry &lt;3</p>"


def test_a_translation_cannot_inject_markup():
    document = extract("<p>Hello</p>")
    rendered = document.render(['<script>alert("x")</script> &amp;'])
    assert rendered == '<p>&lt;script&gt;alert("x")&lt;/script&gt; &amp;amp;</p>'


def test_an_unchanged_run_keeps_its_spelling():
    document = extract("<p>it&#39;s &quot;here&quot;</p><p>go</p>")
    assert document.texts == ("it's \"here\"", "go")
    assert document.render([document.texts[0], "geh"]) == \
        "<p>it&#39;s &quot;here&quot;</p><p>geh</p>"


@pytest.mark.parametrize("element", ["code", "kbd", "pre", "script", "style"])
def test_code_elements_and_their_descendants_are_kept(element):
    html = f"Run <{element}>make <b>all</b> &amp; wait</{element}> now"
    document = extract(html)
    # Inline code rides in the sentence as one opaque tag; a block of code separates.
    inline = element in ("code", "kbd")
    assert document.texts == (("Run <x1/> now",) if inline else ("Run", "now"))
    assert upper(html) == f"RUN <{element}>make <b>all</b> &amp; wait</{element}> NOW"


def test_script_content_is_not_text_even_with_tags_inside():
    html = "<script>if (a < b && c) { s = '<p>x</p>'; }</script><p>Hi</p>"
    assert extract(html).texts == ("Hi",)


@pytest.mark.parametrize("marker", ['translate="no"', "translate='NO '", "translate=no",
                                    'class="brand notranslate"', "class=notranslate"])
def test_marked_elements_and_their_descendants_are_kept(marker):
    html = f'<div {marker}>Acme <i>Widgets</i><p translate="yes">Inc</p></div><p>Buy</p>'
    assert extract(html).texts == ("Buy",)


def test_translate_yes_and_other_classes_are_translated():
    html = '<p translate="yes">One</p><p class="note translated">Two</p><p class>Three</p>'
    assert extract(html).texts == ("One", "Two", "Three")


def test_tags_attributes_comments_and_declarations_come_back_byte_for_byte():
    html = ("<!DOCTYPE html>\n<!-- a comment -->"
            "<A HREF=x?a=1&amp;b=2 Title='The title'>Link</A >"
            "<img alt=\"An image\" src='i.png'/><?php echo 1 ?><![CDATA[data]]>"
            "<P\nclass=\"x\"\n>Last</p\n>")
    document = extract(html)
    assert document.texts == ("Link", "Last")
    assert document.render(["L", "Z"]) == html.replace(">Link<", ">L<").replace(
        ">Last<", ">Z<")


def test_void_elements_open_nothing():
    html = '<code>x</code><img translate="no" src=a><br class=notranslate>Text<hr>More'
    assert extract(html).texts == ("Text", "More")


def test_runs_without_letters_are_kept():
    html = "<td>2024</td><td> | </td><td>&copy;</td><td>42 MB</td><td>—</td>"
    assert extract(html).texts == ("42 MB",)


def test_misnested_and_stray_end_tags():
    # </div> closes the <code> opened inside it, as browsers do; stray end tags close nothing.
    html = "</code></pre><div><code>x = 1</div> after</span> end"
    assert extract(html).texts == ("after", "end")


def test_render_needs_one_translation_per_run():
    document = extract("<p>a</p><p>b</p>")
    with pytest.raises(ValueError, match="translations: 1 given for 2 text blocks"):
        document.render(["x"])


def test_empty_and_markup_only_fragments():
    for html in ["", "   ", "<br>", "<!-- only -->", "<code>x</code>"]:
        document = extract(html)
        assert document.texts == ()
        assert document.render([]) == html


def test_plain_text_is_one_run():
    assert extract("Hello world.").texts == ("Hello world.",)


def test_broken_character_references_do_not_swallow_the_markup():
    # The standard parser stops at `&#;` and resumes on the next feed: the tags after it
    # must still be tags, not text.
    html = "a &#; b &#; c &#x; <b>bold</b> end"
    document = extract(html)
    assert document.texts == ("a &amp;#; b &amp;#; c &amp;#x; <g1>bold</g1> end",)
    assert upper(html) == "A &amp;#; B &amp;#; C &amp;#X; <b>BOLD</b> END"


def test_input_the_parser_rejects_is_kept_from_there_on():
    # html.parser raises AssertionError on an unknown marked section.
    html = "<p>Before</p><![foo[ x ]]><p>after</p>"
    document = extract(html)
    assert document.texts == ("Before",)
    assert upper(html) == "<p>BEFORE</p><![foo[ x ]]><p>after</p>"


MALFORMED = [
    "<p>unclosed <b>bold <i>italic",
    "text <b",
    "text <",
    "a < b > c",
    "<a href='x>y'>t</a>",
    '<a href="unterminated>t</a>',
    "x <!-- unterminated comment",
    "<script>var x = 1",
    "<style>p { color: red }",
    "AT&T &amp &nbsp &unknown; &#12345678; &#x110000;",
    "</>< / ></ p>",
    "<p\n",
    "<<p>>text<</p>>",
    "<![CDATA[ unterminated",
    "<!DOCTYPE",
    "a\r\nb<br>\r\nc",
    "\u00a0\u2003Hello\u3000",
]


@pytest.mark.parametrize("html", MALFORMED)
def test_malformed_input_round_trips(html):
    document = extract(html)
    assert document.render(document.texts) == html
    _check_invariants(html)


TOKENS = ["<p>", "</p>", "<b>", "</b>", "<code>", "</code>", "<script>", "</script>",
          "<br/>", "<img alt='a>b'>", "<!-- c -->", "<!--", "-->", "&amp;", "&nbsp;",
          "&#39;", "&#;", "&#x20;", "&", "<", ">", "AT&T", " ", "\n", "word", "Wort",
          '<div translate="no">', "</div>", '<span class="notranslate">', "</span>",
          "<![CDATA[x]]>", "<!DOCTYPE html>", "<?pi?>", "</", '<a href="', '"', "'",
          "&#x1F600;", "<![if x]>", "<![foo[", "<style>", "</style>", "<pre>", "</pre>"]


def _check_invariants(html: str) -> None:
    document = extract(html)
    assert len(document.parts) == len(document.texts) + 1 == len(document.sources) + 1
    # Identity reproduces the input exactly.
    assert document.render(document.texts) == html
    assert "".join(p + s for p, s in zip(document.parts[:-1], document.sources, strict=True)) \
        + document.parts[-1] == html
    for text in document.texts:
        assert text == text.strip() and any(ch.isalpha() for ch in text)
    # A translation full of markup characters adds no markup: it comes back escaped, and
    # the only markup in a block is its own (its tags, each where the core put it).
    rendered = document.render(["<x>&" for _ in document.texts])
    assert "<x>" not in rendered
    assert rendered.count("&lt;") >= len(document.texts)


def test_random_fragments_round_trip():
    rng = random.Random(20240601)
    for _ in range(2000):
        html = "".join(rng.choice(TOKENS) for _ in range(rng.randrange(0, 30)))
        _check_invariants(html)


def _frame_depth() -> int:
    depth, frame = 0, sys._getframe()
    while frame is not None:
        depth, frame = depth + 1, frame.f_back
    return depth


def test_deep_nesting_uses_no_recursion():
    levels = 10_000
    html = "<div>" * levels + "deep <b>text</b>" + "</div>" * levels
    # A recursion limit just above this frame: parsing 10,000 levels must not go deeper.
    old_limit = sys.getrecursionlimit()
    sys.setrecursionlimit(_frame_depth() + 40)
    try:
        document = extract(html)
    finally:
        sys.setrecursionlimit(old_limit)
    assert document.texts == ("deep <g1>text</g1>",)
    assert document.render(document.texts) == html
    assert document.render(["tief <g1>Text</g1>"]) == html.replace("deep", "tief").replace(
        "text", "Text")


def test_deep_nesting_inside_a_kept_element():
    html = "<code>" + "<span>" * 10_000 + "x" + "</span>" * 10_000 + "</code> after"
    assert extract(html).texts == ("after",)


def test_many_unclosed_elements():
    html = "<p>line " * 10_000
    document = extract(html)
    assert len(document.texts) == 10_000
    assert document.render(document.texts) == html


def test_xml_rules_split_ignore_and_find_running_text() -> None:
    """DeepL's tag_handling=xml: ignore_tags kept, splitting_tags always split,
    non_splitting_tags never; outline detection makes an element of running text
    inline and the others blocks; without it only splitting_tags split."""
    from seq2serve.server.core.markup import xml_rules

    xml = ("<doc><title>Hello world</title><para>This is <term>good</term> text."
           "<skip>keep me</skip></para></doc>")
    document = extract(xml, xml_rules(ignore=frozenset({"skip"})))
    assert document.texts == ("Hello world", "This is <g1>good</g1> text.")
    assert document.render(list(document.texts)) == xml
    flat = extract("<r><a>One</a> <b>Two</b> <c>Three</c></r>",
                   xml_rules(splitting=frozenset({"c"}), outline_detection=False))
    assert flat.texts == ("One <g1>Two</g1>", "Three")  # one sentence, then a split
    outlined = extract("<r><a>One</a><b>Two</b></r>", xml_rules())  # no running text
    assert outlined.texts == ("One", "Two")
    kept = extract("<r><a>One</a><b>Two</b></r>",
                   xml_rules(non_splitting=frozenset({"a", "b"})))
    assert kept.texts == ("One<g1>Two</g1>",)
