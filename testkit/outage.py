"""An outage of chosen service calls, in every process of a running job: a fault hook.

``outage_hook(client)`` is a fault hook of the product's client seam
(``connector.clients.ClientHooks.fault_hook``), named in ``TABLESTORE_CDC_FAULT_HOOK`` so that the
job's driver, Spark's planning process and its Python workers all wrap their tunnel-service and
meta-store clients with it. Each call reads the plan file ``TABLESTORE_CDC_OUTAGE_FILE`` names
(JSON ``{"methods": [...] | null, "until": <seconds since the epoch>}``; re-read when it
changes): until ``until``, a call of one of ``methods`` (every call when null) raises the
client's retryable error (``TransientTunnelError`` / ``TransientMetaStoreError``), as a service
that stopped answering would after the per-call retries. No file, or a past ``until``: every
call goes through. Unlike killing the emulator, the outage lands on one exact step of a batch
(its planning, the opening of a table, a read, a commit): ``STEPS`` names the calls of each.

``environment(plan)`` is what a test adds to the environment of the job it starts;
``start(plan, step, seconds)`` begins an outage, ``end(plan)`` ends it early.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from connector.clients import FAULT_HOOK_ENV
from connector.errors import TransientMetaStoreError, TransientTunnelError
from connector.proxy import ClientProxy
from connector.tunnel import TunnelService

OUTAGE_FILE_ENV = "TABLESTORE_CDC_OUTAGE_FILE"
HOOK = f"{__name__}:outage_hook"
#: the checkout (``testkit``'s parent): Python workers import this module from there
REPO = Path(__file__).resolve().parent.parent

#: the service calls of each step of a batch (planning process or executors); None: all
STEPS: dict[str, frozenset[str] | None] = {
    # latestOffset: the tunnel asked for news, the batch's row created
    "planning": frozenset({"has_new_data", "create_batch", "successors"}),
    # the same, and a table's protocol opened again (its schema read)
    "opening": frozenset({"has_new_data", "create_batch", "successors", "table_schema"}),
    # an executor's read of a channel
    "reading": frozenset({"read_records", "read_page"}),
    # commit: the batch marked committed, its checkpoints pushed
    "committing": frozenset({"mark_committed", "checkpoint", "checkpoint_many",
                             "mark_pushed"}),
    # the whole service
    "everything": None,
}


def environment(plan: Path) -> dict[str, str]:
    """The variables that switch the hook on in a job's processes."""
    path = os.environ.get("PYTHONPATH", "")
    return {FAULT_HOOK_ENV: HOOK, OUTAGE_FILE_ENV: str(plan),
            "PYTHONPATH": f"{REPO}{os.pathsep}{path}" if path else str(REPO)}


def start(plan: Path, step: str, seconds: float) -> None:
    """Begin an outage of ``step``'s calls (``STEPS``) lasting ``seconds`` from now."""
    methods = STEPS[step]
    text = json.dumps({"methods": sorted(methods) if methods is not None else None,
                       "until": time.time() + seconds})
    tmp = plan.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, plan)


def end(plan: Path) -> None:
    plan.unlink(missing_ok=True)


class _Plan:
    """The plan file, read again when its modification time changes."""

    def __init__(self, path: str) -> None:
        self._path = path
        self._stamp: float | None = None
        self._methods: frozenset[str] | None = frozenset()
        self._until = 0.0

    def refuses(self, method: str) -> bool:
        try:
            stamp = os.stat(self._path).st_mtime
        except OSError:
            return False
        if stamp != self._stamp:
            try:
                plan = json.loads(Path(self._path).read_text())
            except (OSError, ValueError):
                return False
            self._stamp = stamp
            listed = plan.get("methods")
            self._methods = None if listed is None else frozenset(listed)
            self._until = float(plan.get("until", 0.0))
        if time.time() >= self._until:
            return False
        return self._methods is None or method in self._methods


class _Unanswered(ClientProxy):
    def __init__(self, target: Any, plan: _Plan) -> None:
        super().__init__(target)
        self._plan = plan
        self._error = (TransientTunnelError if isinstance(target, TunnelService)
                       else TransientMetaStoreError)

    def _call(self, name: str, method: Any, *args: Any, **kwargs: Any) -> Any:
        if self._plan.refuses(name):
            raise self._error(detail=f"{name}: no answer (outage, {OUTAGE_FILE_ENV})")
        return method(*args, **kwargs)


def outage_hook(client: Any) -> Any:
    """``client``, refusing the calls the plan file names while its outage lasts (module
    docstring); unchanged when ``TABLESTORE_CDC_OUTAGE_FILE`` is unset."""
    path = os.environ.get(OUTAGE_FILE_ENV, "").strip()
    return _Unanswered(client, _Plan(path)) if path else client


__all__ = ["HOOK", "OUTAGE_FILE_ENV", "STEPS", "end", "environment", "outage_hook", "start"]
