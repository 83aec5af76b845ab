"""The tunnel-service contract: every ``TunnelService`` backend passes every role's suite.

The interface has three roles (``connector.tunnel.base``), each with its own suite:

- ``tunnel_admin_contract.TunnelAdministrationContract``: tunnels, start positions, schema;
- ``channel_positions_contract.ChannelPositionsContract``: checkpoints, releases,
  ``has_new_data``;
- ``channel_reader_contract.ChannelReaderContract``: pages, tokens, trimmed data, columns.

``TunnelContract`` is all three: a backend class implements every role, so its tests run them
all.

How a backend plugs in
----------------------
Write a test module for the backend with a ``tunnel_harness`` fixture (``tunnel_harness.py``
says what it provides) and a test class that inherits ``TunnelContract``::

    import pytest
    from tests.contract.tunnel_contract import TunnelContract

    @pytest.fixture
    def tunnel_harness(tmp_path):
        h = MyBackendHarness(...)        # see ``TunnelHarness``
        yield h
        h.close()

    class TestMyBackendContract(TunnelContract):
        pass

A backend whose service differs on purpose overrides a test by name in its class (the
Tablestore service numbers checkpoint pushes itself; DynamoDB Streams has no base data).
``consume``, ``consume_pass``, ``per_key`` and ``read_all`` (``tunnel_harness.py``) are a
reference consumer backends' own tests may use.
"""

from __future__ import annotations

from tests.contract.channel_positions_contract import ChannelPositionsContract
from tests.contract.channel_reader_contract import ChannelReaderContract
from tests.contract.tunnel_admin_contract import TunnelAdministrationContract
from tests.contract.tunnel_harness import (
    ConsumerState,
    TunnelHarness,
    consume,
    consume_pass,
    per_key,
    read_all,
)


class TunnelContract(TunnelAdministrationContract, ChannelPositionsContract,
                     ChannelReaderContract):
    """Every role's contract. Inherit it in a ``Test...`` class next to a ``tunnel_harness``
    fixture."""


__all__ = ["ConsumerState", "TunnelContract", "TunnelHarness", "consume", "consume_pass",
           "per_key", "read_all"]
