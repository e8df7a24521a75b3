"""The wire transport: OpenAI-compatible endpoints skip litellm's per-call machinery, and
nothing else changes. Each failure is played against both transports, which must
answer with the same one-line error, the same retries and the same ledger."""

from __future__ import annotations

import asyncio
import json
import socket
import threading

import pytest

from rlm_magic import LLMQueryError
from rlm_magic.llm import profiles
from rlm_magic.llm.litellm_loader import load_litellm

from .support import helpers, make_rlm
from .support.llm_server import echo

CLAUDE = "anthropic/claude-sonnet-4-5"


def transports(server, **settings):
    """The same settings with the wire transport on and off."""
    return {
        "wire": make_rlm(server, **settings),
        "litellm": make_rlm(server, wire_transport=False, **settings),
    }


async def forbid_litellm_calls(monkeypatch):
    litellm = await load_litellm()

    def forbidden(*args, **kwargs):
        raise AssertionError("litellm was asked to send an OpenAI-compatible request")

    for name in ("completion", "acompletion", "batch_completion"):
        monkeypatch.setattr(litellm, name, forbidden)


async def test_an_openai_compatible_endpoint_is_sent_over_the_wire(rlm, server, monkeypatch):
    await forbid_litellm_calls(monkeypatch)
    assert await helpers(rlm).llm_query("a") == "echo: a"  # streamed
    assert await helpers(rlm).llm_query_batch(["b", "c"]) == ["echo: b", "echo: c"]
    assert rlm.client.transport("openai/sub-model").name == "wire"
    assert [r["model"] for r in server.requests] == ["sub-model"] * 3
    assert rlm.usage().total.input_tokens == 30


async def test_an_anthropic_model_goes_through_litellm(server, monkeypatch):
    litellm = await load_litellm()
    sent = []
    acompletion = litellm.acompletion

    async def spy(**request):
        sent.append(request["model"])
        return await acompletion(**request)

    monkeypatch.setattr(litellm, "acompletion", spy)
    rlm = make_rlm(server, sub_model=CLAUDE, api_base=server.anthropic_base)
    assert await helpers(rlm).llm_query_batch(["a"]) == ["echo: a"]
    assert sent == [CLAUDE] and rlm.client.transport(CLAUDE).name == "litellm"


async def test_the_setting_sends_everything_through_litellm(server):
    await load_litellm()
    rlm = make_rlm(server, wire_transport=False)
    assert rlm.client.transport("openai/sub-model").name == "litellm"


@pytest.mark.parametrize(
    "model, expected",
    [
        ("openai/sub-model", "wire"),
        ("hosted_vllm/qwen", "wire"),
        ("litellm_proxy/group", "wire"),
        ("gpt-4o-mini", "wire"),
        ("openai/o3-mini", "litellm"),  # litellm rewrites its parameters
        ("openai/gpt-5", "litellm"),
        ("ollama_chat/llama3", "litellm"),
        ("azure/deployment", "litellm"),
        ("openrouter/openai/gpt-4o", "litellm"),
    ],
)
async def test_which_models_go_over_the_wire(server, model, expected):
    await load_litellm()
    assert make_rlm(server).client.transport(model).name == expected


async def test_parameters_litellm_would_rewrite_send_the_call_through_litellm(server):
    await load_litellm()
    plain = make_rlm(
        server, litellm_kwargs={"temperature": 0.1, "seed": 7, "extra_body": {"top_k": 5}}
    )
    odd = make_rlm(server, litellm_kwargs={"drop_params": True})
    assert plain.client.transport("openai/x").name == "wire"
    assert odd.client.transport("openai/x").name == "litellm"
    await helpers(plain).llm_query_batch(["a"])
    body = server.requests[-1]
    assert (body["temperature"], body["seed"], body["top_k"]) == (0.1, 7, 5)
    assert "extra_body" not in body and "max_retries" not in body


# -- the same behaviour on both transports -----------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("kind", ["500", "401", "context", "404"])
async def test_a_failure_reads_the_same_on_both_transports(server, kind, stream):
    messages, attempts = {}, {}
    for name, rlm in transports(server, max_retries=1).items():
        server.reset()
        if kind == "404":
            rlm.api_base = server.base_url + "/missing"  # no such path
        else:
            server.fail(kind, times=5)
        with pytest.raises(LLMQueryError) as caught:
            await rlm.client.complete([{"role": "user", "content": "x"}], stream=stream)
        messages[name], attempts[name] = str(caught.value), len(server.requests)
        [record] = rlm.client.ledger.records
        assert record.error == messages[name]
    assert messages["wire"] == messages["litellm"]
    assert attempts["wire"] == attempts["litellm"]


async def test_an_unreachable_endpoint_reads_the_same_on_both_transports(server):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        endpoint = f"http://127.0.0.1:{probe.getsockname()[1]}/v1"
    heads = {}
    for name, rlm in transports(server, api_base=endpoint, max_retries=1).items():
        with pytest.raises(LLMQueryError) as caught:
            await helpers(rlm).llm_query("x")
        message = str(caught.value)
        assert len(message.splitlines()) == 1
        heads[name] = message.split(" (")[0]
    assert (
        heads["wire"]
        == heads["litellm"]
        == (f"LLM call to 'openai/sub-model' failed after 2 attempts: could not reach {endpoint}")
    )


@pytest.mark.parametrize("stream", [False, True])
async def test_usage_and_cost_are_the_same_on_both_transports(server, stream):
    records = {}
    for name, rlm in transports(server, sub_model="openai/gpt-4o-mini").items():
        server.reset()
        server.auto_cache, server.usage = True, None  # cached input is priced apart
        await rlm.client.complete(
            [{"role": "system", "content": "s" * 400}, {"role": "user", "content": "a"}],
            stream=stream,
        )
        await rlm.client.complete(
            [{"role": "system", "content": "s" * 400}, {"role": "user", "content": "a"}],
            stream=stream,
        )
        records[name] = rlm.client.ledger.records
    for wire, plain in zip(records["wire"], records["litellm"]):
        assert (wire.input_tokens, wire.output_tokens, wire.cached_input_tokens) == (
            plain.input_tokens,
            plain.output_tokens,
            plain.cached_input_tokens,
        )
        assert wire.cost_usd == pytest.approx(plain.cost_usd, rel=1e-9)
    assert records["wire"][1].cached_input_tokens > 0


async def test_a_429_is_waited_out_and_teaches_the_gate_on_both_transports(server):
    for wire in (True, False):
        name = "wire" if wire else "litellm"  # a model (and so a gate) each
        rlm = make_rlm(
            server, max_retries=0, wire_transport=wire, sub_model=f"openai/limited-{name}"
        )
        server.reset()
        server.fail(
            "429",
            times=2,
            headers={
                "retry-after-ms": "50",
                "x-ratelimit-limit-requests": "100",
                "x-ratelimit-remaining-requests": "0",
                "x-ratelimit-reset-requests": "2s",
            },
        )
        assert await helpers(rlm).llm_query_batch(["x"]) == ["echo: x"], name
        [record] = rlm.client.ledger.records
        assert (record.rate_limited, record.retries, record.error) == (2, 0, None), name
        gate = rlm.client.gate()
        assert gate.requests.capacity == 100, name  # learned from the 429's headers


async def test_a_streamed_answer_over_the_wire_arrives_piece_by_piece(rlm, server):
    server.token_delay = 0.01
    server.default_reply = lambda body: "one two three four"
    pieces = []
    done = await rlm.client.complete(
        [{"role": "user", "content": "q"}],
        model="openai/root-model",
        stream=True,
        on_text=pieces.append,
    )
    assert pieces == ["one ", "two ", "three ", "four"]
    assert done.text == "one two three four" and done.streamed
    assert (done.input_tokens, done.output_tokens, done.finish_reason) == (10, 5, "stop")


async def test_a_cancelled_wire_request_closes_its_connection(rlm, server):
    server.latency = 30
    task = asyncio.ensure_future(helpers(rlm).llm_query_batch(["a", "b"]))
    assert await asyncio.to_thread(server.wait_for, lambda: server.in_flight == 2)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await asyncio.to_thread(server.wait_for, lambda: server.cancelled == 2)


async def test_each_loop_closes_its_own_connections(rlm, server):
    from rlm_magic.llm.transports import close_loop_clients
    from rlm_magic.llm.transports.wire import sessions

    await helpers(rlm).llm_query_batch(["a"])
    session, _ = sessions._SESSIONS[asyncio.get_running_loop()]
    await close_loop_clients()
    assert session.closed and asyncio.get_running_loop() not in sessions._SESSIONS


async def test_a_key_from_the_environment_is_read_again_when_it_changes(monkeypatch):
    from rlm_magic.llm.transports.wire import route_for

    litellm = await load_litellm()
    base = "http://127.0.0.1:9/v1"
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    # A server of the user's with no key anywhere is sent none (llama.cpp, vLLM...).
    assert "Authorization" not in route_for(litellm, "openai/x", base, None).headers
    # OpenAI's own API is never sent a request without one (the client refuses first).
    assert route_for(litellm, "openai/x", "https://api.openai.com/v1", None) is None
    openai = "https://api.openai.com/v1"  # (OPENAI_API_KEY goes nowhere else)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-first-key")
    assert (
        route_for(litellm, "openai/x", openai, None).headers["Authorization"]
        == "Bearer sk-first-key"
    )
    monkeypatch.setenv("OPENAI_API_KEY", "sk-second-key")
    assert (
        route_for(litellm, "openai/x", openai, None).headers["Authorization"]
        == "Bearer sk-second-key"
    )
    # A vLLM server without a key gets litellm's placeholder, resolved once.
    monkeypatch.delenv("HOSTED_VLLM_API_KEY", raising=False)
    vllm = route_for(litellm, "hosted_vllm/q", base, None)
    assert vllm is route_for(litellm, "hosted_vllm/q", base, None)
    assert vllm.headers["Authorization"] == "Bearer fake-api-key"


async def test_a_price_registered_after_the_first_call_prices_the_next(rlm, server, monkeypatch):
    litellm = await load_litellm()
    monkeypatch.delitem(litellm.model_cost, "openai/late-priced", raising=False)
    await helpers(rlm).llm_query_batch(["a"], model="openai/late-priced")
    monkeypatch.setitem(
        litellm.model_cost,
        "openai/late-priced",
        {
            "input_cost_per_token": 1e-6,
            "output_cost_per_token": 2e-6,
            "litellm_provider": "openai",
            "mode": "chat",
        },
    )
    await helpers(rlm).llm_query_batch(["b"], model="openai/late-priced")
    first, second = rlm.client.ledger.records
    assert first.cost_usd is None
    assert second.cost_usd == pytest.approx(10 * 1e-6 + 5 * 2e-6)


async def test_a_vllm_server_is_sent_the_model_name_it_knows(server, monkeypatch):
    await forbid_litellm_calls(monkeypatch)
    rlm = make_rlm(server, sub_model="hosted_vllm/Qwen/Qwen3-8B", api_key=None)
    assert await helpers(rlm).llm_query_batch(["a"]) == ["echo: a"]
    assert server.requests[-1]["model"] == "Qwen/Qwen3-8B"


def test_a_script_s_asyncio_run_closes_the_connections_it_opened(server):
    from rlm_magic.llm.transports.wire import sessions

    rlm = make_rlm(server)
    opened = []

    async def query():
        answer = await helpers(rlm).llm_query_batch(["a"])
        opened.append(sessions._SESSIONS[asyncio.get_running_loop()][0])
        return answer

    assert asyncio.run(query()) == ["echo: a"]  # no close_loop_clients: a plain script
    assert opened[0].closed and not sessions._SESSIONS


# -- streams and answers that break OpenAI's format --------------------------------------

USER = [{"role": "user", "content": "x"}]
# Streamed chunks with text, as OpenAI's stream carries them, and nothing after.
TEXT_ONLY = (
    b'data: {"choices": [{"index": 0, "delta": {"content": "half "}}]}\n\n'
    b'data: {"choices": [{"index": 0, "delta": {"content": "an answer"}}]}\n\n'
)


@pytest.mark.parametrize("name", ["wire", "litellm"])
async def test_a_stream_that_ends_before_its_finish_is_kept_as_cut_off(server, name, tmp_path):
    rlm = transports(server, cache=True, cache_dir=str(tmp_path))[name]
    server.sse_body = TEXT_ONLY  # no finish_reason, no [DONE]: the server went away
    done = await rlm.client.complete(USER, stream=True)
    assert done.text.startswith("half an answer\n[answer cut off: ")
    assert done.cut_reason == (
        "the server closed the connection after 14 characters, before the answer's end"
    )
    server.sse_body = None
    again = await rlm.client.complete(USER, stream=True)
    assert (again.text, again.cached) == ("echo: x", False)  # not cached: asked again


async def test_a_server_that_ignores_stream_is_read_as_a_completion(rlm, server):
    server.ignores_stream = True
    done = await rlm.client.complete(USER, stream=True)
    assert (done.text, done.finish_reason, done.input_tokens) == ("echo: x", "stop", 10)


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("word, named", [("max_tokens", "length"), ("eos_token", "stop")])
async def test_finish_reasons_are_named_as_litellm_names_them(server, word, named, stream):
    for name, rlm in transports(server).items():
        server.reset()
        server.finish_word = word
        done = await rlm.client.complete(USER, stream=stream)
        assert (done.finish_reason, done.cut_off) == (named, named == "length"), name


@pytest.mark.parametrize(
    "event", [b"data: {not json\n\n", b"data: 1\n\n", b'data: {"choices": 7}\n\n']
)
async def test_a_malformed_stream_event_is_retried_on_both_transports(server, event):
    for name, rlm in transports(server, max_retries=1).items():
        server.reset()
        server.sse_body = event
        with pytest.raises(LLMQueryError) as caught:
            await rlm.client.complete(USER, stream=True)
        assert len(server.requests) == 2, name  # retried once, as a connection failure
        assert len(str(caught.value).splitlines()) == 1


async def test_an_error_event_mid_stream_reads_as_its_own_error_on_both_transports(server):
    error = {
        "error": {
            "message": "This model's maximum context length is 4096 tokens. "
            "However, your messages resulted in 9000 tokens.",
            "type": "invalid_request_error",
            "code": "context_length_exceeded",
        }
    }
    messages = {}
    for name, rlm in transports(server, max_retries=2).items():
        server.reset()
        server.sse_body = b"data: " + json.dumps(error).encode() + b"\n\n"
        with pytest.raises(LLMQueryError) as caught:
            await rlm.client.complete(USER, stream=True)
        assert len(server.requests) == 1, name  # a prompt over the window: never retried
        messages[name] = str(caught.value)
    assert "maximum context length is 4096" in messages["wire"]
    assert messages["wire"] == messages["litellm"]


async def test_a_long_stream_line_is_read_whole_and_one_past_the_limit_is_refused(rlm, server):
    from rlm_magic.llm.transports.wire import MAX_LINE

    long_text = "w" * 300_000  # one event, arriving in many network reads
    event = json.dumps(
        {"choices": [{"index": 0, "delta": {"content": long_text}, "finish_reason": "stop"}]}
    )
    server.sse_body = f"data: {event}\n\ndata: [DONE]\n\n".encode()
    assert (await rlm.client.complete(USER, stream=True)).text == long_text
    server.sse_body = b"data: " + b"x" * (MAX_LINE + 100_000)  # and no newline
    with pytest.raises(LLMQueryError, match="stream line over"):
        await make_rlm(server, max_retries=0).client.complete(USER, stream=True)


@pytest.mark.parametrize("stream", [False, True])
async def test_a_redirected_request_is_not_sent_on(server, stream):
    server.redirect_to = f"http://localhost:{server.port}/elsewhere/chat/completions"
    rlm = make_rlm(server, litellm_kwargs={"extra_headers": {"x-api-key": "secret"}})
    with pytest.raises(LLMQueryError) as caught:
        await rlm.client.complete(USER, stream=stream)
    message = str(caught.value)
    assert "(307) to localhost" in message and len(message.splitlines()) == 1
    assert server.redirected == [] and len(server.requests) == 0


async def test_litellm_s_own_settings_resolve_the_route_anew(monkeypatch):
    from rlm_magic.llm.transports.wire import route_for

    litellm = await load_litellm()
    base = "http://127.0.0.1:9/v1"
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.setattr(litellm, "api_key", "sk-module-key")
    assert (
        route_for(litellm, "openai/x", base, None).headers["Authorization"]
        == "Bearer sk-module-key"
    )
    monkeypatch.setattr(litellm, "api_key", "sk-another-key")
    assert (
        route_for(litellm, "openai/x", base, None).headers["Authorization"]
        == "Bearer sk-another-key"
    )
    monkeypatch.setenv("OPENAI_ORGANIZATION", "org-later")
    monkeypatch.setenv("OPENAI_PROJECT_ID", "proj-later")
    headers = route_for(litellm, "openai/x", base, None).headers
    assert (headers["OpenAI-Organization"], headers["OpenAI-Project"]) == (
        "org-later",
        "proj-later",
    )
    monkeypatch.setattr(litellm, "headers", {"x-team": "a"})
    assert route_for(litellm, "openai/x", base, None) is None  # litellm sends those
    monkeypatch.setattr(litellm, "headers", None)
    monkeypatch.setattr(litellm, "api_base", "http://127.0.0.1:9/proxy")
    assert route_for(litellm, "openai/x", base, None) is None


async def test_a_large_prompt_without_usage_is_counted_off_the_loop(rlm, server, monkeypatch):
    litellm = await load_litellm()
    counted_on = []
    token_counter = litellm.token_counter

    def spy(*args, **kwargs):  # which thread counts cannot be seen over HTTP
        counted_on.append(threading.current_thread() is threading.main_thread())
        return token_counter(*args, **kwargs)

    monkeypatch.setattr(litellm, "token_counter", spy)
    server.usage, server.stream_usage = None, False
    big = [{"role": "user", "content": "word " * 20_000}]
    for stream in (False, True):
        # (An answer's usage teaches the model's characters per token, which then count a
        # usage-less one without litellm's tokenizer: forgotten, so that it counts.)
        profiles.forget()
        done = await rlm.client.complete(big, stream=stream)
        assert done.input_tokens > 10_000
    server.sse_body = TEXT_ONLY  # cut off: estimated at once, not counted on the loop
    cut = await rlm.client.complete(big, stream=True)
    assert cut.cut_reason and cut.input_tokens > 10_000
    assert counted_on and not any(counted_on)


# -- connections reused safely ------------------------------------------------------------


class ClosesKeptAliveConnections:
    """An HTTP server that answers the first chat request on each connection and keeps
    the connection alive, then closes it, unanswered, when the next request comes on it:
    a kept-alive connection closed by the server as a request crosses the close, every
    time. ``answers_fresh=False``: closes every connection unanswered (a server that is
    down, not a stale connection). ``connections`` counts those that carried a chat
    request (a local server's window probes get a 404 and a close)."""

    def __init__(self, answers_fresh: bool = True):
        self.answers_fresh = answers_fresh
        self.connections = self.requests = 0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.base_url = f"http://127.0.0.1:{self._listener.getsockname()[1]}/v1"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(connection,), daemon=True).start()

    def _serve(self, connection: socket.socket) -> None:
        with connection:
            data, answered = b"", False
            while True:
                while b"\r\n\r\n" not in data:
                    more = connection.recv(65536)
                    if not more:
                        return
                    data += more
                head, _, data = data.partition(b"\r\n\r\n")
                if not head.startswith(b"POST /v1/chat/completions "):
                    connection.sendall(
                        b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                    )
                    return
                length = next(
                    int(line.split(b":")[1])
                    for line in head.lower().split(b"\r\n")
                    if line.startswith(b"content-length:")
                )
                while len(data) < length:
                    data += connection.recv(65536)
                self.requests += 1
                self.connections += not answered
                if answered or not self.answers_fresh:
                    return  # closed, unanswered
                answered = True
                body = json.dumps(
                    {
                        "choices": [
                            {"index": 0, "message": {"content": "ok"}, "finish_reason": "stop"}
                        ],
                        "usage": {"prompt_tokens": 1, "completion_tokens": 1},
                    }
                ).encode()
                connection.sendall(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
                )
                data = data[length:]

    def stop(self) -> None:
        self._listener.close()


@pytest.mark.parametrize("stream", [False, True])
async def test_a_request_met_by_a_closed_kept_alive_connection_goes_again_without_a_retry(
    server, stream
):
    closing = ClosesKeptAliveConnections()
    rlm = make_rlm(server, api_base=closing.base_url, max_retries=0)
    try:
        first = await rlm.client.complete(USER, stream=stream)
        second = await rlm.client.complete(USER, stream=stream)  # on the kept-alive one
    finally:
        closing.stop()
    assert (first.text, second.text) == ("ok", "ok")
    assert [r.retries for r in rlm.client.ledger.records] == [0, 0]
    # The second request met the closed connection, then went on a new one.
    assert (closing.connections, closing.requests) == (2, 3)


async def test_a_request_that_fails_on_a_new_connection_is_not_sent_again_for_free(server):
    down = ClosesKeptAliveConnections(answers_fresh=False)
    rlm = make_rlm(server, api_base=down.base_url, max_retries=1)
    try:
        with pytest.raises(LLMQueryError, match="failed after 2 attempts"):
            await rlm.client.complete(USER)
    finally:
        down.stop()
    assert down.requests == 2  # the first attempt and its one retry, nothing more


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("every", [1, 2])
async def test_a_batch_against_a_server_that_closes_connections_spends_no_retry(
    server, stream, every
):
    server.close_every = every  # closed after every answer (or every 2nd), unannounced
    server.token_delay = 0.001
    rlm = make_rlm(server, stream=stream, max_retries=0)
    prompts = [f"prompt {i} " + "word " * (i % 8) for i in range(64)]
    answers = await helpers(rlm).llm_query_batch(prompts)
    assert answers == [f"echo: {p}" for p in prompts]
    assert sum(r.retries for r in rlm.client.ledger.records) == 0
    assert len(server.requests) == 64  # each prompt answered once
    assert server.closed_by_server >= 16


async def _pooled(expected: bool) -> None:
    """Until this loop's pool holds an idle connection (when one is ``expected``)."""
    from rlm_magic.llm.transports.wire.sessions import session

    connector = session().connector
    for _ in range(1000):  # up to ~2 s on a loaded machine; at once on a quiet one
        if not expected or any(connector._conns.values()):
            return
        await asyncio.sleep(0.002)


@pytest.mark.parametrize("ending", ["whole", "cut off", "abandoned"])
async def test_a_streamed_answer_leaves_no_broken_connection_in_the_pool(rlm, server, ending):
    from rlm_magic.llm.transports import close_loop_clients

    await close_loop_clients()  # an empty pool: the connections counted are this test's
    if ending == "cut off":
        server.default_reply = lambda body: "one two three four"
        server.drop_at = 2  # the server goes away after two pieces
    if ending == "abandoned":
        server.token_delay = 10
        call = asyncio.ensure_future(rlm.client.complete(USER, stream=True))
        assert await asyncio.to_thread(server.wait_for, lambda: server.chunks_sent == 1)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
    else:
        first = await rlm.client.complete(USER, stream=True)
        assert first.cut_reason is None if ending == "whole" else first.cut_reason
    server.drop_at, server.token_delay = None, 0.0
    server.default_reply = echo
    calls = len(rlm.client.ledger.records)
    for i in range(4):
        # A whole answer's connection goes back to the pool as the body's last bytes
        # (after [DONE]) arrive: a call sent before that opens another, as it should.
        await _pooled(ending == "whole" or i > 0)
        assert (await rlm.client.complete(USER, stream=True)).text == "echo: x"
    assert [r.retries for r in rlm.client.ledger.records[calls:]] == [0] * 4
    # A whole answer's connection carried the next ones; an abandoned one was dropped
    # (one cut off by the server is reused only if its body ended cleanly).
    if ending != "cut off":
        assert server.connections == (1 if ending == "whole" else 2)
