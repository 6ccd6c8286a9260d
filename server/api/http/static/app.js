/*
 * seq2serve's translation page: plain JavaScript, no framework, no build step.
 * Everything it loads comes from this server (/static/...) and nothing is inline,
 * so the server's Content-Security-Policy (default-src 'self') holds.
 *
 * It speaks the server's LibreTranslate API: GET /frontend/settings, GET /languages,
 * POST /translate, /summarize and /v1/jobs (a file as a document job, whose progress it
 * polls with GET /v1/jobs/{id}). Every failure is shown in words
 * in #error (the server's {"error": ...} message, or the HTTP status, or a network
 * failure); nothing fails silently.
 *
 * Element ids (stable: tests/e2e/test_http_page.py drives the page by them):
 *   #error             role="alert": the last error in words; empty while all is well
 *   #translate-tab, #files-tab, #summarize-tab   the tabs (role="tab")
 *   #translate-panel, #files-panel, #summarize-panel   their panels
 *   #key-row, #api-key, #api-key-save   the API key form, shown when the server uses
 *                      keys; the key is kept in localStorage
 *   #source-lang       source language <select>; "auto" is Auto Detect
 *   #target-lang       target language <select>; its options follow #source-lang
 *   #swap              swaps the languages (and the texts); disabled, with the reason
 *                      in #swap-note, when no model translates from the target
 *   #model-note        while this server holds some model not loaded (--lazy, a memory
 *                      budget, an operator's unload): whether the chosen pair's models
 *                      are loaded, its data-loaded "true", "false", "unavailable" (a
 *                      model unloaded by the operator: refused until loaded again) or ""
 *                      (auto: it depends on the detected language); options whose
 *                      models are not loaded end in " · loads on first request", those
 *                      whose model the operator unloaded in " · unloaded by the
 *                      operator" (/languages' loaded, loadedTargets, unavailableTargets)
 *   #source-text       text to translate; translated as you type, debounced by the
 *                      server's frontendTimeout (Ctrl+Enter translates at once)
 *   #char-count        "<characters> / <charLimit>"; class "over" past the limit
 *   #clear             empties #source-text
 *   #target-text       the translation (read-only <textarea>)
 *   #detected          "Detected: <language> (<confidence>%)" when the source is auto
 *   #busy              "Translating…" while a request is in flight
 *   #copy, #copy-status   copies #target-text to the clipboard; "Copied" after
 *   #alternatives-box, #alternatives   the other translations (buttons: a click
 *                      makes one the translation)
 *   #file-form, #file-input, #file-translate, #file-busy   the file tab (.txt, .html);
 *                      #file-busy says where the job stands ("Translating NAME: 3 of 40
 *                      texts, about 5 s left"), #file-progress shows it
 *   #file-result, #file-download   the translated file's download link
 *   #summarize-text, #summarize-count, #summarize-run, #summary-text, #summarize-busy
 *                      the summarize tab (English text)
 */
"use strict";

(function () {
  /** How many translations beyond the best to ask for (lowered if the server's cap is lower). */
  const WANTED_ALTERNATIVES = 2;
  /** Used until /frontend/settings answers (and if it has no value for a field). */
  const DEFAULT_SETTINGS = {
    charLimit: 5000,
    frontendTimeout: 500,
    apiKeys: false,
    keyRequired: false,
    filesTranslation: true,
    supportedFilesFormat: [".txt", ".html"],
    language: {
      source: { code: "auto", name: "Auto Detect" },
      target: { code: "", name: "" },
    },
  };
  const KEY_STORAGE = "seq2serve.apiKey";
  /** How often a document job's progress is asked for. */
  const JOB_POLL_MS = 500;

  const $ = (id) => document.getElementById(id);
  const el = {
    error: $("error"),
    keyRow: $("key-row"),
    apiKey: $("api-key"),
    keyNote: $("key-note"),
    langBar: $("lang-bar"),
    sourceLang: $("source-lang"),
    targetLang: $("target-lang"),
    swap: $("swap"),
    swapNote: $("swap-note"),
    modelNote: $("model-note"),
    sourceText: $("source-text"),
    charCount: $("char-count"),
    clear: $("clear"),
    targetText: $("target-text"),
    detected: $("detected"),
    busy: $("busy"),
    copy: $("copy"),
    copyStatus: $("copy-status"),
    alternativesBox: $("alternatives-box"),
    alternatives: $("alternatives"),
    fileForm: $("file-form"),
    fileInput: $("file-input"),
    fileFormats: $("file-formats"),
    fileTranslate: $("file-translate"),
    fileBusy: $("file-busy"),
    fileProgress: $("file-progress"),
    fileResult: $("file-result"),
    fileDownload: $("file-download"),
    summarizeText: $("summarize-text"),
    summarizeCount: $("summarize-count"),
    summarizeRun: $("summarize-run"),
    summaryText: $("summary-text"),
    summarizeBusy: $("summarize-busy"),
    tabs: Array.from(document.querySelectorAll('[role="tab"]')),
  };

  const state = {
    settings: DEFAULT_SETTINGS,
    /** code -> {code, name, targets, loaded, loadedTargets, unavailableTargets} from /languages */
    languages: new Map(),
    /** The language /translate detected for the current text when the source is auto. */
    detected: "",
    alternatives: WANTED_ALTERNATIVES,
    timer: 0,
    /** The AbortController of the translation in flight; a newer request aborts it. */
    inFlight: null,
    /** Counts translation requests: only the newest one's answer is shown. */
    sequence: 0,
    ready: false,
    /** The API key the page last sent with. */
    key: "",
  };

  // -- talking to the server ---------------------------------------------------------

  /** An error whose message is fit to show as it is. */
  class ApiError extends Error {
    constructor(message, status, retryAfter) {
      super(message);
      this.name = "ApiError";
      this.status = status;
      /** Seconds the server asked to wait before asking again (a 503's Retry-After). */
      this.retryAfter = retryAfter || 0;
    }
  }

  const NETWORK_MESSAGE =
    "Could not reach the server (network error). Check the connection and try again.";

  /** The JSON body of a successful answer; ApiError with the server's words otherwise. */
  async function api(path, options) {
    let response;
    let text;
    try {
      response = await fetch(path, Object.assign({ credentials: "same-origin" }, options));
      text = await response.text();
    } catch (error) {
      if (error && error.name === "AbortError") throw error;
      throw new ApiError(NETWORK_MESSAGE, 0);
    }
    let body = null;
    try {
      body = text ? JSON.parse(text) : null;
    } catch (_) {
      body = null;
    }
    if (!response.ok) {
      const said = body && typeof body.error === "string" && body.error
        ? body.error
        : `the server answered ${response.status} ${response.statusText}`.trim();
      const wait = Number(response.headers.get("Retry-After"));
      throw new ApiError(`${said} (HTTP ${response.status})`, response.status,
        Number.isFinite(wait) && wait > 0 ? wait : 0);
    }
    if (body === null || typeof body !== "object") {
      throw new ApiError(`The server's answer to ${path} is not JSON (HTTP ${response.status}).`,
        response.status);
    }
    return body;
  }

  function apiKey() {
    return el.apiKey.value.trim();
  }

  function postJson(path, data, signal) {
    const payload = Object.assign({}, data);
    if (apiKey()) payload.api_key = apiKey();
    return api(path, {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify(payload),
      signal,
    });
  }

  // -- errors ------------------------------------------------------------------------

  function showError(context, error) {
    const message = error instanceof Error ? error.message : String(error);
    el.error.textContent = `${context}: ${message}`;
  }

  function clearError() {
    el.error.textContent = "";
  }

  // -- languages ---------------------------------------------------------------------

  function languageName(code) {
    if (code === "auto") return state.settings.language.source.name || "Auto Detect";
    const language = state.languages.get(code);
    return language ? language.name : code;
  }

  function byName(a, b) {
    return languageName(a).localeCompare(languageName(b));
  }

  /** Languages some model translates from. */
  function sourceCodes() {
    return Array.from(state.languages.values())
      .filter((language) => language.targets.length > 0)
      .map((language) => language.code)
      .sort(byName);
  }

  /** The targets of a source; for auto, every target of every source. */
  function targetsOf(source) {
    if (source === "auto") {
      const all = new Set();
      for (const language of state.languages.values()) {
        for (const target of language.targets) all.add(target);
      }
      return Array.from(all).sort(byName);
    }
    const language = state.languages.get(source);
    return language ? language.targets.slice().sort(byName) : [];
  }

  /** A language as /languages lists it. A server that does not say what is loaded
   * (LibreTranslate) counts as holding everything. */
  function readLanguage(language) {
    const targets = Array.isArray(language.targets) ? language.targets : [];
    return {
      code: language.code,
      name: typeof language.name === "string" ? language.name : language.code,
      targets,
      loaded: language.loaded !== false,
      loadedTargets: Array.isArray(language.loadedTargets) ? language.loadedTargets : targets,
      unavailableTargets: Array.isArray(language.unavailableTargets)
        ? language.unavailableTargets : [],
    };
  }

  function readLanguages(languages) {
    return new Map((Array.isArray(languages) ? languages : [])
      .filter((language) => language && typeof language.code === "string")
      .map((language) => [language.code, readLanguage(language)]));
  }

  // -- what is loaded ----------------------------------------------------------------

  const LOADS_MARK = " · loads on first request";
  const UNAVAILABLE_MARK = " · unloaded by the operator";

  /** Whether every model this server serves is loaded (then the page says nothing). */
  function allLoaded() {
    return Array.from(state.languages.values()).every((language) => language.loaded);
  }

  /** Whether source -> target's models are loaded: true, false, or null when the
   * source is auto and some languages' models into the target are loaded, some not. */
  function pairLoaded(source, target) {
    if (!target) return true;
    if (source !== "auto") {
      const language = state.languages.get(source);
      return !language || language.loadedTargets.includes(target);
    }
    const writers = Array.from(state.languages.values())
      .filter((language) => language.targets.includes(target));
    const loaded = writers.filter((language) => language.loadedTargets.includes(target));
    if (loaded.length === writers.length) return true;
    return loaded.length === 0 ? false : null;
  }

  /** Whether source -> target's model was unloaded by the operator (refused until it
   * is loaded again; no request loads it). From auto: when it is so from every
   * language that has the target. */
  function pairUnavailable(source, target) {
    if (!target) return false;
    if (source !== "auto") {
      const language = state.languages.get(source);
      return Boolean(language) && language.unavailableTargets.includes(target);
    }
    const writers = Array.from(state.languages.values())
      .filter((language) => language.targets.includes(target));
    return writers.length > 0
      && writers.every((language) => language.unavailableTargets.includes(target));
  }

  /** A source is marked when every translation from it loads a model first, or when
   * the operator unloaded every one. */
  function sourceLabel(code) {
    const language = state.languages.get(code);
    const some = Boolean(language) && language.targets.length > 0;
    if (some && language.unavailableTargets.length === language.targets.length) {
      return languageName(code) + UNAVAILABLE_MARK;
    }
    const none = some && language.loadedTargets.length === 0;
    return languageName(code) + (none ? LOADS_MARK : "");
  }

  /** A target is marked when the chosen source's pair to it is not loaded (or not
   * served now: its model unloaded by the operator). */
  function targetLabel(code) {
    const source = el.sourceLang.value;
    if (pairUnavailable(source, code)) return languageName(code) + UNAVAILABLE_MARK;
    return languageName(code) + (pairLoaded(source, code) === false ? LOADS_MARK : "");
  }

  function updateModelNote() {
    const target = el.targetLang.value;
    const unavailable = pairUnavailable(el.sourceLang.value, target);
    const loaded = pairLoaded(el.sourceLang.value, target);
    const quiet = allLoaded() || !target;
    el.modelNote.dataset.loaded = quiet || loaded === null ? ""
      : (unavailable ? "unavailable" : String(loaded));
    if (quiet) {
      el.modelNote.textContent = "";
    } else if (unavailable) {
      el.modelNote.textContent = "Unloaded by the operator: this pair is not served "
        + "until its model is loaded again.";
    } else if (loaded === true) {
      el.modelNote.textContent = "Loaded: this pair's model answers at once.";
    } else if (loaded === false) {
      el.modelNote.textContent = "Not loaded yet: this pair's model loads on the first "
        + "request, which waits for it.";
    } else {
      el.modelNote.textContent = "Some languages' models into "
        + `${languageName(target)} are not loaded yet: they load on their first request.`;
    }
  }

  /** The options' marks and the note, after /languages answered again. */
  function relabel() {
    for (const option of el.sourceLang.options) {
      if (option.value !== "auto") option.text = sourceLabel(option.value);
    }
    for (const option of el.targetLang.options) option.text = targetLabel(option.value);
    updateModelNote();
  }

  /** Asks /languages again once a translation may have loaded a model. */
  async function refreshLoaded() {
    try {
      state.languages = readLanguages(await api("/languages"));
      relabel();
    } catch (error) {
      showError("Could not ask which models are loaded", error);
    }
  }

  function fillSelect(select, codes, wanted, label) {
    select.replaceChildren(...codes.map((code) => new Option(label(code), code)));
    select.value = codes.includes(wanted) ? wanted : (codes[0] || "");
  }

  function fillSources(wanted) {
    fillSelect(el.sourceLang, ["auto", ...sourceCodes()], wanted,
      (code) => (code === "auto" ? languageName(code) : sourceLabel(code)));
  }

  /** The target options follow the source; the chosen target stays when it can. */
  function fillTargets(wanted) {
    const targets = targetsOf(el.sourceLang.value);
    const keep = targets.includes(wanted) ? wanted : state.settings.language.target.code;
    fillSelect(el.targetLang, targets, keep, targetLabel);
    el.targetLang.disabled = targets.length === 0;
    updateSwap();
    updateModelNote();
  }

  /** The source swap would make: the chosen one, or the detected one under auto. */
  function effectiveSource() {
    const source = el.sourceLang.value;
    return source === "auto" ? state.detected : source;
  }

  function updateSwap() {
    const target = el.targetLang.value;
    const canSwap = Boolean(target) && targetsOf(target).length > 0;
    el.swap.disabled = !canSwap || !state.ready;
    el.swapNote.textContent = target && !canSwap
      ? `Swap is off: no model on this server translates from ${languageName(target)}.`
      : "";
  }

  function swap() {
    const oldTarget = el.targetLang.value;
    const oldSource = effectiveSource();
    if (!oldTarget || targetsOf(oldTarget).length === 0) return;
    const translation = el.targetText.value;
    fillSources(oldTarget);
    fillTargets(oldSource);
    if (translation) {
      el.sourceText.value = translation;
      updateCount();
    }
    state.detected = "";
    translateNow();
  }

  // -- translating -------------------------------------------------------------------

  /** Characters as the server counts them (code points, not UTF-16 units). */
  function length(text) {
    return Array.from(text).length;
  }

  function showCount(textarea, counter) {
    const n = length(textarea.value);
    const limit = state.settings.charLimit;
    const over = n > limit;
    counter.textContent = over
      ? `${n} / ${limit} characters: over the limit`
      : `${n} / ${limit} characters`;
    counter.classList.toggle("over", over);
    textarea.setAttribute("aria-invalid", over ? "true" : "false");
  }

  function updateCount() {
    showCount(el.sourceText, el.charCount);
  }

  function clearOutput() {
    el.targetText.value = "";
    el.alternatives.replaceChildren();
    el.alternativesBox.hidden = true;
    el.detected.textContent = "";
    el.copy.disabled = true;
    el.copyStatus.textContent = "";
  }

  function setBusy(busy, loading) {
    el.busy.textContent = busy
      ? (loading ? "Loading the model, then translating…" : "Translating…") : "";
    el.targetText.setAttribute("aria-busy", busy ? "true" : "false");
  }

  function scheduleTranslate() {
    clearTimeout(state.timer);
    state.timer = setTimeout(translateNow, Math.max(0, state.settings.frontendTimeout));
  }

  /** The server's cap on alternatives, when its answer names one ("between 0 and N"). */
  function alternativesCap(error) {
    if (!(error instanceof ApiError) || error.status !== 400) return null;
    const match = /alternatives parameter must be between 0 and (\d+)/.exec(error.message);
    return match ? Number(match[1]) : null;
  }

  async function translateNow() {
    clearTimeout(state.timer);
    if (state.inFlight) state.inFlight.abort();
    state.inFlight = null;
    const sequence = ++state.sequence;
    const text = el.sourceText.value;
    if (!state.ready) return;
    if (!text.trim()) {
      clearOutput();
      clearError();
      setBusy(false);
      return;
    }
    const controller = new AbortController();
    state.inFlight = controller;
    const loaded = pairLoaded(el.sourceLang.value, el.targetLang.value);
    // An operator's unload: the server refuses it (said in #error), no model loads.
    setBusy(true, loaded !== true
      && !pairUnavailable(el.sourceLang.value, el.targetLang.value));
    const request = {
      q: text,
      source: el.sourceLang.value,
      target: el.targetLang.value,
      format: "text",
      alternatives: state.alternatives,
    };
    try {
      const body = await postJson("/translate", request, controller.signal);
      if (sequence !== state.sequence) return;
      showTranslation(body);
      clearError();
      if (loaded !== true) refreshLoaded(); // the request loaded its model
    } catch (error) {
      if ((error && error.name === "AbortError") || sequence !== state.sequence) return;
      const cap = alternativesCap(error);
      if (cap !== null && cap < state.alternatives) {
        state.alternatives = cap; // this server allows fewer: ask again within its cap
        state.inFlight = null;
        translateNow();
        return;
      }
      clearOutput();
      showError("Translation failed", error);
    } finally {
      if (sequence === state.sequence) {
        state.inFlight = null;
        setBusy(false);
      }
    }
  }

  function showTranslation(body) {
    const best = typeof body.translatedText === "string" ? body.translatedText : "";
    el.targetText.value = best;
    el.copy.disabled = best === "";
    el.copyStatus.textContent = "";
    showAlternatives(Array.isArray(body.alternatives) ? body.alternatives : []);
    const found = body.detectedLanguage;
    if (found && typeof found.language === "string") {
      state.detected = found.language;
      const confidence = Math.round(Number(found.confidence) || 0);
      el.detected.textContent = `Detected: ${languageName(found.language)} (${confidence}%)`;
    } else {
      el.detected.textContent = "";
    }
    updateSwap();
  }

  function showAlternatives(alternatives) {
    const items = alternatives.filter((text) => typeof text === "string" && text !== "")
      .map((text) => {
        const button = document.createElement("button");
        button.type = "button";
        button.className = "alternative";
        button.textContent = text;
        button.title = "Use this translation";
        button.addEventListener("click", () => useAlternative(button));
        const item = document.createElement("li");
        item.append(button);
        return item;
      });
    el.alternatives.replaceChildren(...items);
    el.alternativesBox.hidden = items.length === 0;
  }

  /** The chosen alternative becomes the translation; the translation takes its place. */
  function useAlternative(button) {
    const previous = el.targetText.value;
    el.targetText.value = button.textContent;
    button.textContent = previous;
    el.copyStatus.textContent = "";
  }

  async function copyTranslation() {
    const text = el.targetText.value;
    if (!text) return;
    try {
      await navigator.clipboard.writeText(text);
    } catch (_) {
      // No Clipboard API (or no permission): copy the selection the old way.
      el.targetText.focus();
      el.targetText.select();
      let copied = false;
      try {
        copied = document.execCommand("copy");
      } catch (_) {
        copied = false;
      }
      if (!copied) {
        showError("Copy failed", "the browser refused the clipboard; the text is selected, "
          + "copy it with the keyboard");
        return;
      }
    }
    el.copyStatus.textContent = "Copied";
    setTimeout(() => {
      if (el.copyStatus.textContent === "Copied") el.copyStatus.textContent = "";
    }, 2000);
  }

  // -- files -------------------------------------------------------------------------

  async function translateFile(event) {
    event.preventDefault();
    const file = el.fileInput.files && el.fileInput.files[0];
    el.fileResult.hidden = true;
    if (!file) {
      showError("File translation", "choose a file first");
      return;
    }
    const form = new FormData();
    form.append("file", file, file.name);
    form.append("source", el.sourceLang.value);
    form.append("target", el.targetLang.value);
    if (apiKey()) form.append("api_key", apiKey());
    el.fileTranslate.disabled = true;
    el.fileBusy.textContent = `Sending ${file.name}…`;
    try {
      let job = await api("/v1/jobs", { method: "POST", body: form });
      while (job.state !== "done" && job.state !== "error") {
        showJob(file.name, job);
        await sleep(JOB_POLL_MS);
        job = await api(`/v1/jobs/${encodeURIComponent(String(job.id))}`, {});
      }
      if (job.state === "error") {
        throw new ApiError(String(job.error || "the translation failed"), 200);
      }
      const url = new URL(String(job.translatedFileUrl || ""), window.location.href);
      if (url.protocol !== "http:" && url.protocol !== "https:") {
        throw new ApiError("The server's answer has no download address.", 200);
      }
      el.fileDownload.href = url.href;
      el.fileDownload.download = translatedName(file.name);
      el.fileDownload.textContent = `Download ${translatedName(file.name)}`;
      el.fileResult.hidden = false;
      clearError();
    } catch (error) {
      showError("File translation failed", error);
    } finally {
      el.fileTranslate.disabled = false;
      el.fileBusy.textContent = "";
      el.fileProgress.hidden = true;
    }
  }

  /** Where a document job stands, in words and on the progress bar. */
  function showJob(name, job) {
    const progress = job.progress || {};
    const done = Number(progress.done) || 0;
    const total = Number(progress.total) || 0;
    if (job.state === "queued") {
      el.fileBusy.textContent = `${name} is waiting for its turn…`;
    } else {
      const left = Number.isFinite(job.secondsRemaining)
        ? `, about ${job.secondsRemaining} s left` : "";
      el.fileBusy.textContent = total
        ? `Translating ${name}: ${done} of ${total} texts${left}`
        : `Reading ${name}…`;
    }
    el.fileProgress.hidden = false;
    if (total) {
      el.fileProgress.max = total;
      el.fileProgress.value = done;
    } else {
      el.fileProgress.removeAttribute("value"); // indeterminate
    }
  }

  function sleep(ms) {
    return new Promise((resolve) => setTimeout(resolve, ms));
  }

  function translatedName(name) {
    const dot = name.lastIndexOf(".");
    const target = el.targetLang.value || "translated";
    return dot > 0 ? `${name.slice(0, dot)}.${target}${name.slice(dot)}` : `${name}.${target}`;
  }

  // -- summarize ---------------------------------------------------------------------

  async function summarize() {
    const text = el.summarizeText.value;
    if (!text.trim()) {
      showError("Summarize", "type or paste some English text first");
      el.summarizeText.focus();
      return;
    }
    el.summarizeRun.disabled = true;
    el.summarizeBusy.textContent = "Summarizing…";
    let note = "";
    el.summaryText.setAttribute("aria-busy", "true");
    try {
      // A text longer than the model reads is cut to its start, and the page says so.
      const body = await postJson("/summarize", { q: text, truncate: true });
      el.summaryText.value = typeof body.summary === "string" ? body.summary : "";
      clearError();
      note = body.truncated
        ? `Only the start of the text was summarized (${body.tokensKept} tokens read, ` +
          `${body.tokensDropped} left out): the model reads no more.`
        : "";
    } catch (error) {
      el.summaryText.value = "";
      showError("Summarize failed", error);
    } finally {
      el.summarizeRun.disabled = false;
      el.summarizeBusy.textContent = note;
      el.summaryText.setAttribute("aria-busy", "false");
    }
  }

  // -- tabs --------------------------------------------------------------------------

  function selectTab(tab, focus) {
    for (const each of el.tabs) {
      const selected = each === tab;
      each.setAttribute("aria-selected", selected ? "true" : "false");
      each.tabIndex = selected ? 0 : -1;
      $(each.getAttribute("aria-controls")).hidden = !selected;
    }
    // Summaries are of English text: the language bar is for the other two tabs.
    el.langBar.hidden = tab.id === "summarize-tab";
    if (focus) tab.focus();
  }

  function onTabKey(event) {
    const at = el.tabs.indexOf(event.currentTarget);
    const moves = { ArrowRight: at + 1, ArrowLeft: at - 1, Home: 0, End: el.tabs.length - 1 };
    if (!(event.key in moves)) return;
    event.preventDefault();
    const next = (moves[event.key] + el.tabs.length) % el.tabs.length;
    selectTab(el.tabs[next], true);
  }

  // -- API key -----------------------------------------------------------------------

  function setUpKey() {
    const settings = state.settings;
    el.keyRow.hidden = !settings.apiKeys;
    if (!settings.apiKeys) return;
    el.keyNote.textContent = settings.keyRequired
      ? "required by this server" : "optional: a key gets its own rate limit";
    el.apiKey.required = Boolean(settings.keyRequired);
    try {
      el.apiKey.value = window.localStorage.getItem(KEY_STORAGE) || "";
      state.key = apiKey();
    } catch (_) {
      // Storage is off (a private window, a policy): the key lasts as long as the page.
    }
  }

  /** A changed key is kept and the text translated again with it (once: the form's
   * submit and the input's change both come here). */
  function onKeyChange() {
    if (apiKey() === state.key) return;
    state.key = apiKey();
    try {
      window.localStorage.setItem(KEY_STORAGE, state.key);
    } catch (_) {
      // As above: nowhere to keep it.
    }
    translateNow();
  }

  // -- start -------------------------------------------------------------------------

  function mergeSettings(loaded) {
    const settings = Object.assign({}, DEFAULT_SETTINGS, loaded);
    settings.language = Object.assign({}, DEFAULT_SETTINGS.language, loaded.language || {});
    settings.charLimit = Number(settings.charLimit) > 0
      ? Number(settings.charLimit) : DEFAULT_SETTINGS.charLimit;
    settings.frontendTimeout = Number(settings.frontendTimeout) >= 0
      ? Number(settings.frontendTimeout) : DEFAULT_SETTINGS.frontendTimeout;
    return settings;
  }

  function wire() {
    el.sourceText.addEventListener("input", () => {
      updateCount();
      if (el.sourceLang.value === "auto") state.detected = "";
      scheduleTranslate();
    });
    el.sourceText.addEventListener("keydown", (event) => {
      if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) {
        event.preventDefault();
        translateNow();
      }
    });
    el.sourceLang.addEventListener("change", () => {
      state.detected = "";
      fillTargets(el.targetLang.value);
      translateNow();
    });
    el.targetLang.addEventListener("change", () => {
      updateSwap();
      updateModelNote();
      translateNow();
    });
    el.swap.addEventListener("click", swap);
    el.clear.addEventListener("click", () => {
      el.sourceText.value = "";
      updateCount();
      translateNow();
      el.sourceText.focus();
    });
    el.copy.addEventListener("click", copyTranslation);
    el.fileForm.addEventListener("submit", translateFile);
    el.fileInput.addEventListener("change", () => {
      el.fileResult.hidden = true;
    });
    el.summarizeRun.addEventListener("click", summarize);
    el.summarizeText.addEventListener("input", () => showCount(el.summarizeText,
      el.summarizeCount));
    el.summarizeText.addEventListener("keydown", (event) => {
      if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) {
        event.preventDefault();
        summarize();
      }
    });
    el.apiKey.addEventListener("change", onKeyChange);
    el.keyRow.addEventListener("submit", (event) => {
      event.preventDefault();
      onKeyChange();
    });
    for (const tab of el.tabs) {
      tab.addEventListener("click", () => selectTab(tab, false));
      tab.addEventListener("keydown", onTabKey);
    }
  }

  async function start() {
    wire();
    updateCount();
    showCount(el.summarizeText, el.summarizeCount);
    let loaded;
    for (;;) {
      try {
        loaded = await Promise.all([api("/frontend/settings"), api("/languages")]);
        break;
      } catch (error) {
        // 503 with Retry-After: the server is still loading its models (or handing
        // over while draining): ask again when it says, rather than give up.
        if (error instanceof ApiError && error.status === 503 && error.retryAfter > 0) {
          showError("The server is still starting; trying again", error);
          await new Promise((resolve) => setTimeout(resolve, error.retryAfter * 1000));
          continue;
        }
        showError("Could not load the languages (reload the page to try again)", error);
        return;
      }
    }
    clearError();
    const [settings, languages] = loaded;
    state.settings = mergeSettings(settings);
    state.languages = readLanguages(languages);
    const formats = Array.isArray(state.settings.supportedFilesFormat)
      ? state.settings.supportedFilesFormat : DEFAULT_SETTINGS.supportedFilesFormat;
    el.fileInput.accept = formats.join(",");
    el.fileFormats.textContent = formats.join(", ");
    $("files-tab").hidden = !state.settings.filesTranslation;
    setUpKey();
    updateCount();
    showCount(el.summarizeText, el.summarizeCount);
    state.ready = true;
    fillSources(state.settings.language.source.code);
    fillTargets(state.settings.language.target.code);
    el.sourceLang.disabled = false;
    if (sourceCodes().length === 0) {
      showError("Nothing to translate with", "this server serves no translation model");
      el.sourceLang.disabled = true;
      return;
    }
    if (el.sourceText.value) translateNow();
  }

  start();
})();
