"""What one replicated table is doing: its state and why, one type from the source to the feed.

Every place that knows or shows a table's state uses ``TableState``: the multi-table source
keeps one per table (``connector.multiplex``, in Spark's planning process) and reports it in
Spark's progress report; ``tablestore_cdc.pipeline.multi_table`` reads it back there (driver)
and joins the apply's failures over it; ``tablestore_cdc.table_status.TableStatus`` keeps its
name (``state``) and reason, which the meta store, the feed, the dashboard, ``meta tables`` and
the metrics read.

It crosses process boundaries in two forms, each written and read here only:

- the progress report's text (``to_text`` / ``from_text``): ``streaming``, ``new``,
  ``dropped``, ``failed: <reason>``, ``waiting: <reason>``, ``restarting: <reason> (attempt n,
  next in d s)``;
- a ``TableStatus`` record's ``state`` (a ``State`` value, the JSON string it always was) and
  ``reason`` (``of``; the replication job's own restart reads ``attempt n, next in d s:
  <reason>``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

from cdc_common.errors import CdcError


class State(StrEnum):
    """A table's state (its value is what the progress report, the meta store's records, the
    feed's JSON and the metrics' ``state`` label hold)."""

    #: joined the query in this batch: read from the next one on
    NEW = "new"
    #: reading its base data (a BaseAndStream tunnel), then its changes
    SNAPSHOTTING = "snapshotting"
    STREAMING = "streaming"
    #: its lease is held by another process: tried again shortly
    WAITING = "waiting"
    #: a retryable error (the service unreachable, throttled): tried again on a backoff
    RESTARTING = "restarting"
    #: restarting, as its status shows it: the source does not answer (``TableStatusWriter``)
    UNREACHABLE = "unreachable"
    #: no longer listed: its offset stays frozen
    DROPPED = "dropped"
    #: a configuration or data error (source side), or a batch its target refused
    FAILED = "failed"
    #: the replication job stopped cleanly
    STOPPED = "stopped"

    @property
    def reads(self) -> bool:
        """Does a table in this state read (its source answers; ``tablestore_cdc_table_up``)?"""
        return self in READING


#: the states in which a table reads (its source answers)
READING = frozenset((State.NEW, State.SNAPSHOTTING, State.STREAMING, State.WAITING))
#: the states that keep a table out of the query until a restart
FINAL = frozenset((State.DROPPED, State.FAILED))
#: the states in which the query itself tries the table again
PAUSED = frozenset((State.WAITING, State.RESTARTING))


class TableStateError(CdcError):
    """A table's state in a form nothing here writes."""

    template = "table state {text!r}: {problem}; allowed: {allowed}"


#: a multi-table restart's figures after its reason, and the replication job's before it
_FIGURES_AFTER = re.compile(r"^(?P<reason>.*?)\s*\(attempt (?P<attempt>\d+), "
                            r"next in (?P<delay>[0-9.]+) s\)\s*$", re.DOTALL)
_FIGURES_BEFORE = re.compile(r"^\s*attempt (?P<attempt>\d+), next in (?P<delay>[0-9.]+) "
                             r"s(?::\s*(?P<reason>.*))?$", re.DOTALL)


@dataclass(frozen=True)
class TableState:
    """A table's state with its reason, and while restarting its attempt (in a row) and the
    seconds until the next one."""

    state: State
    reason: str | None = None
    attempt: int | None = None
    next_in_s: float | None = None

    @classmethod
    def restarting(cls, reason: str, attempt: int, next_in_s: float) -> TableState:
        return cls(State.RESTARTING, reason, attempt, next_in_s)

    def to_text(self) -> str:
        """The progress report's form (module docstring)."""
        reason = self.reason or ""
        if self.attempt is not None:
            figures = f"(attempt {self.attempt}, next in {self.next_in_s or 0.0:.1f} s)"
            reason = f"{reason} {figures}" if reason else figures
        return f"{self.state.value}: {reason}" if reason else self.state.value

    @classmethod
    def from_text(cls, text: str) -> TableState:
        """Read ``to_text``'s form back (``TableStateError`` for any other)."""
        name, _, reason = text.partition(": ")
        return cls.of(name, reason or None, text=text)

    @classmethod
    def of(cls, state: str, reason: str | None = None, *, text: str | None = None
           ) -> TableState:
        """A state's name and its reason as a status record holds them; a restart's
        figures in the reason (either form) are taken out of it."""
        try:
            name = State(state)
        except ValueError:
            raise TableStateError(text=text if text is not None else state,
                                  problem="names no state",
                                  allowed=", ".join(s.value for s in State)) from None
        found = None if reason is None else (_FIGURES_AFTER.match(reason)
                                             or _FIGURES_BEFORE.match(reason))
        if found is None:
            return cls(name, reason)
        return cls(name, found.group("reason") or None, int(found.group("attempt")),
                   float(found.group("delay")))

    def label(self) -> str:
        """As a person reads it: ``failed: <reason>``, ``streaming``."""
        return f"{self.state.value}: {self.reason}" if self.reason else self.state.value
