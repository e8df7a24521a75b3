"""Small tables, as aligned text (terminals, ``jupyter console``) and as HTML (notebooks):
usage, sessions, batch jobs and settings are shown this way."""

from __future__ import annotations

import html
from collections.abc import Sequence

Row = Sequence[str]


def text_table(
    head: Row, rows: Sequence[Row], *, numbers_right: bool = True, rule: bool = False
) -> str:
    """Columns two spaces apart: the first (a name) to the left, the others to the right
    where ``numbers_right``; with ``rule``, a dashed line under the head."""
    every = [head, *rows]
    widths = [max(len(row[i]) for row in every) for i in range(len(head))]

    def line(row: Row) -> str:
        return "  ".join(
            cell.rjust(width) if numbers_right and i else cell.ljust(width)
            for i, (cell, width) in enumerate(zip(row, widths))
        ).rstrip()

    lines = [line(row) for row in every]
    if rule:
        lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)


def html_table(
    head: Row,
    rows: Sequence[Row],
    *,
    css_class: str | None = None,
    row_classes: Sequence[str | None] = (),
    sections: bool = True,
) -> str:
    """An HTML table, every cell escaped; ``row_classes[i]``: row i's class, if any;
    without ``sections``, rows straight in the table (no ``<thead>``/``<tbody>``)."""
    classes = list(row_classes) + [None] * (len(rows) - len(row_classes))
    head_cells = "".join(f"<th>{html.escape(cell)}</th>" for cell in head)
    body = "".join(
        (f"<tr class='{css}'>" if css else "<tr>")
        + "".join(f"<td>{html.escape(cell)}</td>" for cell in row)
        + "</tr>"
        for row, css in zip(rows, classes)
    )
    opening = f"<table class='{css_class}'>" if css_class else "<table>"
    if not sections:
        return f"{opening}<tr>{head_cells}</tr>{body}</table>"
    return f"{opening}<thead><tr>{head_cells}</tr></thead><tbody>{body}</tbody></table>"
