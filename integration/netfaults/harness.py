"""Run one network-fault scenario on a real local Spark and verify it like the kill tests.

Where things run:

- this module, the scenario's ``Writer`` thread (integration/faults/workload.py: inserts,
  updates, deletes, channel splits and merges, written straight into the store file as the
  service's own writers would) and one ``FaultProxy`` per hop run in the **harness process**;
- the Tablestore emulator (``tablestore-cdc emulator``) serves the store file in a **child
  process**; for a DynamoDB meta table a moto server runs in another;
- the query (``testkit.runner``: the Spark driver and its Python workers) runs in its own
  process tree and reaches every service through a proxy only: the Tunnel API through the
  ``tunnel`` hop, the meta table through the ``meta`` hop (another port to the same emulator,
  or to moto), so each hop fails on its own.

A scenario turns faults on once the query delivers (a seeded share of the requests of the
chosen hops, every kind in turn; outages of one hop for N seconds; stalled answers), kills the
query at given moments, restarts it after a kill or after a failure it was meant to have
(an outage longer than the retry budget: the error must name the hop), and at the end stops
the writer, lets everything through, waits until every change is delivered and stops the query.
Then it checks: every change exactly once and in order per key, the table rebuilt from the sink
equal to the store's, every replay of a stored batch identical, no stored batch rewritten, and
the meta table consistent (``meta_consistency``).
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

from integration.faults.workload import TABLE, Writer
from integration.scenario import ScenarioResult, ScenarioRun, run_and_tidy
from meta_store import BatchState, MetaStore, open_meta_store
from testkit.emulator import INSTANCE, KEY_ID, SECRET, EmulatorProcess
from testkit.fault_proxy import QUICK_KINDS, FaultProxy, Kind, Rule
from testkit.processes import kill_tree, start_runner
from testkit.waiting import wait_until

log = logging.getLogger("integration.netfaults")

TUNNEL = "netfaults"
META_TABLE = "cdc_meta"
STARTUP_TIMEOUT_S = 300.0
#: how long a query may take to fail once a hop is down for good (the budget, with margin)
FAILURE_TIMEOUT_S = 240.0
AWS_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing-secret",
           "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"}


@dataclass(frozen=True)
class Outage:
    """``hop`` down for ``seconds``, ``at_s`` after the faults start. ``fails``: the outage
    outlasts the retry budget, so the query must fail naming the hop, and is restarted."""

    hop: str
    at_s: float
    seconds: float
    fails: bool = False


@dataclass(frozen=True)
class NetScenario:
    name: str
    why: str
    meta: str = "tablestore"  # the meta table: "tablestore" (the emulator) or "dynamodb"
    rate: float = 0.0  # share of the requests of ``hops`` that misbehave
    kinds: tuple[Kind, ...] = QUICK_KINDS
    hops: tuple[str, ...] = ("tunnel", "meta")
    outages: tuple[Outage, ...] = ()
    kills: tuple[float, ...] = ()  # seconds after the faults start: SIGKILL, restart
    stalls: int = 0  # answers stalled past the read timeout on each hop of ``hops``
    duration_s: float = 20.0  # faults (and writes) last at least this long
    channels: int = 4
    write_rate: float = 30.0
    options: tuple[tuple[str, str], ...] = (("maxOffsetsPerChannel", "100"),)


@dataclass
class NetResult(ScenarioResult):
    hops: str = ""
    faults: str = ""
    runs: int = 0
    requests: dict[str, int] = field(default_factory=dict)
    injected: dict[str, dict[str, int]] = field(default_factory=dict)
    #: the query failures the scenario caused on purpose, each with the error's first line
    failures: list[str] = field(default_factory=list)
    #: seconds from the end of each fault (outage, kill) until every change written by then
    #: was delivered
    recover_s: list[float] = field(default_factory=list)
    meta_batches: int = 0

    def line(self) -> str:
        injected = sum(sum(k.values()) for k in self.injected.values())
        requests = sum(self.requests.values())
        recover = f" recover={max(self.recover_s):.1f}s" if self.recover_s else ""
        verdict = "PASS" if self.ok else "FAIL: " + "; ".join(self.problems)
        return (f"{self.name:<34} runs={self.runs} changes={self.changes} lost={self.lost} "
                f"duplicated={self.duplicated} out-of-order={self.out_of_order} "
                f"replays={self.replays}{'' if self.replays_identical else ' (DIFFERENT)'} "
                f"faults={injected}/{requests} failures={len(self.failures)}{recover} "
                f"{self.seconds:.0f}s {verdict}")


def emulator_process(store: Path, log: Path) -> EmulatorProcess:
    """``tablestore-cdc emulator`` serving ``store`` with the scenarios' instance and key pair,
    in a child process."""
    return EmulatorProcess(store, log, INSTANCE, KEY_ID, SECRET)


def meta_consistency(meta: MetaStore, namespace: str) -> list[str]:
    """What must hold of a meta table after a run, along its batch chain: every committed
    batch has a manifest and an end checkpoint for each of its channels, each end starts
    where the manifest says, and a batch's channels start where the previous committed batch's
    ends stopped (a channel that did not finish must go on from exactly there)."""
    problems: list[str] = []
    batches = meta.list_batches(namespace)
    committed = [b for b in batches if b.state.rank >= BatchState.COMMITTED.rank]
    #: where each unfinished channel stopped in the previous committed batch
    previous: dict[str, str] | None = None
    for batch in committed:
        if batch.manifest is None:
            problems.append(f"committed batch {batch.uuid} has no manifest")
            previous = None
            continue
        planned = {c.channel_id: c for c in batch.manifest.channels}
        if batch.prev_uuid is None:  # the initial offset: positions only, nothing read
            previous = {c: start.token for c, start in planned.items()}
            continue
        ends = meta.get_end_checkpoints(namespace, batch.uuid)
        for channel_id, start in planned.items():
            end = ends.get(channel_id)
            if end is None:
                problems.append(f"batch {batch.uuid}: channel {channel_id} has no end")
            elif end.start_token != start.token:
                problems.append(f"batch {batch.uuid}: channel {channel_id} ended from "
                                f"{end.start_token!r}, planned from {start.token!r}")
        extra = set(ends) - set(planned)
        if extra:
            problems.append(f"batch {batch.uuid}: ends of unplanned channels {sorted(extra)}")
        if previous is not None:
            for channel_id, token in previous.items():
                start = planned.get(channel_id)
                if start is None or start.token != token:
                    problems.append(f"batch {batch.uuid}: channel {channel_id} starts at "
                                    f"{start.token if start else None!r}, the previous batch "
                                    f"ended at {token!r}")
        previous = {c: e.token for c, e in ends.items() if not e.finished}
    return problems[:10]


class NetScenarioRun(ScenarioRun):
    """One scenario's processes, proxies and files; ``run()`` (``ScenarioRun``'s) returns its
    ``NetResult``."""

    result: NetResult

    def __init__(self, scenario: NetScenario, workdir: Path, seed: int) -> None:
        super().__init__(scenario.name, workdir)
        self.scenario = scenario
        self.seed = seed
        self.channels = scenario.channels
        self.emulator = emulator_process(self.store_path, self.dir / "emulator.log")
        self.moto: subprocess.Popen[str] | None = None
        self.proxies: dict[str, FaultProxy] = {}
        self.runner_log = self.dir / "runner-00.log"
        self.meta_uri = ""
        self.direct_meta_uri = ""  # the same meta table, not through the proxy
        self.env: dict[str, str] = {}
        self.result = NetResult(scenario.name, hops="+".join(scenario.hops))

    # --- services and the query -------------------------------------------------------------

    def _start_services(self) -> None:
        s = self.scenario
        self.emulator.start()
        self.proxies["tunnel"] = FaultProxy(self.emulator.port, name="tunnel").start()
        if s.meta == "dynamodb":
            from testkit.aws import start_moto_server

            self.moto, endpoint = start_moto_server()
            self.proxies["meta"] = FaultProxy(int(endpoint.rsplit(":", 1)[1]),
                                              name="meta").start()
            self.meta_uri = (f"dynamodb://{META_TABLE}?region=us-east-1&endpoint_url="
                             f"{self.proxies['meta'].url}&create_table=true")
            self.direct_meta_uri = self.meta_uri.replace(self.proxies["meta"].url, endpoint)
            self.env = {**AWS_ENV, "AWS_CONFIG_FILE": str(self.dir / "no-aws-config"),
                        "AWS_SHARED_CREDENTIALS_FILE": str(self.dir / "no-aws-credentials")}
        else:
            self.proxies["meta"] = FaultProxy(self.emulator.port, name="meta").start()
            self.meta_uri = (f"tablestore://{INSTANCE}/{META_TABLE}?endpoint="
                             f"{quote(self.proxies['meta'].url, safe='')}&create_table=true")
            self.direct_meta_uri = self.meta_uri.replace(
                quote(self.proxies["meta"].url, safe=""),
                quote(f"http://127.0.0.1:{self.emulator.port}", safe=""))
        self.env["TABLESTORE_CDC_LOG_LEVEL"] = "INFO"

    def _args(self) -> list[str]:
        options = {"instance.name": INSTANCE, "access.key.id": KEY_ID,
                   "access.key.secret": SECRET, **dict(self.scenario.options)}
        args = ["--endpoint", self.proxies["tunnel"].url, "--table", TABLE, "--tunnel", TUNNEL,
                "--checkpoint", str(self.dir / "checkpoint"), "--sink", str(self.sink.path),
                "--stop-file", str(self.stop_file), "--trigger-ms", "300",
                "--meta-store", self.meta_uri]
        for key, value in options.items():
            args += ["--option", f"{key}={value}"]
        return args

    def start_query(self) -> None:
        self.result.runs += 1
        self.runner_log = self.dir / f"runner-{self.result.runs:02d}.log"
        self.runner = start_runner(self._args(), self.runner_log, self.env)
        log.info("%s: query run #%d (pid %d)", self.scenario.name, self.result.runs,
                 self.runner.pid)

    def recovered_since(self, since: float) -> None:
        """Record how long after ``since`` every change written by then was delivered."""
        self.wait_all_delivered()
        self.result.recover_s.append(round(time.monotonic() - since, 1))

    # --- the scenario -----------------------------------------------------------------------

    def make_writer(self) -> Writer:
        return Writer(self.store_path, f"{self.seed}:{self.scenario.name}",
                      rate=self.scenario.write_rate)

    def execute(self, writer: Writer) -> None:
        self._start_services()
        writer.start()
        self.start_query()
        before = self.watcher.poll()
        wait_until("the first batch in the sink", lambda: self.watcher.poll() > before,
                   timeout=STARTUP_TIMEOUT_S, process=self.runner)
        self._faults(time.monotonic())
        for proxy in self.proxies.values():
            proxy.clear()
        writer.finish()
        drained = time.monotonic()
        self.drain_and_stop()
        log.info("%s: drained and stopped in %.1f s", self.scenario.name,
                 time.monotonic() - drained)

    def cleanup_actions(self, writer: Writer) -> list[tuple[str, Callable[[], Any]]]:
        return [*super().cleanup_actions(writer), ("proxies", self._stop_proxies)]

    def close(self) -> None:
        """The emulator and moto served the meta table ``_check_meta`` read."""
        self.emulator.kill()
        if self.moto is not None:
            from testkit.aws import stop_moto_server

            stop_moto_server(self.moto)
            self.moto = None

    def _faults(self, start: float) -> None:
        """The fault timeline, from ``start`` (the query delivers)."""
        s = self.scenario
        for name in s.hops:
            proxy = self.proxies[name]
            if s.rate:
                proxy.random(s.rate, s.kinds, seed=self.seed)
            if s.stalls:  # spread over the run: the 10th request from now, then every 30th
                proxy.add(Rule(Kind.STALL, ordinals=frozenset(range(10, 10 + 30 * s.stalls, 30))))
        events: list[tuple[float, Any]] = sorted(
            [(o.at_s, o) for o in s.outages] + [(k, "kill") for k in s.kills],
            key=lambda e: e[0])
        for at, event in events:
            self._sleep_until(start + at)
            if event == "kill":
                log.info("%s: SIGKILL the query", s.name)
                self.kill_query()
                self.start_query()
                self.recovered_since(time.monotonic())
            else:
                self._outage(event)
        self._sleep_until(start + s.duration_s)
        if s.rate or s.stalls:
            # the fault mix stops with the writes: the time until the query has everything
            for proxy in self.proxies.values():
                proxy.clear()
            self.recovered_since(time.monotonic())

    def _outage(self, outage: Outage) -> None:
        proxy = self.proxies[outage.hop]
        log.info("%s: the %s hop is down for %.0f s", self.scenario.name, outage.hop,
                 outage.seconds)
        rule = proxy.down(outage.seconds)
        ends = time.monotonic() + outage.seconds
        if outage.fails:
            assert self.runner is not None
            runner = self.runner
            try:
                runner.wait(min(FAILURE_TIMEOUT_S, outage.seconds + 30))
            except subprocess.TimeoutExpired:
                raise AssertionError(f"the query rode out a {outage.seconds:.0f} s outage of "
                                     f"the {outage.hop} hop meant to outlast its retry "
                                     "budget") from None
            error = self._failure_line()
            self.result.failures.append(error)
            port = str(proxy.port)
            hop_named = (port in error and ("meta store" in error if outage.hop == "meta"
                                            else "/tunnel/" in error))
            if not hop_named:
                self.result.problems.append(f"the query's failure does not name the "
                                            f"{outage.hop} hop (port {port}): {error}")
            kill_tree(runner.pid)
            self.runner = None
            self._sleep_until(ends)
            self.start_query()
        else:
            self._sleep_until(ends)
            if self.runner is not None and self.runner.poll() is not None:
                raise AssertionError(f"the query failed during a {outage.seconds:.0f} s "
                                     f"outage of the {outage.hop} hop: {self._failure_line()}")
        rule.until = 0.0
        self.recovered_since(time.monotonic())

    def _failure_line(self) -> str:
        """The product error that failed the query (the runner prints Spark's exception, whose
        text carries the Python traceback of the failed call)."""
        text = self.runner_log.read_text(errors="replace")
        block = text[text.find("runner: query failed:"):] if "runner: query failed:" in text \
            else text[-4000:]
        errors = re.findall(r"\b((?:\w+\.)*\w*(?:Tunnel|MetaStore)\w*Error): ([^\n]+)", block)
        if errors:
            name, message = errors[-1]
            return f"{name.rsplit('.', 1)[-1]}: {message.strip()}"[:600]
        return "(no product error found) " + block[:600]

    def _sleep_until(self, when: float) -> None:
        while time.monotonic() < when:
            if self.runner is not None and self.runner.poll() is not None:
                raise AssertionError(f"the query exited with {self.runner.returncode}: "
                                     f"{self._failure_line()}")
            time.sleep(min(0.2, max(0.0, when - time.monotonic())))

    def _stop_proxies(self) -> None:
        for name, proxy in self.proxies.items():
            self.result.requests[name] = proxy.requests
            self.result.injected[name] = proxy.counts()
            proxy.stop()

    def verify(self) -> None:
        r = self.result
        self.verify_delivery()
        faults = {k for hop in r.injected.values() for k in hop}
        r.faults = ",".join(sorted(faults))
        expected = set(self.scenario.kinds) if self.scenario.rate else set()
        if self.scenario.rate and len(faults) < min(len(expected), 3):
            r.problems.append(f"too few kinds of fault were injected: {sorted(faults)}")
        if self.scenario.stalls:  # a stalled hop sends fewer requests: at least one each
            unstalled = [h for h in self.scenario.hops
                         if not r.injected.get(h, {}).get(Kind.STALL.value)]
            if unstalled:
                r.problems.append(f"no answer was stalled on {unstalled}")
        self._check_meta()

    def _check_meta(self) -> None:
        from connector.options import SourceOptions

        options = SourceOptions.from_spark({
            "endpoint": self.proxies["tunnel"].url, "table.name": TABLE,
            "tunnel.name": TUNNEL, "instance.name": INSTANCE, "access.key.id": KEY_ID,
            "access.key.secret": SECRET, "meta.store": self.meta_uri})
        # read directly, not through the (stopped) proxy; boto3 takes the query's credentials
        # from the environment
        saved = {k: os.environ.get(k) for k in self.env}
        os.environ.update(self.env)
        try:
            meta = open_meta_store(self.direct_meta_uri, options.meta_store_credentials)
            try:
                problems = meta_consistency(meta, options.source_identity)
                self.result.meta_batches = len(meta.list_batches(options.source_identity))
            finally:
                meta.close()
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
        self.result.problems.extend(f"meta table: {p}" for p in problems)


def run_net_scenario(scenario: NetScenario, workdir: Path, seed: int = 1,
                     keep: bool = False) -> NetResult:
    """Run ``scenario`` in ``workdir``; its files are removed when it passes unless ``keep``."""
    log.info("scenario %s: %s", scenario.name, scenario.why)
    result = run_and_tidy(NetScenarioRun(scenario, workdir, seed), keep)
    assert isinstance(result, NetResult)
    return result
