"""The network-fault scenarios: the full matrix and the bounded subset the default suite runs.

Every scenario runs a writer with inserts, updates, deletes, channel splits and merges, and the
query on a real local Spark behind one fault proxy per hop (integration/netfaults/harness.py).

- **mix**: 8 % of the requests of both Tablestore hops (the Tunnel API and the meta table)
  misbehave, every kind in turn (resets before and after the service applied a request,
  truncated and corrupted bodies, bad signatures, bare 500s and 503s, delays), with a query
  kill; the same on the tunnel and a DynamoDB meta table on moto;
- **outages**: one hop down while the other is up, short (ridden out) and long (the query
  fails naming the hop; the restarted query finishes exactly), each way;
- **stalls**: answers held past the clients' read timeouts on both hops.

The quick form (the ``faults`` marker, CI) is one run with the mix and a meta-hop outage past
the budget.
"""

from __future__ import annotations

from integration.netfaults.harness import NetScenario, Outage
from testkit.fault_proxy import QUICK_KINDS

RATE = 0.08


def full() -> list[NetScenario]:
    return [
        NetScenario("mix8/tablestore", "8 % of tunnel and meta-table requests misbehave, "
                    "every kind in turn, and a query kill", rate=RATE, kills=(12.0,),
                    duration_s=40.0),
        NetScenario("mix8/dynamodb-meta", "8 % of tunnel and DynamoDB meta-table requests "
                    "misbehave, every kind in turn", meta="dynamodb", rate=RATE,
                    duration_s=40.0),
        NetScenario("mix8/tunnel-only", "8 % of tunnel requests misbehave", rate=RATE,
                    hops=("tunnel",), duration_s=30.0),
        NetScenario("mix8/meta-only", "8 % of meta-table requests misbehave", rate=RATE,
                    hops=("meta",), duration_s=30.0),
        NetScenario("outage/meta-short", "the meta hop down 3 s while the tunnel is up: "
                    "ridden out", outages=(Outage("meta", 5.0, 3.0),), duration_s=15.0),
        NetScenario("outage/tunnel-short", "the tunnel hop down 5 s while the meta table is "
                    "up: ridden out", outages=(Outage("tunnel", 5.0, 5.0),), duration_s=15.0),
        NetScenario("outage/meta-long", "the meta hop down 90 s: the query fails naming it; "
                    "the restarted query finishes exactly",
                    outages=(Outage("meta", 5.0, 90.0, fails=True),), duration_s=15.0),
        NetScenario("outage/tunnel-long", "the tunnel hop down 90 s: the query fails naming "
                    "it; the restarted query finishes exactly",
                    outages=(Outage("tunnel", 5.0, 90.0, fails=True),), duration_s=15.0),
        NetScenario("outage/dynamodb-meta-long", "the DynamoDB meta hop down 90 s",
                    meta="dynamodb", outages=(Outage("meta", 5.0, 90.0, fails=True),),
                    duration_s=15.0),
        NetScenario("stalls", "answers stalled past the read timeout on both hops", stalls=2,
                    duration_s=60.0),
    ]


def quick() -> list[NetScenario]:
    """The default suite's bounded form, one Spark run: the 8 % mix on both Tablestore hops,
    then the meta hop down past the retry budget (the query fails naming the hop; the
    restarted query finishes exactly). Kills are the kill harness's (integration/faults)."""
    return [
        NetScenario("quick/mix8-meta-outage", "8 % of tunnel and meta-table requests "
                    "misbehave, every kind in turn; then the meta hop down 25 s",
                    rate=RATE, kinds=QUICK_KINDS,
                    outages=(Outage("meta", 12.0, 25.0, fails=True),), duration_s=15.0),
    ]
