"""A registry of named facts (torch-free): the objectives (rspo.method) and the benchmarks
(rspo.benchmark_catalog) are each one ``Registry``: a mapping name -> entry, an entry registered once,
and ``names()``, a live view of the registered names, so a setting whose choices it is accepts an
entry registered after the setting was defined (a new loss, a new benchmark)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

__all__ = ["Names", "Registry"]


class Names(Sequence[str]):
    """The names ``source()`` gives, read afresh at every use; equal to the tuple of those names."""

    def __init__(self, source: Callable[[], tuple[str, ...]]):
        self._source = source

    def __getitem__(self, i):  # type: ignore[override]
        return self._source()[i]

    def __len__(self) -> int:
        return len(self._source())

    def __iter__(self) -> Iterator[str]:
        return iter(self._source())

    def __contains__(self, name: object) -> bool:
        return name in self._source()

    def __eq__(self, other: object) -> bool:
        return self._source() == (tuple(other) if isinstance(other, (tuple, Names)) else other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return repr(self._source())


class Registry(dict):
    """Entries by their ``name``; ``noun`` names them in the error of a second registration."""

    def __init__(self, noun: str):
        super().__init__()
        self.noun = noun

    def register(self, entry: Any) -> Any:
        """Add ``entry`` under its name (a name registered twice is refused)."""
        if entry.name in self:
            raise ValueError(f"{self.noun} {entry.name!r} is already registered")
        self[entry.name] = entry
        return entry

    def names(self, keep: Callable[[Any], bool] = lambda entry: True) -> Names:
        """A live view of the names of the entries ``keep`` accepts, in registration order."""
        return Names(lambda: tuple(name for name, entry in self.items() if keep(entry)))
