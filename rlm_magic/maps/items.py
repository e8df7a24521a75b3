"""What a map is given and what it hands back: a list, or pandas' own shapes.

Given a pandas Series, a map hands back a Series with the same index and name (as
``Series.map`` does), so ``df["label"] = await llm_query_batch(df["prompt"])`` lines up
by index; given a DataFrame, a function's map calls the function on each row (a Series,
as ``df.apply(fn, axis=1)`` does) and hands back a Series on the frame's index. pandas
is never imported here: an object can only be a Series if pandas is already loaded.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError


@dataclass(frozen=True)
class MapItems:
    """A map's items as a list, and the pandas index (and name) to hand results back on."""

    values: Any  # a list (a map of prompts: what was given, unless it came from pandas)
    index: Any = None  # a pandas Index, when the items came as a Series or DataFrame
    name: Any = None

    def shaped(self, results: list[Any]) -> Any:
        """``results`` (one per item, in order) shaped as the items came."""
        if self.index is None:
            return results
        pandas = sys.modules["pandas"]
        return pandas.Series(results, index=self.index, name=self.name)


def map_items(given: Any, caller: str, *, prompts: bool = False) -> MapItems:
    """``given`` as a map's items. A DataFrame gives its rows to a function's map; a map
    of ``prompts`` refuses one (it would map the column names), and gets anything else
    as it is, for the prompts' own checks."""
    pandas = sys.modules.get("pandas")
    if pandas is not None:
        if isinstance(given, pandas.Series):
            return MapItems(given.tolist(), given.index, given.name)
        if isinstance(given, pandas.DataFrame):
            if prompts:
                raise ConfigError(
                    f"{caller} got a DataFrame: pass one column of prompts "
                    f"(df['prompt']), or amap a function over its rows"
                )
            return MapItems([row for _, row in given.iterrows()], given.index)
    if prompts:
        return MapItems(given)
    if isinstance(given, (str, bytes)) or not isinstance(given, Iterable):
        raise ConfigError(
            f"{caller} maps over a list (or any iterable) of items, got a "
            f"{type(given).__name__}"
            + (": that would be one item per character" if isinstance(given, str) else "")
        )
    return MapItems(list(given))
