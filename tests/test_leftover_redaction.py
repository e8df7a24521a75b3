"""What is left of a secret after the paths every prompt takes: a root model that echoes
the key in its own reply, a rate-limit error that echoes it past where its message is
cut, and a context whose preview is cut inside it. None of them shows a form of it."""

from __future__ import annotations

import pytest
from aiohttp import web

from rlm_magic.errors import LLMQueryError
from rlm_magic.llm.redaction import REDACTED

from .support import helpers, make_rlm
from .support.llm_server import FakeLLMServer

KEY = "sk-proj-Leftover0123456789abcdefGHIJKLmnopQRSTuvwxYZ-_77"


def repl(code: str) -> str:
    return f"```repl\n{code}\n```\n"


@pytest.mark.parametrize("early", [True, False], ids=["early-execution", "after-the-reply"])
async def test_a_key_echoed_in_a_root_reply_reaches_no_record_of_the_run(server, early, tmp_path):
    rlm = make_rlm(server, api_key=KEY, early_execution=early, sandbox="none")
    server.script(
        "root-model",
        [
            f"The key is {KEY}.\n" + repl(f"k = '{KEY}'\nprint(len(k))"),
            f"FINAL(the key is {KEY})",
        ],
    )
    result = await rlm.arun("q", context="c")
    assert result.success
    assert KEY not in result.final_answer and REDACTED in result.final_answer
    responses = [iteration.response for iteration in result.trajectory]
    assert responses and all(KEY not in response for response in responses)
    assert REDACTED in responses[0]
    assert KEY not in result.save(tmp_path / "run.jsonl").read_text()
    assert KEY not in result._repr_html_()
    # The model's next prompt holds its reply as it was recorded.
    second = server.requests_for("root-model")[1]
    assert KEY not in str(second["messages"])


class RateLimitingEchoServer(FakeLLMServer):
    """Refuses every request with a 429 whose message echoes the key it was sent, again
    and again, so that wherever a message is cut, the cut falls inside a copy."""

    async def _chat(self, request):
        key = request.headers.get("Authorization", "").removeprefix("Bearer ")
        with self._lock:
            self.requests.append(await request.json())
        return web.json_response(
            {"error": {"message": f"slow down, {key * 12}", "type": "rate_limit_exceeded"}},
            status=429,
            headers={"retry-after": "0"},
        )


@pytest.fixture(scope="module")
def rate_limiting_server():
    server = RateLimitingEchoServer().start()
    yield server
    server.stop()


def shows_part_of(secret: str, text: str) -> bool:
    """Whether ``text`` holds any 8 characters of ``secret`` (its head included)."""
    return any(secret[i : i + 8] in text for i in range(len(secret) - 7))


@pytest.mark.parametrize("wire", [True, False], ids=["wire", "litellm"])
async def test_a_rate_limit_error_cut_inside_an_echoed_key_shows_no_part_of_it(
    rate_limiting_server, litellm_imported, wire
):
    from rlm_magic.llm import profiles

    profiles.forget()
    rlm = make_rlm(rate_limiting_server, api_key=KEY, wire_transport=wire, rate_limit_wait=0.05)
    with pytest.raises(LLMQueryError) as raised:
        await helpers(rlm).llm_query("hi")
    message = str(raised.value)
    assert "rate limited" in message and REDACTED in message
    assert not shows_part_of(KEY, message), message
    errors = [record.error for record in rlm.client.ledger.records if record.error]
    assert errors and not any(shows_part_of(KEY, error) for error in errors)
    profiles.forget()


def _context_cut_inside_the_key(kind: str, into: int):
    """A context of ``kind`` whose preview is cut ``into`` characters into the key."""

    def padded(cut: int) -> str:
        return "x" * (cut - into) + KEY + " tail"

    if kind == "text":
        return padded(800)
    if kind == "list":
        return [padded(200 - 1)]  # (an item's repr opens with a quote)
    if kind == "set":
        return {padded(800 - 2)}  # (``{'`` first)
    pandas = pytest.importorskip("pandas")
    # Every cell a key: the cut at 1,500 characters falls inside one.
    return pandas.DataFrame({f"column{i}": [KEY] * 5 for i in range(10)})


@pytest.mark.parametrize("kind", ["text", "list", "set", "dataframe"])
@pytest.mark.parametrize("into", [9, 30])
async def test_a_context_preview_cut_inside_a_key_shows_no_part_of_it(server, kind, into):
    rlm = make_rlm(server, api_key=KEY, sandbox="none")
    server.script("root-model", ["FINAL(ok)"])
    await rlm.arun("q", context=_context_cut_inside_the_key(kind, into))
    system = server.requests_for("root-model")[0]["messages"][0]["content"]
    assert REDACTED in system
    assert not shows_part_of(KEY, system)
