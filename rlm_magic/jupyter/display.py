"""How settings read in a notebook: ``%rlm config``'s table (a run's result renders
itself: ``rlm.render``)."""

from __future__ import annotations

import html


def settings_html(settings: dict) -> str:
    rows = "".join(
        f"<tr><td><code>RLM.{html.escape(k)}</code></td>"
        f"<td><code>{html.escape(repr(v))}</code></td></tr>"
        for k, v in settings.items()
    )
    head = "<thead><tr><th>setting</th><th>value</th></tr></thead>"
    return f"<table>{head}<tbody>{rows}</tbody></table>"


class SettingsView:
    """``%rlm config``: a table in Jupyter, aligned text elsewhere."""

    def __init__(self, settings: dict):
        self.settings = settings

    def __repr__(self) -> str:
        names = [f"RLM.{k}" for k in self.settings]
        width = max(map(len, names)) + 2  # two spaces after the longest name
        return "\n".join(
            name.ljust(width) + repr(v) for name, v in zip(names, self.settings.values())
        )

    def _repr_html_(self) -> str:
        return settings_html(self.settings)
