"""Tokens of the tunnel protocol that every layer compares against, defined once.

``FINISHED`` is the position of a channel read to its end (the real Tablestore Tunnel service's
``next_token == "finished"``). The tunnel backends return it, the driver pushes it as a channel's
last checkpoint, the meta store records it in manifests and end checkpoints, and the inspection
tools and feed recognise it there.
"""

from __future__ import annotations

#: Token of a channel read to its end.
FINISHED = "finished"
