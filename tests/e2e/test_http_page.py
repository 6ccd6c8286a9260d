"""The translation page (server/api/http/static/) in a real browser against a real
server: Debian's chromium, driven by Playwright (which cannot download a browser
here), on the HTTP front door of a server serving the tiny Marian model.

The page must show what the API answers (the same request replayed with httpx),
show every failure in words in #error (the server's message, a network failure),
fit a 375 px phone without horizontal scrolling, load nothing from any other host,
and run under the server's Content-Security-Policy without a violation.
"""

from __future__ import annotations

import html.parser
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol
from urllib.parse import urlsplit

import httpx
import pytest
from browser import CHROMIUM_ARGS, chromium
from playwright.sync_api import (
    Browser,
    BrowserContext,
    ConsoleMessage,
    FilePayload,
    Page,
    Response,
    Route,
    ViewportSize,
    expect,
    sync_playwright,
)
from serving import RunningServer, free_port, server_config

STATIC = Path(__file__).resolve().parents[2] / "server" / "api" / "http" / "static"
CHAR_LIMIT = 120  # the server's max_text_chars: the page's charLimit
SENTENCE = "Open the file and save your changes."
WAIT_MS = 30_000  # the machine may be loaded; a translation of the tiny model takes ms
DESKTOP: ViewportSize = {"width": 1280, "height": 800}
PHONE: ViewportSize = {"width": 375, "height": 812}
ADMIN_KEY = "page-admin"

needs_chromium = pytest.mark.needs("chromium")

# Records what the CSP blocks, from before the page's own script runs (an init
# script is injected by the browser, outside the page's policy).
RECORD_CSP_VIOLATIONS = """
window.__cspViolations = [];
document.addEventListener("securitypolicyviolation", (event) => {
  window.__cspViolations.push(`${event.violatedDirective} blocked ${event.blockedURI}`);
});
"""


@pytest.fixture(scope="module")
def server(models_dir: Path) -> Iterator[RunningServer]:
    running = RunningServer(server_config(models_dir, http_port=free_port(),
                                          max_text_chars=CHAR_LIMIT))
    yield running
    running.stop()


@pytest.fixture
def lazy_url(models_dir: Path, tmp_path: Path) -> Iterator[str]:
    """A server started with --lazy: the tiny model is found and checked, not loaded
    (one per test: a translation loads it); ADMIN_KEY unloads and loads it."""
    keys = tmp_path / "admin-keys"
    keys.write_text(ADMIN_KEY + "\n")
    running = RunningServer(server_config(models_dir, http_port=free_port(), lazy=True,
                                          max_text_chars=CHAR_LIMIT, admin_keys=keys))
    assert running.http_url is not None
    yield running.http_url
    running.stop()


@pytest.fixture(scope="module")
def base_url(server: RunningServer) -> str:
    assert server.http_url is not None, "the server has no HTTP port"
    return server.http_url


@pytest.fixture(scope="module")
def api(base_url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=base_url, timeout=60) as client:
        yield client


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=chromium(),
                                              args=CHROMIUM_ARGS)
        yield launched
        launched.close()


@dataclass
class Watched:
    """A page and what it did: every request's URL, console messages, script errors."""

    page: Page
    requests: list[str] = field(default_factory=list)
    console: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def assert_clean(self, base_url: str) -> None:
        """Nothing from another host, no CSP violation, no uncaught script error."""
        server = urlsplit(base_url).netloc
        foreign = [url for url in self.requests
                   if urlsplit(url).scheme not in ("data", "blob")
                   and (urlsplit(url).scheme, urlsplit(url).netloc) != ("http", server)]
        assert foreign == [], f"requests to other hosts: {foreign}"
        csp = [text for text in self.console if "content security policy" in text.lower()]
        assert csp == [], f"CSP violations in the console: {csp}"
        assert self.page.evaluate("window.__cspViolations") == []
        assert self.errors == [], f"uncaught errors in the page: {self.errors}"


class OpenPage(Protocol):
    def __call__(self, viewport: ViewportSize = ..., permissions: Sequence[str] = ...) -> Watched:
        ...


@pytest.fixture
def open_page(browser: Browser, base_url: str) -> Iterator[OpenPage]:
    """Opens the page in fresh browser contexts (own storage, own permissions),
    closed after the test. A viewport narrower than 480 px is a phone's (mobile
    viewport rules, touch, 2x pixels)."""
    contexts: list[BrowserContext] = []

    def opener(viewport: ViewportSize = DESKTOP, permissions: Sequence[str] = ()) -> Watched:
        phone = viewport["width"] < 480
        context = browser.new_context(viewport=viewport, permissions=list(permissions),
                                      is_mobile=phone, has_touch=phone,
                                      device_scale_factor=2 if phone else 1)
        contexts.append(context)
        return load(context.new_page(), base_url)

    yield opener
    for context in contexts:
        context.close()


def load(page: Page, base_url: str) -> Watched:
    """The page at `/`, watched from before it loads; it checks that the page is
    served under the strict policy it is written for."""
    watched = Watched(page)
    page.on("request", lambda request: watched.requests.append(request.url))
    page.on("console", lambda message: watched.console.append(_console_line(message)))
    page.on("pageerror", lambda error: watched.errors.append(str(error)))
    page.add_init_script(RECORD_CSP_VIOLATIONS)
    response = page.goto(base_url + "/")
    assert response is not None and response.status == 200
    assert "default-src 'self'" in response.headers.get("content-security-policy", "")
    # The page has read /frontend/settings and /languages once the pickers are on.
    expect(page.locator("#source-lang")).to_be_enabled(timeout=WAIT_MS)
    return watched


def _console_line(message: ConsoleMessage) -> str:
    return f"{message.type}: {message.text}"


def pick_pair(page: Page, api: httpx.Client) -> tuple[str, str]:
    """en -> the first target of en that the server lists, chosen in the pickers."""
    languages = {lang["code"]: lang for lang in api.get("/languages").json()}
    target = languages["en"]["targets"][0]
    page.select_option("#source-lang", "en")
    page.select_option("#target-lang", target)
    return "en", target


def is_translation_of(text: str) -> Callable[[Response], bool]:
    """Matches the answer to the page's POST /translate of `text`."""
    def matches(response: Response) -> bool:
        request = response.request
        if not response.url.endswith("/translate") or request.method != "POST":
            return False
        try:
            body = request.post_data_json
        except ValueError:
            return False
        return isinstance(body, dict) and body.get("q") == text
    return matches


def scroll_width(page: Page) -> int:
    return int(page.evaluate("document.scrollingElement.scrollWidth"))


def screenshot(page: Page, path: Path) -> None:
    page.screenshot(path=str(path), full_page=True)
    print(f"screenshot: {path}")


# -- the page's source, no browser needed ---------------------------------------------

class _AssetCheck(html.parser.HTMLParser):
    """What in index.html would break under `default-src 'self'` or leave the server."""

    def __init__(self) -> None:
        super().__init__()
        self.problems: list[str] = []
        self.ids: set[str] = set()
        self._in_script = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        if values.get("id"):
            self.ids.add(str(values["id"]))
        for name, value in attrs:
            if name.startswith("on") or name == "style":
                self.problems.append(f"<{tag} {name}=...> is inline script or style")
            if name in ("src", "href", "action") and value:
                where = urlsplit(value)
                if where.scheme not in ("", "data") or where.netloc:
                    self.problems.append(f"<{tag} {name}={value!r}> leaves the server")
                if where.scheme == "javascript":
                    self.problems.append(f"<{tag} {name}={value!r}> is inline script")
        if tag == "style":
            self.problems.append("<style> is inline style")
        if tag == "script":
            self._in_script = True
            if not values.get("src"):
                self.problems.append("<script> without src is inline script")

    def handle_endtag(self, tag: str) -> None:
        if tag == "script":
            self._in_script = False


def test_page_source_has_nothing_inline_and_nothing_from_elsewhere() -> None:
    check = _AssetCheck()
    check.feed((STATIC / "index.html").read_text(encoding="utf-8"))
    assert check.problems == []
    documented = (STATIC / "app.js").read_text(encoding="utf-8").split("*/", 1)[0]
    for element in ("error", "source-text", "target-text", "source-lang", "target-lang", "swap",
                    "summarize-tab", "file-input", "char-count", "copy", "alternatives"):
        assert element in check.ids, f"#{element} is not in index.html"
        assert f"#{element}" in documented, f"#{element} is not documented atop app.js"
    for name in ("app.js", "app.css"):
        text = (STATIC / name).read_text(encoding="utf-8")
        assert "http://" not in text and "https://" not in text, f"{name} names another host"


def test_languages_say_what_is_loaded(lazy_url: str, api: httpx.Client) -> None:
    """Under --lazy /languages lists the pair before its model loads, with LibreTranslate's
    fields as they are and ours saying it is not loaded; a request loads it, and then
    /languages and GET /v1/models say so. A server that loads all at start lists all
    loaded. The page's script reads these fields (the browser test below shows them)."""
    with httpx.Client(base_url=lazy_url, timeout=60) as lazy:
        before = {lang["code"]: lang for lang in lazy.get("/languages").json()}
        [model] = lazy.get("/v1/models").json()["models"]
        assert model["state"] == "available"
        eager = {lang["code"]: lang for lang in api.get("/languages").json()}
        assert before.keys() == eager.keys() and "en" in before
        for code, lang in before.items():  # LibreTranslate's three, then ours
            assert list(lang) == ["code", "name", "targets", "loaded", "loadedTargets",
                                  "unavailableTargets"]
            assert {k: lang[k] for k in ("code", "name", "targets")} == \
                {k: eager[code][k] for k in ("code", "name", "targets")}
            assert (lang["loaded"], lang["loadedTargets"], lang["unavailableTargets"]) == \
                (False, [], [])
            assert (eager[code]["loaded"], eager[code]["loadedTargets"]) == \
                (True, eager[code]["targets"])
        target = before["en"]["targets"][0]
        answer = lazy.post("/translate", json={"q": SENTENCE, "source": "en", "target": target})
        assert answer.status_code == 200, answer.text
        after = {lang["code"]: lang for lang in lazy.get("/languages").json()}
        assert after["en"]["loaded"] and after["en"]["loadedTargets"] == before["en"]["targets"]
        assert after[target]["loaded"]
        [model] = lazy.get("/v1/models").json()["models"]
        assert model["state"] == "ready"
        page = lazy.get("/static/app.js").text
        assert "loadedTargets" in page and "loads on first request" in page


# -- in the browser -------------------------------------------------------------------

@needs_chromium
def test_typing_shows_what_the_api_answers(open_page: OpenPage, base_url: str,
                                           api: httpx.Client, tmp_path: Path) -> None:
    watched = open_page(permissions=["clipboard-read", "clipboard-write"])
    page = watched.page
    source, target = pick_pair(page, api)
    with page.expect_response(is_translation_of(SENTENCE), timeout=WAIT_MS) as answer:
        page.locator("#source-text").press_sequentially(SENTENCE, delay=5)
    sent = answer.value.request.post_data_json
    assert isinstance(sent, dict), sent
    assert sent["source"] == source and sent["target"] == target
    assert sent["alternatives"] == 2  # the page asks for alternatives
    expected = api.post("/translate", json=sent)
    assert expected.status_code == 200, expected.text
    want = expected.json()
    expect(page.locator("#target-text")).to_have_value(want["translatedText"], timeout=WAIT_MS)
    alternatives = page.locator("#alternatives li button")
    expect(alternatives).to_have_text(want.get("alternatives", []))
    expect(page.locator("#char-count")).to_contain_text(f"{len(SENTENCE)} / {CHAR_LIMIT}")
    expect(page.locator("#error")).to_be_empty()

    page.click("#copy")
    expect(page.locator("#copy-status")).to_have_text("Copied")
    assert page.evaluate("navigator.clipboard.readText()") == want["translatedText"]

    # The tiny model translates one way only: swap is off, and the page says why.
    languages = {lang["code"]: lang for lang in api.get("/languages").json()}
    if not languages[target]["targets"]:
        expect(page.locator("#swap")).to_be_disabled()
        expect(page.locator("#swap-note")).to_contain_text(languages[target]["name"])
    else:
        page.click("#swap")
        expect(page.locator("#source-lang")).to_have_value(target)
    screenshot(page, tmp_path / "page-desktop.png")
    watched.assert_clean(base_url)


@needs_chromium
def test_the_page_says_which_models_are_loaded(open_page: OpenPage, browser: Browser,
                                               lazy_url: str, base_url: str,
                                               api: httpx.Client) -> None:
    """On a --lazy server the chosen pair's target is marked and #model-note says its
    model loads on the first request; once a translation has loaded it, both say it is
    loaded. On a server that loads everything at start the page says nothing of it."""
    context = browser.new_context(viewport=DESKTOP)
    try:
        watched = load(context.new_page(), lazy_url)
        page = watched.page
        source, target = pick_pair(page, api)
        note = page.locator("#model-note")
        expect(note).to_have_attribute("data-loaded", "false")
        expect(note).to_contain_text("loads on the first request")
        name = {lang["code"]: lang["name"] for lang in api.get("/languages").json()}[target]
        chosen = page.locator(f"#target-lang option[value='{target}']")
        expect(chosen).to_have_text(f"{name} · loads on first request")
        with page.expect_response(is_translation_of(SENTENCE), timeout=WAIT_MS):
            page.fill("#source-text", SENTENCE)
        expect(page.locator("#target-text")).not_to_have_value("", timeout=WAIT_MS)
        languages = {lang["code"]: lang for lang in httpx.get(f"{lazy_url}/languages",
                                                              timeout=60).json()}
        assert languages[source]["loadedTargets"] == [target]  # the server's answer
        # Everything the tiny server serves is loaded now: the marks and the note go.
        expect(chosen).to_have_text(name, timeout=WAIT_MS)
        expect(note).to_be_empty()
        expect(page.locator("#error")).to_be_empty()
        watched.assert_clean(lazy_url)
    finally:
        context.close()
    watched = open_page()
    pick_pair(watched.page, api)
    expect(watched.page.locator("#model-note")).to_be_empty()
    assert not watched.page.locator("#target-lang option").first.inner_text().endswith(
        "loads on first request")
    watched.assert_clean(base_url)


@needs_chromium
def test_the_page_says_a_model_unloaded_by_the_operator_is_not_served(
        browser: Browser, lazy_url: str, api: httpx.Client) -> None:
    """After an operator's unload the chosen pair's target is marked "unloaded by the
    operator" and #model-note says it is not served (no promise of a load), a
    translation shows the server's refusal; once the operator loads it again, a
    translation is answered and the marks go."""
    admin = {"X-Admin-Key": ADMIN_KEY}
    with httpx.Client(base_url=lazy_url, timeout=120) as lazy:
        [model] = lazy.get("/v1/models").json()["models"]
        unloaded = lazy.post(f"/v1/models/{model['name']}/unload", headers=admin)
        assert unloaded.status_code == 200, unloaded.text
        context = browser.new_context(viewport=DESKTOP)
        try:
            watched = load(context.new_page(), lazy_url)
            page = watched.page
            source, target = pick_pair(page, api)
            languages = {lang["code"]: lang for lang in lazy.get("/languages").json()}
            assert languages[source]["unavailableTargets"] == [target]  # the server's answer
            name = languages[target]["name"]
            chosen = page.locator(f"#target-lang option[value='{target}']")
            expect(chosen).to_have_text(f"{name} · unloaded by the operator")
            note = page.locator("#model-note")
            expect(note).to_have_attribute("data-loaded", "unavailable")
            expect(note).to_contain_text("Unloaded by the operator")
            expect(note).not_to_contain_text("first request")
            with page.expect_response(is_translation_of(SENTENCE), timeout=WAIT_MS) as sent:
                page.fill("#source-text", SENTENCE)
            refused = lazy.post("/translate", json=sent.value.request.post_data_json)
            assert refused.status_code == 503
            expect(page.locator("#error")).to_contain_text(refused.json()["error"],
                                                           timeout=WAIT_MS)
            assert "unloaded by the operator" in refused.json()["error"]
            expect(page.locator("#target-text")).to_have_value("")

            loaded = lazy.post(f"/v1/models/{model['name']}/load", headers=admin)
            assert loaded.status_code == 200, loaded.text
            page.fill("#source-text", "Close the file.")
            expect(page.locator("#target-text")).not_to_have_value("", timeout=WAIT_MS)
            expect(page.locator("#error")).to_be_empty()
            expect(chosen).to_have_text(name, timeout=WAIT_MS)  # /languages asked again
            expect(note).to_be_empty()
            watched.assert_clean(lazy_url)
        finally:
            context.close()


@needs_chromium
def test_errors_are_shown_in_words(open_page: OpenPage, base_url: str,
                                   api: httpx.Client) -> None:
    watched = open_page()
    page = watched.page
    pick_pair(page, api)
    error = page.locator("#error")
    expect(error).to_have_attribute("role", "alert")

    # Over the character limit: the server's own message, and the counter says so.
    too_long = ("word " * CHAR_LIMIT)[:CHAR_LIMIT + 1]
    with page.expect_response(is_translation_of(too_long), timeout=WAIT_MS) as answer:
        page.fill("#source-text", too_long)
    refused = api.post("/translate", json=answer.value.request.post_data_json)
    assert refused.status_code == 400
    expect(error).to_contain_text(refused.json()["error"], timeout=WAIT_MS)
    expect(page.locator("#char-count")).to_have_class("count over")
    expect(page.locator("#target-text")).to_have_value("")

    # Back within the limit: the error goes, the translation comes.
    page.fill("#source-text", SENTENCE)
    expect(error).to_be_empty(timeout=WAIT_MS)
    expect(page.locator("#target-text")).not_to_have_value("", timeout=WAIT_MS)

    # The server unreachable: said in words too, never a silent failure.
    page.route("**/translate", lambda route: route.abort("internetdisconnected"))
    page.fill("#source-text", "Close the file.")
    expect(error).to_contain_text("network error", timeout=WAIT_MS)
    expect(page.locator("#target-text")).to_have_value("")
    page.unroute("**/translate")

    # Summarize: the summary, or (no summarization model here) the server's reason.
    page.click("#summarize-tab")
    expect(page.locator("#summarize-panel")).to_be_visible()
    page.fill("#summarize-text", SENTENCE)
    page.click("#summarize-run")
    summary = api.post("/summarize", json={"q": SENTENCE})
    if summary.status_code == 200:
        expect(page.locator("#summary-text")).to_have_value(summary.json()["summary"],
                                                            timeout=WAIT_MS)
    else:
        expect(error).to_contain_text(summary.json()["error"], timeout=WAIT_MS)
    watched.assert_clean(base_url)


@needs_chromium
def test_a_file_comes_back_translated(open_page: OpenPage, base_url: str,
                                      api: httpx.Client) -> None:
    watched = open_page()
    page = watched.page
    page.click("#files-tab")
    source, target = pick_pair(page, api)
    lines = [SENTENCE, "", "Close the file."]
    # A name with what a URL must encode: the link still leads to the file.
    notes: FilePayload = {"name": "Notes für #2 (50% done?).txt", "mimeType": "text/plain",
                          "buffer": "\n".join(lines).encode("utf-8")}
    page.set_input_files("#file-input", files=[notes])
    page.click("#file-translate")
    link = page.locator("#file-download")
    expect(link).to_be_visible(timeout=WAIT_MS)
    expect(page.locator("#error")).to_be_empty()
    href = link.get_attribute("href")
    assert href is not None and urlsplit(href).netloc == urlsplit(base_url).netloc
    assert not urlsplit(href).query and not urlsplit(href).fragment, href
    assert link.get_attribute("download") == f"Notes für #2 (50% done?).{target}.txt"
    downloaded = api.get(href)
    assert downloaded.status_code == 200
    texts = [line for line in lines if line]
    translated = iter(api.post("/translate", json={"q": texts, "source": source,
                                                   "target": target}).json()["translatedText"])
    assert downloaded.text == "\n".join(next(translated) if line else line for line in lines)
    watched.assert_clean(base_url)


@needs_chromium
def test_a_file_job_s_progress_is_shown(open_page: OpenPage, base_url: str,
                                        api: httpx.Client) -> None:
    """While the job translates, the page says how far it is and what is left (the
    server's answer to GET /v1/jobs/{id}, held at "translating" here until the page
    has shown it), then links the file."""
    watched = open_page()
    page = watched.page
    page.click("#files-tab")
    pick_pair(page, api)
    held = {"translating": True}

    def status(route: Route) -> None:
        if not held["translating"]:
            route.continue_()
            return
        answer = route.fetch()
        job = answer.json()
        job.update(state="translating", progress={"done": 3, "total": 40},
                   secondsRemaining=5)
        route.fulfill(response=answer, json=job)

    page.route("**/v1/jobs/*", status)
    page.set_input_files("#file-input", files=[{"name": "notes.txt", "mimeType": "text/plain",
                                                "buffer": SENTENCE.encode("utf-8")}])
    page.click("#file-translate")
    expect(page.locator("#file-busy")).to_have_text(
        "Translating notes.txt: 3 of 40 texts, about 5 s left", timeout=WAIT_MS)
    expect(page.locator("#file-progress")).to_be_visible()
    assert page.locator("#file-progress").get_attribute("max") == "40"
    assert page.eval_on_selector("#file-progress", "bar => bar.value") == 3
    held["translating"] = False
    expect(page.locator("#file-download")).to_be_visible(timeout=WAIT_MS)
    expect(page.locator("#file-progress")).to_be_hidden()
    page.unroute("**/v1/jobs/*")
    watched.assert_clean(base_url)


@needs_chromium
def test_a_phone_needs_no_horizontal_scroll(open_page: OpenPage, base_url: str,
                                            api: httpx.Client, tmp_path: Path) -> None:
    watched = open_page(viewport=PHONE)
    page = watched.page
    pick_pair(page, api)
    page.fill("#source-text", SENTENCE)
    expect(page.locator("#target-text")).not_to_have_value("", timeout=WAIT_MS)
    assert scroll_width(page) <= PHONE["width"]
    # A long error message, and an unbroken word, still wrap.
    page.fill("#source-text", "x" * (CHAR_LIMIT + 1))
    expect(page.locator("#error")).not_to_be_empty(timeout=WAIT_MS)
    assert scroll_width(page) <= PHONE["width"]
    screenshot(page, tmp_path / "page-phone.png")
    for tab in ("#files-tab", "#summarize-tab"):
        page.click(tab)
        assert scroll_width(page) <= PHONE["width"], tab
    watched.assert_clean(base_url)

