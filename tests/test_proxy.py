"""The LiteLLM Proxy path, against a real proxy (``litellm --config``) on 127.0.0.1 in
front of the local test server: helpers and runs go through it, its errors are one
clear line, its rate limit is waited out, and its prices reach the ledger."""

from __future__ import annotations

import pytest

from rlm_magic import RLM, LLMQueryError

from .support import helpers
from .support.kernels import Kernel
from .support.litellm_proxy import MASTER_KEY

pytestmark = pytest.mark.proxy


def through(proxy, **settings) -> RLM:
    defaults = dict(
        model="litellm_proxy/root",
        sub_model="litellm_proxy/sub",
        api_base=proxy.base_url,
        api_key=MASTER_KEY,
        progress=False,
        retry_backoff=0.01,
        timeout=30,
    )
    return RLM(**{**defaults, **settings})


async def test_a_batch_goes_through_the_proxy(litellm_proxy, server):
    rlm = through(litellm_proxy)
    answers = await helpers(rlm).llm_query_batch([f"p{i}" for i in range(24)])
    assert answers == [f"echo: p{i}" for i in range(24)]
    assert len(server.requests_for("sub-model")) == 24
    usage = rlm.usage()
    assert usage.total.calls == 24 and usage.total.input_tokens == 24 * 10


async def test_a_run_goes_through_the_proxy(litellm_proxy, server):
    rlm = through(litellm_proxy)
    server.script(
        "root-model",
        ["```repl\nanswers = llm_query_batch(['a', 'b', 'c'])\n```", "FINAL_VAR(answers)"],
    )
    result = await rlm.arun("q", context="ctx")
    assert result.success and result.final_answer == str(["echo: a", "echo: b", "echo: c"])
    assert len(server.requests_for("root-model")) == 2


async def test_a_rlm_cell_goes_through_the_proxy(litellm_proxy, server, shell):
    from rlm_magic.jupyter.extension import session_rlm

    from .support import run_cell

    rlm = session_rlm(shell)
    rlm.api_base, rlm.api_key = litellm_proxy.base_url, MASTER_KEY
    rlm.model, rlm.sub_model = "litellm_proxy/root", "litellm_proxy/sub"
    shell.user_ns["logs"] = "timeout\nok\ntimeout"
    server.script("root-model", ["```repl\nn = llm_query('count')\n```", "FINAL_VAR(n)"])
    await run_cell(shell, "%%rlm --context logs --out res\nHow many timeouts?")
    assert shell.user_ns["res"].final_answer == "echo: count"
    assert len(server.requests_for("root-model")) == 2
    assert len(server.requests_for("sub-model")) == 1


async def test_the_proxy_s_rate_limit_is_waited_out_losing_no_item(litellm_proxy, server):
    # The proxy allows 3 requests in flight for "limited"; 16 go out at once.
    rlm = through(litellm_proxy, sub_model="litellm_proxy/limited", max_concurrency=16)
    server.latency = 0.2
    answers = await helpers(rlm).llm_query_batch([f"p{i}" for i in range(20)])
    assert answers == [f"echo: p{i}" for i in range(20)]
    usage = rlm.usage()
    assert usage.total.rate_limited > 0 and usage.total.errors == 0
    assert server.peak_in_flight <= 3


async def test_a_wrong_key_is_one_clear_line(litellm_proxy, server):
    rlm = through(litellm_proxy, api_key="sk-not-the-master-key")
    with pytest.raises(LLMQueryError) as caught:
        await helpers(rlm).llm_query("x")
    message = str(caught.value)
    assert message == (
        "LLM call to 'litellm_proxy/sub' failed: the LiteLLM Proxy rejected "
        "the API key: it is not the proxy's master key, and the proxy has no "
        "database to look other keys up in"
    )
    assert not server.requests


async def test_the_proxy_s_reported_cost_reaches_the_ledger(litellm_proxy, server):
    rlm = through(litellm_proxy, sub_model="litellm_proxy/priced")
    await helpers(rlm).llm_query("x")
    [record] = rlm.client.ledger.records
    # gpt-4o-mini's price for 10 input and 5 output tokens, as the proxy computed it.
    assert record.cost_usd == pytest.approx(10 * 0.15e-6 + 5 * 0.6e-6)


def test_two_kernels_sharing_the_proxy_lose_no_item(
    litellm_proxy,
    llm_server,  # noqa: F811
    kernel_specs,
    kernel_env,
):
    kernels = [Kernel("rlm", kernel_specs, kernel_env) for _ in range(2)]
    try:
        for kernel in kernels:
            kernel.run(
                "\n".join(
                    [
                        "import rlm_magic",
                        f'%config RLM.api_base = "{litellm_proxy.base_url}"',
                        '%config RLM.sub_model = "litellm_proxy/limited"',
                        f'%config RLM.api_key = "{MASTER_KEY}"',
                        "%config RLM.max_concurrency = 16",
                    ]
                )
            )
        llm_server.reset()
        llm_server.latency = 0.2
        cells = [
            kernel.submit(
                f"_a = await llm_query_batch([f'k{n}-{{i}}' for i in range(16)])\n"
                "print(sum(a.startswith('echo: ') for a in _a), "
                "rlm_magic.usage().total.rate_limited)"
            )
            for n, kernel in enumerate(kernels)
        ]
        outputs = []
        for kernel, msg_id in zip(kernels, cells):
            reply, _ = kernel.wait(msg_id, timeout=120)
            assert reply["status"] == "ok", reply.get("evalue")
            outputs.append(
                "".join(
                    m["content"]["text"]
                    for _, m in kernel.messages(msg_id)
                    if m["msg_type"] == "stream"
                ).split()
            )
        assert [answered for answered, _ in outputs] == ["16", "16"]
        assert sum(int(limited) for _, limited in outputs) > 0  # the limit was met
        assert len(llm_server.requests_for("sub-model")) == 32
        assert llm_server.peak_in_flight <= 3
    finally:
        for kernel in kernels:
            kernel.stop()
