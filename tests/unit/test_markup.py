"""format=html: text runs out of a fragment, translations back in, markup untouched."""

import random
import sys

import pytest

from seq2serve.server.core.markup import extract


def upper(html: str) -> str:
    """The fragment with every run 'translated' to upper case."""
    document = extract(html)
    return document.render([text.upper() for text in document.texts])


def test_inline_tags_split_the_sentence():
    document = extract("<p><b>Warning:</b> the disk is almost full</p>")
    assert document.texts == ("Warning:", "the disk is almost full")
    assert document.render(["Achtung:", "die Platte ist fast voll"]) == \
        "<p><b>Achtung:</b> die Platte ist fast voll</p>"


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


@pytest.mark.parametrize("element", ["code", "pre", "script", "style"])
def test_code_elements_and_their_descendants_are_kept(element):
    html = f"Run <{element}>make <b>all</b> &amp; wait</{element}> now"
    document = extract(html)
    assert document.texts == ("Run", "now")
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
    with pytest.raises(ValueError, match="translations: 1 given for 2 text runs"):
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
    assert document.texts == ("a &#; b &#; c &#x;", "bold", "end")
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
    # A translation full of markup characters adds no markup: every `<` in the output
    # comes from the fragment's markup.
    rendered = document.render(["<x>&" for _ in document.texts])
    assert rendered.count("<") == sum(part.count("<") for part in document.parts)


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
    assert document.texts == ("deep", "text")
    assert document.render(document.texts) == html
    assert document.render(["tief", "Text"]) == html.replace("deep", "tief").replace(
        "text", "Text")


def test_deep_nesting_inside_a_kept_element():
    html = "<code>" + "<span>" * 10_000 + "x" + "</span>" * 10_000 + "</code> after"
    assert extract(html).texts == ("after",)


def test_many_unclosed_elements():
    html = "<p>line " * 10_000
    document = extract(html)
    assert len(document.texts) == 10_000
    assert document.render(document.texts) == html
