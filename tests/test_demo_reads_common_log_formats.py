"""The demo on one's own log: it answers its own question (*Which service has the most
"timeout" lines?*) over the common log formats, and over data it cannot read says in one
line what it reads, at once, instead of counting nothing for 30 turns."""

from __future__ import annotations

import json
import re
from collections import Counter

import pytest

from rlm_magic import RLM, demo
from rlm_magic.demo.log_fields import UNDERSTOOD, field_of

SERVICES = ["checkout", "auth", "search", "payments"]


def _lines(kind: str, count: int = 400) -> tuple[str, Counter]:
    rows, timeouts = [], Counter()
    for i in range(count):
        service = SERVICES[(i * 7) % 4]
        message = "timeout calling upstream" if i % (2 + SERVICES.index(service)) == 0 else "ok"
        if "timeout" in message:
            timeouts[service] += 1
        level = "ERROR" if "timeout" in message else "INFO"
        stamp = f"2026-01-01 12:{i % 60:02d}:{i % 60:02d}"
        rows.append(
            {
                "plain": f"{stamp} {service} {message}",
                "iso-level": f"2026-01-01T12:00:{i % 60:02d}Z {level} {service} {message}",
                "bracketed": f"[{stamp},123] [{level.lower()}] {service}: {message}",
                "json": json.dumps(
                    {"time": stamp, "level": level, "service": service, "msg": message}
                ),
                "syslog": f"Jan  1 12:00:{i % 60:02d} web01 {service}[{100 + i}]: {message}",
                "key=value": f"{stamp} service={service} level={level} msg={message}",
            }[kind]
        )
    return "\n".join(rows), timeouts


@pytest.fixture
def demo_rlm():
    rlm = RLM(progress=False, max_iterations=30)
    demo.start(rlm, root_latency=0.01, sub_latency=0.01)
    yield rlm
    demo.stop(rlm)


@pytest.mark.parametrize("kind", ["plain", "iso-level", "bracketed", "json", "syslog", "key=value"])
async def test_the_demo_answers_its_question_over_a_log_format(demo_rlm, kind):
    logs, timeouts = _lines(kind)
    result = await demo_rlm.arun('Which service has the most "timeout" lines?', context=logs)
    assert result.success, result.error
    assert result.iterations == 3
    counts = dict(re.findall(r"(\w+): (\d+)", result.final_answer.split(": ", 1)[1]))
    assert {k: int(v) for k, v in counts.items()} == dict(timeouts)


async def test_over_an_access_log_it_counts_by_path_or_status(demo_rlm):
    lines = [
        f'10.0.0.{i % 5} - - [01/Jan/2026:12:00:00 +0000] "GET /{("api", "cart", "login")[i % 3]}'
        f'?q={i} HTTP/1.1" {(200, 504)[i % 2]} 512 "-" "curl/8"'
        for i in range(300)
    ]
    result = await demo_rlm.arun('Which path has the most "504" lines?', context="\n".join(lines))
    assert result.success, result.error
    expected = Counter(line.split()[6].split("?")[0] for line in lines if '" 504 ' in line)
    for path, count in expected.items():
        assert f"{path}: {count}" in result.final_answer


async def test_data_it_cannot_read_is_refused_in_one_line_naming_what_it_reads(demo_rlm):
    logs = "\n".join(f"timeout at step {i}; the worker restarted" for i in range(200))
    result = await demo_rlm.arun('Which service has the most "timeout" lines?', context=logs)
    assert not result.success and result.iterations <= 2  # not 30 turns of nothing
    assert UNDERSTOOD in result.error and "\n" not in result.error
    assert result.usage.total.total_tokens < 5_000


async def test_a_term_no_line_holds_is_said_in_words(demo_rlm):
    logs, _ = _lines("plain")
    result = await demo_rlm.arun('Which service has the most "disk full" lines?', context=logs)
    assert result.success and result.final_answer == 'No "disk full" line names a service'


@pytest.mark.parametrize(
    "line, field, value",
    [
        ("2026-01-01 12:00:00 checkout timeout", "service", "checkout"),
        ("<34>1 2026-01-01T12:00:00Z web01 billing 42 - - timeout", "service", "billing"),
        ('{"App": "search", "msg": "timeout"}', "services", "search"),
        ("2026-01-01T12:00:00+02:00 WARN auth timeout", "level", "WARN"),
        ('1.2.3.4 - bob [01/Jan/2026:00:00:00 +0000] "POST /pay HTTP/2" 504 0', "status", "504"),
        ("just words here", "service", None),
    ],
)
def test_the_sub_model_reads_a_field_from_each_format(line, field, value):
    assert field_of(line, field) == value
