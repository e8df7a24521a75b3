"""The sandbox process's environment: an allow-list of the kernel's variables, and a
PATH, HOME and TMPDIR of its own.
"""

from __future__ import annotations

import os

# The only variables of the kernel's environment the sandbox gets (an allow-list: a
# deny-list of secret-looking names lets DATABASE_URL or SENTRY_DSN through), plus
# those named in RLM.sandbox_env. None whose value holds a configured secret. The
# README's sandbox section lists the same names (a test compares them). No TERM: model
# code never has a terminal (its output is captured), so nothing should draw for one.
ENVIRONMENT_ALLOWED = (
    "LANG",
    "LANGUAGE",
    "LC_ALL",
    "LC_CTYPE",
    "LC_COLLATE",
    "LC_MESSAGES",
    "LC_NUMERIC",
    "LC_TIME",
    "LC_MONETARY",
    "TZ",
)
_SAFE_PATH = "/usr/local/bin:/usr/bin:/bin"


def sandbox_environment(
    secrets: tuple[str | None, ...] = (), workdir: str = "", names: tuple[str, ...] = ()
) -> dict[str, str]:
    """The sandbox's whole environment: the allowed variables of the kernel's, and a
    PATH, HOME and TMPDIR of its own."""
    known = tuple(s for s in secrets if s)
    env = {
        name: os.environ[name]
        for name in (*ENVIRONMENT_ALLOWED, *names)
        if name in os.environ and not any(s in os.environ[name] for s in known)
    }
    env.update(PATH=_SAFE_PATH, HOME=workdir, TMPDIR=workdir)
    return env
