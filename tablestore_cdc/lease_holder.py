"""Whether the holder of a source's lease still runs, seen from this host (driver / CLI
process). A lease's owner id is ``host/pid/random`` (``connector.planning.lease``); on this
host the pid tells, on another it cannot be told. ``meta break-lease``
(``tablestore_cdc.commands.meta.leases``) refuses to break a live holder's lease, and the checks
before ``replicate`` starts (``tablestore_cdc.pipeline.preflight``) pass over a dead one's."""

from __future__ import annotations

import os
import socket


def holder_alive(owner: str) -> bool | None:
    """Is the process of lease owner ``owner`` (``host/pid/random``) running? None when it
    is on another host (or the id is not of that form): it cannot be told from here."""
    host, _, rest = owner.partition("/")
    pid_text = rest.partition("/")[0]
    if host != socket.gethostname() or not pid_text.isdigit():
        return None
    try:
        os.kill(int(pid_text), 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # a process of another user: it exists
        return True
    return True
