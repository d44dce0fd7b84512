"""What a long command shows while it works: tqdm bars and one-line notes, all on stderr.

One helper for every stage (synth, fetch, export, build, validate, bench), so that each line
starts the same way (``s1omni <command>: ``) and one switch silences them. Bars are drawn only
when stderr is a terminal; notes are plain lines there and in logs alike. ``configure(quiet=True)``
(the CLI's ``--quiet``) turns both off, and Hugging Face Hub's download bars with them. Library
callers that never configure get notes under the ``s1omni`` prefix. A stage says where its time
goes: each phase's closing line ends with its seconds (``timed``).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import TypeVar

from tqdm import tqdm

T = TypeVar("T")

# Worker processes (the export's tracing pool) start from the environment: they print alike.
PREFIX_VARIABLE, QUIET_VARIABLE = "_S1OMNI_PROGRESS_PREFIX", "_S1OMNI_PROGRESS_QUIET"
_settings = {"prefix": os.environ.get(PREFIX_VARIABLE, "s1omni"), "quiet": os.environ.get(QUIET_VARIABLE) == "1"}


def configure(prefix: str, quiet: bool) -> None:
    """Name the running command in every line, and silence everything under ``quiet``."""
    _settings.update(prefix=prefix, quiet=quiet)
    os.environ[PREFIX_VARIABLE], os.environ[QUIET_VARIABLE] = prefix, "1" if quiet else "0"
    if quiet:
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()


def _bars_shown() -> bool:
    return not _settings["quiet"] and sys.stderr.isatty()


def note(message: str) -> None:
    """One line of progress on stderr (between the bars on a terminal)."""
    if not _settings["quiet"]:
        tqdm.write(f"{_settings['prefix']}: {message}", file=sys.stderr)


class Phase:
    """A phase's seconds (so far, or in all once it has ended), and what its closing line adds (``detail``)."""

    def __init__(self) -> None:
        self.started = time.perf_counter()
        self.ended: float | None = None
        self.detail = ""

    @property
    def seconds(self) -> float:
        return (self.ended or time.perf_counter()) - self.started


@contextmanager
def timed(done: str) -> Iterator[Phase]:
    """A phase whose closing line, when it ends without an error, says ``done in N.N s`` (with the
    ``detail`` the block set on the phase before the seconds)."""
    phase = Phase()
    yield phase
    phase.ended = time.perf_counter()
    note(f"{done}{phase.detail} in {phase.seconds:.1f} s")


def bar(total: float | None, what: str, unit: str = "it", unit_scale: bool = False, shown: bool = True) -> tqdm:
    """A bar to ``update`` as work is done (a context manager); drawn only on a terminal, and not
    when the caller says the work is too small to show (``shown``)."""
    return tqdm(
        total=total, desc=f"{_settings['prefix']}: {what}", unit=unit, unit_scale=unit_scale,
        file=sys.stderr, disable=not (shown and _bars_shown()), leave=False, dynamic_ncols=True,
    )  # fmt: skip


def track(items: Iterable[T], what: str, total: int | None = None, unit: str = "it") -> Iterator[T]:
    """``items``, counted on a bar as they are taken."""
    with bar(total if total is not None else _length(items), what, unit) as shown:
        for item in items:
            yield item
            shown.update(1)


class Counted(Sequence[T]):
    """A sequence whose iteration is counted on a bar, indexable still (a Polygraphy data loader)."""

    def __init__(self, items: Sequence[T], what: str, unit: str):
        self.items, self.what, self.unit = items, what, unit

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index):  # type: ignore[override] # int or slice, as the items take it
        return self.items[index]

    def __iter__(self) -> Iterator[T]:
        return track(self.items, self.what, len(self.items), self.unit)


def _length(items: Iterable[object]) -> int | None:
    try:
        return len(items)  # type: ignore[arg-type]
    except TypeError:
        return None
