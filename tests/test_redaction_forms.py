"""A secret is redacted in every form it travels in: base64 (standard and URL-safe, of
the key alone or inside ``user:key`` at any alignment), percent-encoded (wholly or in
part), hex, JSON-escaped, spaced out, split across lines, with invisible characters in
it, reversed; and an echoed credential header loses its value whatever it is. Texts
without a secret come out as they went in.

The properties read the redacted text back with the decoders that undo each form (not
with the redactor's own normaliser), and look for any 12 characters of the secret. The
end-to-end tests drive a run against a server whose errors echo the key it was sent."""

from __future__ import annotations

import base64
import json
import re
import string
import time
import traceback
import urllib.parse
from collections.abc import Callable, Iterator

import pytest
from aiohttp import web
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from rlm_magic.errors import LLMQueryError
from rlm_magic.llm.redaction import OFF_LOOP_CHARS, REDACTED, Redactor

from .support import helpers
from .support.llm_server import FakeLLMServer

# -- secrets as providers issue them ---------------------------------------------------

ALNUM = string.ascii_letters + string.digits
URL_SAFE = ALNUM + "-_"


def _random(alphabet: str, low: int, high: int) -> st.SearchStrategy[str]:
    return st.text(alphabet, min_size=low, max_size=high)


secrets = st.one_of(
    _random(ALNUM, 20, 48).map(lambda s: f"sk-{s}"),  # OpenAI's older keys
    _random(URL_SAFE, 40, 64).map(lambda s: f"sk-proj-{s}"),
    _random(URL_SAFE, 80, 95).map(lambda s: f"sk-ant-api03-{s}"),  # Anthropic's
    _random("0123456789abcdef", 32, 64),  # hex tokens (Together, many local servers)
    _random(ALNUM, 34, 34).map(lambda s: f"hf_{s}"),
    st.tuples(_random(URL_SAFE, 10, 36), _random(URL_SAFE, 20, 80), _random(URL_SAFE, 43, 43)).map(
        ".".join  # JWT-like
    ),
)

# Text around an echo: prose, code and JSON characters, escapes' leaders (%, \, &),
# whitespace and invisible characters, non-ASCII letters.
surroundings = st.lists(
    st.sampled_from(
        [*string.printable, "é", "ß", "中", "😀", "\u200b", "\u00a0", "\u2028", "\\", "%", "&#"]
    ),
    max_size=40,
).map("".join)


KEY_IN_TEXTS = "sk-proj-" + "aB3dE5gH7jK9" * 4


def _redactor(secret: str) -> Redactor:
    return Redactor(extra=[secret])


# -- the forms ------------------------------------------------------------------------


def _b64(data: bytes, url_safe: bool, padded: bool) -> str:
    encoded = (base64.urlsafe_b64encode if url_safe else base64.b64encode)(data).decode()
    return encoded if padded else encoded.rstrip("=")


def _percent(secret: str, every: bool, upper: bool) -> str:
    encoded = "".join(
        "".join(f"%{b:02X}" if upper else f"%{b:02x}" for b in c.encode())
        if every or i % 3 == 0
        else c
        for i, c in enumerate(secret)
    )
    return encoded


def _spaced(separator: str) -> Callable[[str], str]:
    return lambda secret: separator.join(secret)


def _split(line_break: str) -> Callable[[str], str]:
    return lambda secret: secret[: len(secret) // 3] + line_break + secret[len(secret) // 3 :]


FORMS: dict[str, Callable[[str], str]] = {
    "as is": lambda s: s,
    "base64": lambda s: _b64(s.encode(), False, True),
    "base64, no padding": lambda s: _b64(s.encode(), False, False),
    "URL-safe base64": lambda s: _b64(s.encode(), True, True),
    "Basic auth (user:key)": lambda s: _b64(b"user:" + s.encode(), False, True),
    "Basic auth (:key)": lambda s: _b64(b":" + s.encode(), False, True),
    "Basic auth (key:)": lambda s: _b64(s.encode() + b":", False, True),
    "Basic auth, URL-safe (ab:key)": lambda s: _b64(b"ab:" + s.encode(), True, False),
    "percent-encoded": lambda s: _percent(s, every=True, upper=True),
    "percent-encoded, lower case": lambda s: _percent(s, every=True, upper=False),
    "percent-encoded in part": lambda s: _percent(s, every=False, upper=True),
    "urllib.parse.quote": lambda s: urllib.parse.quote(s, safe=""),
    "hex": lambda s: s.encode().hex(),
    "hex, upper case": lambda s: s.encode().hex().upper(),
    "hex, spaced": lambda s: " ".join(f"{b:02x}" for b in s.encode()),
    "hex, colons": lambda s: ":".join(f"{b:02X}" for b in s.encode()),
    "\\x escapes": lambda s: "".join(f"\\x{b:02x}" for b in s.encode()),
    "\\u00xx escapes": lambda s: "".join(f"\\u{ord(c):04x}" for c in s),
    "HTML entities": lambda s: "".join(f"&#{ord(c)};" for c in s),
    "spaced out": _spaced(" "),
    "spaced out with dashes kept": lambda s: " ".join(s.replace("-", " - ").split()),
    "one character a line": _spaced("\n"),
    "zero-width joined": _spaced("\u200b"),
    "split across lines": _split("\n"),
    "split across CRLF lines": _split("\r\n"),
    "split by an escaped line break": _split("\\n"),
    "split across quoted lines": _split('"\n  "'),
    "percent-encoded twice": lambda s: urllib.parse.quote(urllib.parse.quote(s, safe=""), safe=""),
    "reversed": lambda s: s[::-1],
    "in JSON": lambda s: json.dumps({"echo": s})[10:-2],
}


# -- reading a text back as each form's decoder would ---------------------------------

_BASE64_RUN = re.compile(r"[A-Za-z0-9+/_-]{8,}")
_HEX_RUN = re.compile(r"(?:[0-9a-fA-F]{2})+")
_PYTHON_ESCAPE = re.compile(r"\\(u[0-9a-fA-F]{4}|x[0-9a-fA-F]{2}|[\s\S])")
_HTML_ENTITY = re.compile(r"&#(\d+);")
_INVISIBLE = "\u200b\u00a0\u2028"


def _joined(text: str) -> str:
    for c in _INVISIBLE:
        text = text.replace(c, "")
    return re.sub(r"\s+|\\n|\\r|\"\s*\"", "", text)


def _unescaped(text: str) -> str:
    def one(match: re.Match[str]) -> str:
        code = match.group(1)
        return chr(int(code[1:], 16)) if len(code) > 1 else code

    return _HTML_ENTITY.sub(lambda m: chr(int(m.group(1))), _PYTHON_ESCAPE.sub(one, text))


def readings(text: str) -> Iterator[str]:
    """``text`` as each decoder reads it: as it is, joined up, unescaped, URL-decoded,
    reversed, and every run of hex or base64 in it decoded (at each alignment)."""
    joined = _joined(text)
    for reading in (text, joined, _unescaped(text), _joined(_unescaped(text))):
        yield reading
        yield reading[::-1]
        yield urllib.parse.unquote(reading)
    compact = re.sub(r"[\s,:]|\\x", "", text)
    for run in _HEX_RUN.findall(compact):
        yield bytes.fromhex(run).decode("latin-1")
    for run in _BASE64_RUN.findall(urllib.parse.unquote(joined)):
        standard = run.replace("-", "+").replace("_", "/")
        for shift in range(4):
            piece = standard[shift:]
            piece = piece[: len(piece) // 4 * 4]
            yield base64.b64decode(piece).decode("latin-1")


def leaked(secret: str, text: str) -> str | None:
    """A stretch of 12 characters of ``secret`` that some reading of ``text`` shows."""
    chunks = {secret[i : i + 12] for i in range(len(secret) - 11)}
    for reading in readings(text):
        for chunk in chunks:
            if chunk in reading:
                return chunk
    return None


# -- properties -----------------------------------------------------------------------

FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
EACH_FORM = settings(FAST, max_examples=15)  # (times 30 forms)


@pytest.mark.parametrize("form", FORMS)
@EACH_FORM
@given(secret=secrets, before=surroundings, after=surroundings)
def test_every_form_of_a_secret_is_removed_wherever_it_sits(form, secret, before, after):
    assume(leaked(secret, before) is None and leaked(secret, after) is None)
    echoed = before + FORMS[form](secret) + after
    redacted = _redactor(secret)(echoed)
    assert leaked(secret, redacted) is None, (form, redacted)
    assert REDACTED in redacted


@FAST
@given(
    secret=secrets,
    form=st.sampled_from(list(FORMS)),
    before=surroundings,
    after=surroundings,
    ascii_only=st.booleans(),
)
def test_a_form_quoted_again_in_a_json_error_body_is_removed(
    secret, form, before, after, ascii_only
):
    assume(leaked(secret, before) is None and leaked(secret, after) is None)
    body = json.dumps(
        {"error": {"message": before + FORMS[form](secret) + after}}, ensure_ascii=ascii_only
    )
    assert leaked(secret, _redactor(secret)(body)) is None


@FAST
@given(secret=secrets, text=st.text(max_size=300))
@example(secret="sk-" + "a1" * 12, text="price: 50% of the API, see https://x.io/?q=a%20b")
def test_a_text_without_the_secret_comes_out_unchanged(secret, text):
    assume("key" not in text.lower() and "author" not in text.lower() and "token" not in text)
    assume(leaked(secret, text) is None)
    assert _redactor(secret)(text) == text


# -- many texts at once (a typed answer's strings, a batch's answers) -------------------


@pytest.mark.parametrize("form", ["as is", "base64", "Basic auth (user:key)", "in JSON", "hex"])
@settings(FAST, max_examples=25)
@given(
    secret=secrets,
    texts=st.lists(surroundings, min_size=1, max_size=12),
    data=st.data(),
)
def test_each_of_many_texts_loses_the_secret_as_if_redacted_alone(form, secret, texts, data):
    assume(not any(leaked(secret, text) for text in texts))
    carrying = data.draw(st.sets(st.integers(0, len(texts) - 1), min_size=1))
    echoed = [
        text[:3] + FORMS[form](secret) + text[3:] if i in carrying else text
        for i, text in enumerate(texts)
    ]
    redactor = _redactor(secret)
    each = redactor.each(echoed)
    assert len(each) == len(echoed)
    for i, together in enumerate(each):
        assert leaked(secret, together) is None, (form, together)
        if i in carrying:
            assert REDACTED in together


@FAST
@given(secret=secrets, texts=st.lists(st.text(max_size=60), max_size=20))
def test_many_texts_without_the_secret_come_out_as_they_went_in(secret, texts):
    assume(not any("key" in t.lower() or "author" in t.lower() or "token" in t for t in texts))
    assume(leaked(secret, "\n".join(texts)) is None)
    assert _redactor(secret).each(texts) == texts


def test_a_secret_split_across_two_texts_is_removed_from_both():
    halves = [f"it begins {KEY_IN_TEXTS[:20]}", f"{KEY_IN_TEXTS[20:]} and ends"]
    first, second = _redactor(KEY_IN_TEXTS).each(halves)
    assert first == "it begins [REDACTED]" and second == "[REDACTED] and ends"


def test_ordinary_prose_and_code_about_keys_come_out_unchanged():
    redact = _redactor("sk-proj-" + "Zx9" * 16)
    for text in (
        'headers = {"Authorization": f"Bearer {token}", "x-api-key": self.api_key}',
        "api_key = os.environ['OPENAI_API_KEY']; client = OpenAI(api_key=api_key)",
        "Set X-Api-Key: YOUR_API_KEY_HERE, or the authorization: header is missing.",
        "The hex digest 5f4dcc3b5aa765d61d8327deb882cf99 and base64 aGVsbG8gd29ybGQ=",
        "100% sure, 3 & 4, C:\\Users\\me, a\\nb, &#169; 2024",
    ):
        assert redact(text) == text


credential_values = st.text(ALNUM + "-._~+/=", min_size=8, max_size=60).filter(
    lambda v: any(c.isdigit() for c in v)
)
ECHOES = (
    "Authorization: Bearer {}",
    "authorization: Basic {}",
    "Proxy-Authorization: Bearer {}",
    '"Authorization": "Bearer {}"',
    "{{'authorization': 'Bearer {}'}}",
    '\\"Authorization\\": \\"Bearer {}\\"',
    "x-api-key: {}",
    '"X-Api-Key":"{}"',
    "api-key: {}",
    "x-goog-api-key={}",
    "OpenAI(api_key='{}')",
    "OPENAI_API_KEY={}",
    "Ocp-Apim-Subscription-Key: {}",
    "X-Auth-Token: {}",
)


@FAST
@given(echo=st.sampled_from(ECHOES), value=credential_values, before=surroundings)
def test_an_echoed_credential_header_loses_its_value_whatever_it_is(echo, value, before):
    text = before + "\n" + echo.format(value) + "\nmore"
    redacted = Redactor()(text)
    assert value not in redacted
    assert redacted.endswith("\nmore") and REDACTED in redacted


@FAST
@given(
    secret=secrets,
    form=st.sampled_from(list(FORMS)),
    before=st.text(string.ascii_letters + " \n", max_size=200),
    limit=st.integers(0, 400),
)
def test_the_head_of_a_text_never_shows_part_of_a_secret(secret, form, before, limit):
    assume(leaked(secret, before) is None)
    text = before + FORMS[form](secret) + " and after" * 20
    head = _redactor(secret).head(text, limit)
    assert leaked(secret, head) is None
    # Nothing from beyond the cut moves in: the head is the text's first `limit`
    # characters, with secrets starting before the cut replaced whole.
    kept = head.split(REDACTED)
    assert text.startswith(kept[0]) and len(kept[0]) <= limit


def test_a_base64_echo_loses_the_characters_that_hold_the_key_and_no_others():
    key = "sk-proj-" + "aB3dE5gH7jK9" * 3
    redact = _redactor(key)
    assert redact(f"a\n{base64.b64encode(key.encode()).decode()}\nb") == f"a\n{REDACTED}\nb"
    # Basic auth's "user:key": what encodes "use" stays, the rest holds bits of the key.
    basic = base64.b64encode(f"user:{key}".encode()).decode()
    assert redact(f"Basic {basic}!") == f"Basic {basic[:4]}{REDACTED}!"


def test_a_secret_too_short_for_loose_forms_is_still_removed_as_it_is():
    redact = _redactor("hunter22")
    assert redact("password hunter22!") == f"password {REDACTED}!"
    assert redact("h u n t e r 2") == "h u n t e r 2"  # (7 characters: not a secret)


# -- bounded work: linear in the text, whatever it holds --------------------------------

HOSTILE = {
    "credential names, each with a value": "Authorization: Bearer x1234567 ",
    "credential names and nothing else": "api_key=",
    "escape leaders": "%\\&#",
    "escapes": "%41\\u0041&#65;\\n",
    "a spaced-out key, over and over": " ".join(KEY_IN_TEXTS) + "  ",
    "base64 keys": base64.b64encode(KEY_IN_TEXTS.encode()).decode() + "\n",
}


@pytest.mark.parametrize("unit", HOSTILE.values(), ids=HOSTILE.keys())
def test_redacting_the_most_a_loop_may_redact_takes_a_fraction_of_a_second(unit):
    # OFF_LOOP_CHARS is the most redacted on the event loop: whatever the text holds, a
    # small part of a second (~60 ms at worst on a quiet machine; a pass that is
    # quadratic in the text would take seconds).
    text = (unit * (OFF_LOOP_CHARS // len(unit) + 1))[:OFF_LOOP_CHARS]
    redact = _redactor(KEY_IN_TEXTS)
    started = time.perf_counter()
    redact(text)
    assert time.perf_counter() - started < 0.5


# -- end to end: a server that echoes the key in its errors ----------------------------

KEY = "sk-proj-Echo0123456789abcdefGHIJKLmnopQRSTuvwxYZ-_4242"


class EchoingServer(FakeLLMServer):
    """The test server, whose sub-model refuses every request with an error that
    echoes the key it was sent: as Basic auth, base64, spaced out, hex, split across
    lines, and its Authorization header."""

    status = 400

    async def _chat(self, request):
        body = await request.json()
        if body.get("model") != "sub-model":
            return await super()._chat(request)
        sent = request.headers.get("Authorization", "")
        key = sent.removeprefix("Bearer ")
        echo = (
            f"bad request from {base64.b64encode(f'me:{key}'.encode()).decode()} "
            f"(base64: {base64.b64encode(key.encode()).decode()}; spaced: {' '.join(key)}; "
            f"hex: {key.encode().hex()}; split: {key[:20]}\n{key[20:]}; "
            f"headers: {{'Authorization': '{sent}'}})"
        )
        with self._lock:
            self.requests.append(body)
        return web.json_response(
            {"error": {"message": echo, "type": "invalid_request_error", "code": self.status}},
            status=self.status,
        )


@pytest.fixture(scope="module")
def echoing_server():
    server = EchoingServer().start()
    yield server
    server.stop()


@pytest.fixture
def echoing(echoing_server, litellm_imported):
    from rlm_magic.llm import profiles

    echoing_server.reset()
    profiles.forget()
    yield echoing_server
    echoing_server.reset()
    profiles.forget()


def _rlm(server, **settings):
    from rlm_magic import RLM

    return RLM(
        model="openai/root-model",
        sub_model="openai/sub-model",
        api_base=server.base_url,
        api_key=KEY,
        retry_backoff=0.01,
        max_retries=0,
        progress=False,
        timeout=10,
        **settings,
    )


def repl(code: str) -> str:
    return f"```repl\n{code}\n```\n"


@pytest.mark.parametrize(
    ("wire", "status"), [(True, 400), (False, 400), (True, 401)], ids=["wire", "litellm", "401"]
)
async def test_a_key_echoed_in_any_form_reaches_neither_model_code_nor_the_root_prompt(
    echoing, wire, status, tmp_path
):
    echoing.status = status
    rlm = _rlm(echoing, wire_transport=wire)
    # The block prints what it got as character codes: a form no redaction of its output
    # would know, so the key shows there if model code ever had it.
    echoing.script(
        "root-model",
        [repl("r = llm_query('hi')\nprint([ord(c) for c in r])"), "FINAL(done)"],
    )
    result = await rlm.arun("q", context="c")
    [block] = result.trajectory[0].code
    seen = "".join(map(chr, json.loads(block.output)))
    assert seen.startswith("Error: ") and "'openai/sub-model'" in seen
    assert leaked(KEY, seen) is None, seen
    assert "me:" not in seen and REDACTED in seen
    # The root model's next prompt, the ledger's errors and the saved log: no form either.
    root_prompts = [r for r in echoing.requests if r.get("model") == "root-model"]
    assert len(root_prompts) == 2
    assert leaked(KEY, json.dumps(root_prompts[1], ensure_ascii=False)) is None
    errors = [record.error for record in rlm.client.ledger.records if record.error]
    assert errors and all(leaked(KEY, error) is None for error in errors)
    log = result.save(tmp_path / "run.jsonl").read_text()
    assert leaked(KEY, log) is None


async def test_an_echoing_error_raised_in_the_notebook_shows_no_form_of_the_key(echoing):
    rlm = _rlm(echoing)
    with pytest.raises(LLMQueryError) as raised:
        await helpers(rlm).llm_query("hi")
    shown = "".join(traceback.format_exception(raised.value))  # causes included
    assert leaked(KEY, shown) is None and "'Authorization': 'Bearer [REDACTED]'" in shown
