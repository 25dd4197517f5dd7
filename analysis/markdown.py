"""Markdown output shared by the report's files."""

from __future__ import annotations

import pandas as pd


def markdown_table(table: pd.DataFrame) -> str:
    """A GitHub-style Markdown table (no tabulate dependency)."""
    def cell(value) -> str:
        return str(value).replace("|", "\\|").replace("\n", " ")
    lines = ["| " + " | ".join(map(cell, table.columns)) + " |",
             "|" + "|".join("---" for _ in table.columns) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in table.itertuples(index=False)]
    return "\n".join(lines) + "\n"
