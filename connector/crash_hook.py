"""The crash points' seam: named protocol steps where an installed hook may act (driver or
executor). With no hook installed -- production -- a crash point is one module-global check.

The product calls ``crash_point(name, context)`` at each step (the driver's protocol in
``connector.protocol``, ``connector.planning.pushes``, ``connector.multiplex``; the executor's
read in ``connector.reader``; the sinks, the apply sink and the re-snapshot repair in
``tablestore_cdc``); docs/reliability.md lists the names. Whoever wants to act there calls
``install(hook)`` in that process: the fault harness (``testkit/crash_points.py``) parks,
fails or holds the process at an armed point so it can kill it exactly there.

Why a process-global slot and not a collaborator like ``connector.clients.ClientHooks``: the
points sit where no client seam is at hand (a sink's commit, a table's apply, the repair), on
the driver and in Python workers Spark starts itself; a slot each process fills needs no
argument threaded through those calls. Why not the environment: the product reads nothing for
a test's sake and imports no test code; the harness decides how its hook reaches each process
(its ``sitecustomize``, run at every start of a process the harness's environment reaches, the
Python workers included).
"""

from __future__ import annotations

from typing import Any, Protocol


class CrashHook(Protocol):
    """Called at every crash point with its name and its context (picklable, or None)."""

    def __call__(self, name: str, context: Any) -> None: ...


_hook: CrashHook | None = None


def install(hook: CrashHook | None) -> CrashHook | None:
    """Install ``hook`` in this process (None: remove it); returns the one it replaces."""
    global _hook
    previous, _hook = _hook, hook
    return previous


def installed() -> CrashHook | None:
    """This process's hook (None: none installed)."""
    return _hook


def crash_point(name: str, context: Any = None) -> None:
    """Protocol step ``name`` (driver or executor): the installed hook's to act on, if any.
    ``context`` (picklable, e.g. the partition being read) is handed to the hook."""
    if _hook is not None:
        _hook(name, context)


__all__ = ["CrashHook", "crash_point", "install", "installed"]
