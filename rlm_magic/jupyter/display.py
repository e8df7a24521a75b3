"""How settings read in a notebook: ``%rlm config``'s, ``%rlm keys``' and ``%rlm usage``'s
tables (a run's result renders itself: ``rlm.render``)."""

from __future__ import annotations

import html
from collections.abc import Mapping
from typing import Any

from .._tables import html_table, text_table
from .._terminal_text import fitted_table, terminal_columns
from ..llm.usage import UsageSummary


def settings_html(settings: dict[str, Any]) -> str:
    rows = "".join(
        f"<tr><td><code>RLM.{html.escape(k)}</code></td>"
        f"<td><code>{html.escape(repr(v))}</code></td></tr>"
        for k, v in settings.items()
    )
    head = "<thead><tr><th>setting</th><th>value</th></tr></thead>"
    return f"<table>{head}<tbody>{rows}</tbody></table>"


class SettingsView:
    """``%rlm config``: a table in Jupyter, aligned text elsewhere."""

    def __init__(self, settings: dict[str, Any]):
        self.settings = settings

    def __repr__(self) -> str:
        names = [f"RLM.{k}" for k in self.settings]
        width = max(map(len, names)) + 2  # two spaces after the longest name
        return "\n".join(
            name.ljust(width) + repr(v) for name, v in zip(names, self.settings.values())
        )

    def _repr_html_(self) -> str:
        return settings_html(self.settings)


# What litellm reads for each provider's key (litellm.validate_environment, 1.110; a test
# checks this table against it). Not every provider litellm knows: asking litellm about
# each would import it (seconds), and for some providers starts a login flow.
PROVIDER_KEYS: dict[str, tuple[str, ...]] = {
    "openai": ("OPENAI_API_KEY",),
    "anthropic": ("ANTHROPIC_API_KEY",),
    "gemini": ("GEMINI_API_KEY|GOOGLE_API_KEY",),  # either
    "vertex_ai": ("VERTEXAI_PROJECT", "VERTEXAI_LOCATION"),
    "azure": ("AZURE_API_KEY", "AZURE_API_BASE", "AZURE_API_VERSION"),
    "bedrock": ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"),
    "mistral": ("MISTRAL_API_KEY",),
    "groq": ("GROQ_API_KEY",),
    "cohere": ("COHERE_API_KEY",),
    "together_ai": ("TOGETHERAI_API_KEY",),
    "openrouter": ("OPENROUTER_API_KEY",),
    "deepseek": ("DEEPSEEK_API_KEY",),
    "xai": ("XAI_API_KEY",),
    "fireworks_ai": ("FIREWORKS_AI_API_KEY",),
    "perplexity": ("PERPLEXITYAI_API_KEY",),
    "huggingface": ("HUGGINGFACE_API_KEY",),
    "cerebras": ("CEREBRAS_API_KEY",),
    "deepinfra": ("DEEPINFRA_API_KEY",),
}


class KeysView:
    """``%rlm keys``: for each provider, the environment variables litellm reads for its
    key and whether they are set; never a value. ``models`` maps a provider to the
    settings (RLM.model, RLM.sub_model) whose model it serves."""

    COLUMNS = ("provider", "environment variable", "set", "used by")

    def __init__(self, environ: Mapping[str, str], models: dict[str, list[str]], api_key_set: bool):
        self.rows = []
        for provider, names in PROVIDER_KEYS.items():
            missing = [n for n in names if not any(environ.get(v) for v in n.split("|"))]
            state = "yes" if not missing else ("no" if len(missing) == len(names) else "partly")
            shown = ", ".join(n.replace("|", " or ") for n in names)
            self.rows.append((provider, shown, state, ", ".join(models.get(provider, []))))
        self.api_key_set = api_key_set

    def _note(self) -> str:
        if self.api_key_set:
            return "RLM.api_key is set: it is sent instead of these for every model."
        return "RLM.api_key is not set (%config RLM.api_key = ... overrides these)."

    def __repr__(self) -> str:
        return f"{text_table(self.COLUMNS, self.rows, numbers_right=False)}\n{self._note()}"

    def _repr_html_(self) -> str:
        note = html.escape(self._note())
        return f"{html_table(self.COLUMNS, self.rows)}<p>{note}</p>"


class UsageView:
    """``%rlm usage``: the usage table in Jupyter; in a terminal, fitted to its width
    (80 columns where it cannot tell), since nine columns of figures take over 100.
    Reads as the ``UsageSummary`` it shows (``.cost_usd``, ``.by_model``, ...)."""

    def __init__(self, summary: UsageSummary, columns: int | None = None):
        self.summary = summary
        self.columns = columns  # None: the terminal's, when shown

    def __getattr__(self, name: str) -> Any:
        return getattr(self.summary, name)

    def __repr__(self) -> str:
        if not self.summary.by_model:
            return repr(self.summary)
        columns = self.columns or terminal_columns()
        return fitted_table(self.summary._columns, self.summary._rows(), columns)

    def _repr_html_(self) -> str:
        return self.summary._repr_html_()
