"""`Overlay`: a trace's frames with some replaced or added, the rest read as before.

A load that computes more after the frames are built (a graph replay's kernels attributed
from its capture trace) changes one or two frames; the others stay what the cache gives,
each column decoded when first asked for (`loader.cache.Stored`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence

import polars as pl

from traceq.loader.loaded import Selectable


class Overlay(Mapping[str, pl.DataFrame]):
    """`base`'s frames, with `replaced` (by name) taking the place of, or adding to, them;
    `events` gives the events frame (`LoadedTrace.select("events", ...)` asks it here)."""

    def __init__(
        self,
        base: Mapping[str, pl.DataFrame],
        replaced: dict[str, pl.DataFrame],
        events: Callable[[], pl.DataFrame],
    ) -> None:
        self.base = base
        self.replaced = replaced
        self._events = events

    def __getitem__(self, name: str) -> pl.DataFrame:
        return self.replaced[name] if name in self.replaced else self.base[name]

    def __iter__(self) -> Iterator[str]:
        yield from self.base
        yield from (name for name in self.replaced if name not in self.base)

    def __len__(self) -> int:
        return len(self.base) + sum(name not in self.base for name in self.replaced)

    def __contains__(self, name: object) -> bool:
        return name in self.replaced or name in self.base

    def select(self, name: str, columns: Sequence[str]) -> pl.DataFrame:
        if name in self.replaced:
            return self.replaced[name].select(columns)
        if isinstance(self.base, Selectable):
            return self.base.select(name, columns)
        return (self._events() if name == "events" else self.base[name]).select(columns)
