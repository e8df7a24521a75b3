"""Which field of a log line the demo's sub model counts by: the formats it reads.

The demo answers questions like *Which service has the most "timeout" lines?* by rule
(``script``): it counts the lines holding the term, grouped by a field it reads from
each line. It reads the field from:

- ``key=value`` or ``key: value`` pairs (``service=checkout``);
- JSON lines (``{"service": "checkout", ...}``);
- syslog (``Jan  1 12:00:00 host checkout[123]: ...``: the program is the service;
  RFC 5424's ``<pri>1 timestamp host app ...`` too);
- a timestamp, a level if any, then the service (``2026-01-01 12:00:00 ERROR
  checkout ...``, ``[2026-01-01T12:00:00Z] [warn] checkout: ...``);
- access logs, Apache's and nginx's common and combined formats (ip, user, method,
  path, status, bytes; no service).

``UNDERSTOOD`` says so in one line, for data it cannot read.
"""

from __future__ import annotations

import json
import re

UNDERSTOOD = (
    "key=value pairs (service=NAME), JSON lines, syslog (host NAME[pid]: ...), "
    "TIMESTAMP [LEVEL] NAME ... lines, and Apache/nginx access logs (ip, method, path, status)"
)

# The names a question may use for a field, and what each format calls it.
ALIASES: dict[str, tuple[str, ...]] = {
    "service": ("service", "app", "application", "program", "component", "svc", "source"),
    "level": ("level", "severity", "lvl", "loglevel"),
    "host": ("host", "hostname", "server", "node"),
    "ip": ("ip", "client", "remote_addr", "address"),
    "path": ("path", "url", "endpoint", "route", "page", "request"),
    "status": ("status", "code", "status_code"),
    "method": ("method", "verb"),
    "user": ("user", "username"),
}
_CANONICAL = {alias: name for name, aliases in ALIASES.items() for alias in aliases}

_LEVELS = r"TRACE|DEBUG|INFO|NOTICE|WARN|WARNING|ERROR|ERR|CRITICAL|CRIT|FATAL|ALERT|EMERG"
_TIMESTAMP = r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(?::\d{2}(?:[.,]\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?"
_STAMPED = re.compile(
    rf"^\[?{_TIMESTAMP}\]?\s+(?:\[?(?P<level>{_LEVELS})\]?:?\s+)?"
    rf"\[?(?P<service>[A-Za-z][\w.-]*)\]?:?(?:\s|$)",
    re.IGNORECASE,
)
_SYSLOG = re.compile(
    r"^(?:<\d+>)?[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d (?P<host>\S+) "
    r"(?P<service>[^\s:\[]+)(?:\[\d+\])?:"
)
_SYSLOG_5424 = re.compile(r"^<\d+>1 \S+ (?P<host>\S+) (?P<service>\S+) ")
_ACCESS = re.compile(
    r'^(?P<ip>\S+) \S+ (?P<user>\S+) \[[^\]]+\] "(?P<method>[A-Z]+) (?P<path>[^\s?"]+)'
    r'[^"]*" (?P<status>\d{3}) '
)


def canonical(field: str) -> str:
    """The field a question's word names (``services``, ``apps`` -> ``service``)."""
    word = field.lower()
    for candidate in (word, word[:-1], word[:-2]):
        if candidate in _CANONICAL:
            return _CANONICAL[candidate]
    return word


def field_of(line: str, field: str) -> str | None:
    """The value of ``field`` in ``line``, in any format above; None if it has none."""
    pair = re.search(rf"\b{re.escape(field)}=(\S+)", line)
    if pair:  # (as the demo always read it)
        return pair.group(1)
    name = canonical(field)
    names = ALIASES.get(name, (name,))
    stripped = line.strip()
    if stripped.startswith("{"):
        try:
            record = json.loads(stripped)
        except ValueError:
            record = None
        if isinstance(record, dict):
            lowered = {str(k).lower(): v for k, v in record.items()}
            for key in names:
                if lowered.get(key) not in (None, ""):
                    return str(lowered[key])
            return None
    for key in names:
        found = re.search(rf"\b{re.escape(key)}\s*[=:]\s*\"?([\w./-]+)", line, re.IGNORECASE)
        if found:
            return found.group(1)
    for pattern in (_SYSLOG, _SYSLOG_5424, _ACCESS, _STAMPED):
        found = pattern.match(line)
        if found and name in found.groupdict() and found.group(name):
            return found.group(name)
    return None
