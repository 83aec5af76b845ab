"""A Spark standalone cluster across network namespaces: a worker killed, a worker cut off.

Hosts (``integration.netfaults.netns``, addresses ``127.42.0.x`` inside the namespaces only):

=========  ==========  =====================================================================
host       address     runs
=========  ==========  =====================================================================
svc        .10         the Tablestore emulator (Tunnel API and the meta table) on the store;
                       with ``Cluster(s3=True)`` a moto S3 server too
master     .20         ``spark-class org.apache.spark.deploy.master.Master``
driver     .30         the query (``testkit.runner --master spark://127.42.0.20:7077``)
w1, w2     .41, .42    ``spark-class org.apache.spark.deploy.worker.Worker`` (1 core each);
                       the executors they launch and their Python workers
=========  ==========  =====================================================================

Master and workers come from PySpark's own distribution (``$SPARK_HOME/bin/spark-class``; the
pip package has no ``start-master.sh``). The hosts share nothing but what is on disk: the Spark
checkpoint directory (the driver's), the code and the venv. The store file is the service's
(the writer thread in the harness process writes it, as the service's own writers would; the
emulator serves it); the sink is the driver's.

Steps (``ClusterScenario``):

- **worker killed mid-batch**: a task is parked right after claiming its channel's end
  (crash point ``mid_read``); the worker running it is SIGKILLed with its executor and Python
  workers; the task reruns on the other worker and reads exactly to the claimed end; the killed
  worker is started again, as a cluster manager would;
- **worker cut off from the service mid-read**: a task is held between fetching its records
  and claiming its end (crash point ``read_before_claim``), its worker's packets to the
  service host are dropped (a blackhole route: no RST, no answer), the task is released into
  the partition: its claim and the worker's next reads fail on the clients' timeouts (then the
  retry layer gives up), Spark runs those tasks again; the partition heals after ``cut_s``.

Then the writer stops, everything is delivered, the query stops, and the sink is verified
against the store's change log like every fault scenario (lost, duplicated, order per key,
state, identical replays).
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from integration.faults.workload import TABLE, Writer
from integration.netfaults.harness import (
    INSTANCE,
    KEY_ID,
    META_TABLE,
    SECRET,
)
from integration.netfaults.netns import Hosts
from integration.scenario import (
    ScenarioResult,
    ScenarioRun,
    run_and_tidy,
)
from testkit.aws import AWS_TEST_ENV, start_moto_server
from testkit.crash_points import environment as crash_environment
from testkit.crash_points import spark_conf as crash_spark_conf
from testkit.emulator import CLI
from testkit.processes import REPO, arm_crash_point, kill_tree
from testkit.waiting import wait_until

log = logging.getLogger("integration.netfaults.cluster")

HOSTS = {"svc": 10, "master": 20, "driver": 30, "w1": 41, "w2": 42}
WORKERS = ("w1", "w2")
EMULATOR_PORT, MASTER_PORT = 8090, 7077
STARTUP_TIMEOUT_S = 400.0


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent


@dataclass(frozen=True)
class ClusterScenario:
    name: str
    kill_worker: int = 1  # workers SIGKILLed mid-batch (one after another)
    cut_worker: int = 1  # workers cut off from the service mid-read
    cut_s: float = 40.0  # past the clients' budgets: a call fails and its task is rerun
    tail_s: float = 8.0  # writes after the last step
    channels: int = 4
    write_rate: float = 20.0


@dataclass
class ClusterResult(ScenarioResult):
    workers_killed: int = 0
    workers_cut: int = 0
    executors_lost: int = 0
    #: read failures the cut worker's executor logged while cut off
    cut_read_failures: int = 0
    recover_s: list[float] = field(default_factory=list)

    def line(self) -> str:
        verdict = "PASS" if self.ok else "FAIL: " + "; ".join(self.problems)
        recover = f" recover={max(self.recover_s):.1f}s" if self.recover_s else ""
        return (f"{self.name:<22} changes={self.changes} lost={self.lost} "
                f"duplicated={self.duplicated} out-of-order={self.out_of_order} "
                f"killed={self.workers_killed} cut={self.workers_cut} "
                f"executors-lost={self.executors_lost} cut-read-failures="
                f"{self.cut_read_failures}{recover} {self.seconds:.0f}s {verdict}")


class Cluster:
    """The hosts and the standalone cluster on them (harness process): ``start()`` brings the
    hosts up, the emulator on svc serving ``store_path``, the master and both workers;
    ``held_worker`` finds the worker running a task parked at a crash point, ``kill_worker``
    SIGKILLs a worker with its executor and Python workers, ``start_worker`` brings it back;
    ``down()`` ends every process started on the hosts and removes them. Master, workers and
    their Python workers run ``python`` and the Spark of its PySpark (``spark_home``). Used by
    ``ClusterRun`` (the source under ``testkit.runner``) and
    ``integration/test_cluster_replicate.py`` (``tablestore-cdc replicate``).

    ``s3=True``: a moto S3 server on the svc host too (``s3_endpoint``, as every host reaches
    it; ``s3_env``, the AWS environment naming it with ``testkit.aws``'s fake credentials,
    which the workers, so their executors, run with, as a user's cluster nodes would), and
    ``s3_local``, the same server from this machine's root namespace (``start_forward``)."""

    def __init__(self, workdir: Path, store_path: Path, python: str = sys.executable,
                 s3: bool = False) -> None:
        self.dir, self.store_path, self.python = workdir, store_path, python
        self.spark = spark_home() if python == sys.executable else spark_home_of(python)
        self.hosts = Hosts(HOSTS)
        self.workers: dict[str, subprocess.Popen[Any]] = {}
        self.s3 = s3
        self.s3_endpoint = self.s3_local = ""
        self._forward: subprocess.Popen[str] | None = None

    @property
    def s3_env(self) -> dict[str, str]:
        if not self.s3_endpoint:
            return {}
        return {**AWS_TEST_ENV, "AWS_ENDPOINT_URL": self.s3_endpoint, "AWS_REGION": "us-east-1"}

    def _spark_class(self, host: str, main: str, *args: str, log: Path) -> subprocess.Popen[Any]:
        env = {"SPARK_HOME": str(self.spark), "SPARK_LOCAL_IP": self.hosts.addr(host),
               "PYSPARK_PYTHON": self.python, "SPARK_NO_DAEMONIZE": "1", **self.s3_env}
        return self.hosts.popen(host, [str(self.spark / "bin" / "spark-class"), main, *args],
                                env=env, log=log, cwd=self.dir)

    def start_worker(self, name: str) -> None:
        work = self.dir / f"{name}-work"
        work.mkdir(exist_ok=True)
        log_path = self.dir / f"{name}.log"
        self.workers[name] = self._spark_class(
            name, "org.apache.spark.deploy.worker.Worker", "--host", self.hosts.addr(name),
            "--port", "7078", "--webui-port", "8081", "--cores", "1", "--memory", "1G",
            "--work-dir", str(work), self.master_url, log=log_path)

    @property
    def master_url(self) -> str:
        return f"spark://{self.hosts.addr('master')}:{MASTER_PORT}"

    @property
    def endpoint(self) -> str:
        """The emulator's URL, as the driver and the executors reach it."""
        return f"http://{self.hosts.addr('svc')}:{EMULATOR_PORT}"

    def start(self) -> None:
        self.hosts.up()
        if self.s3:
            _, self.s3_endpoint = start_moto_server(
                self.hosts.addr("svc"), functools.partial(self.hosts.popen, "svc"))
            port = int(self.s3_endpoint.rsplit(":", 1)[1])
            self._forward, local = start_forward(self.hosts.ns("svc"),
                                                 (self.hosts.addr("svc"), port))
            self.s3_local = f"http://127.0.0.1:{local}"
        emulator = self.hosts.popen(
            "svc", [CLI, "emulator", "--store", str(self.store_path), "--instance", INSTANCE,
                    "--access-key-id", KEY_ID, "--access-key-secret", SECRET, "--host",
                    self.hosts.addr("svc"), "--port", str(EMULATOR_PORT)],
            stdout=subprocess.PIPE, stderr=open(self.dir / "emulator.log", "ab"),  # noqa: SIM115
            cwd=REPO, text=True)
        assert emulator.stdout is not None
        line = emulator.stdout.readline().strip()
        if not line.startswith("listening on"):
            raise RuntimeError(f"the emulator did not start: {line!r}")
        master_log = self.dir / "master.log"
        self._spark_class("master", "org.apache.spark.deploy.master.Master", "--host",
                          self.hosts.addr("master"), "--port", str(MASTER_PORT),
                          "--webui-port", "8080", log=master_log)
        for name in WORKERS:
            self.start_worker(name)
        wait_until("both workers registered with the master",
                   lambda: _count(master_log, "Registering worker") >= len(WORKERS),
                   timeout=STARTUP_TIMEOUT_S)

    def driver_conf(self) -> dict[str, str]:
        """The application's Spark settings on the driver host: bound to its address, one
        1-core executor per worker, tasks retried past a lost worker, ``python`` everywhere."""
        driver = self.hosts.addr("driver")
        return {"spark.driver.host": driver, "spark.driver.bindAddress": driver,
                "spark.executor.memory": "512m", "spark.executor.cores": "1",
                "spark.cores.max": "2", "spark.task.maxFailures": "8",
                "spark.pyspark.python": self.python}

    def held_worker(self, faults: Path, point: str, process: subprocess.Popen[Any] | None
                    ) -> str:
        """A task reached crash point ``point`` (armed in ``faults``): on which worker (the
        Worker JVM among its ancestors). ``process``: the application, whose end fails the
        wait."""
        hit = faults / f"hit-{point}"
        wait_until(f"a task to reach {point}", hit.exists, timeout=STARTUP_TIMEOUT_S,
                   process=process)
        pid = int(hit.read_text())
        ancestors = {p.pid for p in psutil.Process(pid).parents()}
        for name, proc in self.workers.items():
            if proc.pid in ancestors:
                return name
        raise AssertionError(f"the task at {point} (pid {pid}) runs under no worker")

    def kill_worker(self, name: str) -> None:
        """SIGKILL worker ``name`` with its executor and their Python workers."""
        kill_tree(self.workers[name].pid)

    def down(self) -> None:
        if self._forward is not None:
            kill_tree(self._forward.pid)
        self.hosts.down()


def start_forward(namespace: str, address: tuple[str, int]) -> tuple[subprocess.Popen[str], int]:
    """A relay process (``forward``) from a port of this machine's 127.0.0.1 (the root
    namespace, where the hosts' addresses are not routed) to ``address`` inside network
    namespace ``namespace``: how the harness reads what a host serves (the S3 server of
    ``Cluster(s3=True)``). A process of its own, not threads of the harness: a client that
    blocks holding the interpreter's lock (``deltalake``'s reads do) would stop a relay
    sharing it. Returns the process and its port."""
    code = ("import sys; from integration.netfaults.cluster import forward; "
            "forward(sys.argv[1], (sys.argv[2], int(sys.argv[3])))")
    proc = subprocess.Popen([sys.executable, "-c", code, namespace, address[0],
                             str(address[1])], stdout=subprocess.PIPE, text=True, cwd=REPO,
                            start_new_session=True)
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    if not line.isdigit():
        kill_tree(proc.pid)
        raise RuntimeError(f"the relay to {address} in {namespace} did not start: {line!r}")
    return proc, int(line)


def forward(namespace: str, address: tuple[str, int]) -> None:
    """``start_forward``'s relay process: print the port it listens on (127.0.0.1), then relay
    each connection to ``address`` in ``namespace`` until killed. Each connection's thread
    enters the namespace (``setns`` acts on the calling thread only), so its upstream socket
    is the host's."""
    listener = socket.create_server(("127.0.0.1", 0))
    print(listener.getsockname()[1], flush=True)

    def pump(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def relay(client: socket.socket) -> None:
        with client:
            try:
                _enter_namespace(namespace)
                upstream = socket.create_connection(address, timeout=30)
            except OSError:
                return
            with upstream:
                upstream.settimeout(None)
                back = threading.Thread(target=pump, args=(upstream, client), daemon=True)
                back.start()
                pump(client, upstream)
                back.join()

    while True:
        client, _ = listener.accept()
        threading.Thread(target=relay, args=(client,), daemon=True).start()


def _enter_namespace(namespace: str) -> None:
    """Move the calling thread into network namespace ``namespace`` (``ip netns``'s name)."""
    clone_newnet = 0x40000000
    fd = os.open(f"/var/run/netns/{namespace}", os.O_RDONLY)
    try:
        if ctypes.CDLL(None, use_errno=True).setns(fd, clone_newnet) != 0:
            error = ctypes.get_errno()
            raise OSError(error, os.strerror(error))
    finally:
        os.close(fd)


def spark_home_of(python: str) -> Path:
    """The Spark distribution inside the PySpark of another interpreter (another venv)."""
    out = subprocess.run([python, "-c", "import pyspark; print(pyspark.__file__)"],
                         capture_output=True, text=True, check=True, timeout=120).stdout
    return Path(out.strip()).resolve().parent


class ClusterRun(ScenarioRun):
    """The cluster scenario's hosts, processes and files; ``run()`` (``ScenarioRun``'s) returns
    its ``ClusterResult``."""

    result: ClusterResult

    def __init__(self, scenario: ClusterScenario, workdir: Path, seed: int = 1) -> None:
        super().__init__(scenario.name, workdir)
        self.scenario = scenario
        self.seed = seed
        self.channels = scenario.channels
        self.faults = self.dir / "faults"
        self.faults.mkdir()
        self.cluster = Cluster(self.dir, self.store_path)
        self.hosts = self.cluster.hosts
        self.runner_log = self.dir / "driver.log"  # the driver's host runs the query
        self.result = ClusterResult(scenario.name)

    @property
    def workers(self) -> dict[str, subprocess.Popen[Any]]:
        return self.cluster.workers

    @property
    def master_url(self) -> str:
        return self.cluster.master_url

    def start_cluster(self) -> None:
        self.cluster.start()

    def start_query(self) -> None:
        conf = {**self.cluster.driver_conf(),
                **crash_spark_conf(self.faults),  # the crash points' hook in every worker
                "spark.executorEnv.TABLESTORE_CDC_LOG_LEVEL": "INFO"}
        args = ["--endpoint", self.cluster.endpoint, "--table", TABLE, "--tunnel", "cluster",
                "--checkpoint", str(self.dir / "checkpoint"), "--sink", str(self.sink.path),
                "--stop-file", str(self.dir / "stop"), "--trigger-ms", "300",
                "--master", self.master_url,
                "--option", f"instance.name={INSTANCE}", "--option", f"access.key.id={KEY_ID}",
                "--option", f"access.key.secret={SECRET}",
                "--option", f"checkpoint.table={META_TABLE}",
                "--option", "maxOffsetsPerChannel=100"]
        for key, value in conf.items():
            args += ["--conf", f"{key}={value}"]
        self.runner = self.hosts.popen(
            "driver", [sys.executable, "-m", "testkit.runner", *args],
            env={"PYSPARK_PYTHON": sys.executable, **crash_environment(self.faults)},
            log=self.runner_log, cwd=REPO)

    # --- steps ------------------------------------------------------------------------------

    def recovered_since(self, since: float) -> None:
        """Record how long after ``since`` every change written by then was delivered."""
        self.wait_all_delivered()
        self.result.recover_s.append(round(time.monotonic() - since, 1))

    def _held_worker(self, point: str) -> str:
        return self.cluster.held_worker(self.faults, point, self.runner)

    def kill_worker_mid_batch(self) -> None:
        arm_crash_point(self.faults, "mid_read", "park")
        name = self._held_worker("mid_read")
        log.info("%s: SIGKILL worker %s (a task parked at mid_read)", self.scenario.name, name)
        self.cluster.kill_worker(name)
        self.result.workers_killed += 1
        killed = time.monotonic()
        self.recovered_since(killed)  # the other worker reran the task
        self.cluster.start_worker(name)  # back, as a cluster manager would bring it

    def cut_worker_mid_read(self) -> None:
        # held between fetching its records and claiming its end: the claim (a meta-table
        # write) and the worker's next reads go out while it is cut off
        arm_crash_point(self.faults, "read_before_claim", "hold")
        name = self._held_worker("read_before_claim")
        log.info("%s: worker %s cut off from the service for %.0f s mid-read",
                 self.scenario.name, name, self.scenario.cut_s)
        self.hosts.cut(name, "svc")
        mark = _executor_log_size(self.dir / f"{name}-work")
        (self.faults / "release-read_before_claim").touch()
        self.result.workers_cut += 1
        time.sleep(self.scenario.cut_s)
        self.hosts.mend(name, "svc")
        mended = time.monotonic()
        self.recovered_since(mended)
        self.result.cut_read_failures += _executor_failures(self.dir / f"{name}-work", mark)

    def make_writer(self) -> Writer:
        return Writer(self.store_path, f"{self.seed}:{self.scenario.name}",
                      rate=self.scenario.write_rate)

    def execute(self, writer: Writer) -> None:
        s = self.scenario
        self.start_cluster()
        writer.start()
        self.start_query()
        before = self.watcher.poll()
        wait_until("the first batch in the sink", lambda: self.watcher.poll() > before,
                   timeout=STARTUP_TIMEOUT_S, process=self.runner)
        for _ in range(s.kill_worker):
            self.kill_worker_mid_batch()
        for _ in range(s.cut_worker):
            self.cut_worker_mid_read()
        time.sleep(s.tail_s)
        writer.finish()
        self.drain_and_stop()

    def cleanup_actions(self, writer: Writer) -> list[tuple[str, Callable[[], Any]]]:
        return [*super().cleanup_actions(writer), ("hosts", self.cluster.down)]

    def verify(self) -> None:
        r = self.result
        self.verify_delivery()
        r.executors_lost = _count(self.runner_log, "Lost executor")
        if r.workers_killed and r.executors_lost < r.workers_killed:
            r.problems.append(f"{r.workers_killed} worker(s) killed, but the driver lost "
                              f"{r.executors_lost} executor(s)")
        if r.workers_cut and r.cut_read_failures == 0:
            r.problems.append("the cut worker's executor logged no failed service call: the "
                              "cut hit no read")


def _count(path: Path, text: str) -> int:
    return path.read_text(errors="replace").count(text) if path.exists() else 0


def _executor_logs(work: Path) -> list[Path]:
    return sorted(work.glob("app-*/*/stderr"))


def _executor_log_size(work: Path) -> dict[Path, int]:
    return {p: p.stat().st_size for p in _executor_logs(work)}


def _executor_failures(work: Path, mark: dict[Path, int]) -> int:
    """Failed service calls the worker's executors logged since ``mark`` (the transport's
    retry warnings, and the retry layer's)."""
    failures = 0
    for path in _executor_logs(work):
        with open(path, "rb") as f:
            f.seek(mark.get(path, 0))
            text = f.read().decode(errors="replace")
        failures += sum(1 for line in text.splitlines()
                        if "failed (attempt" in line or "TransientTunnelError:" in line
                        or "TransientMetaStoreError:" in line)
    return failures


def run_cluster_scenario(scenario: ClusterScenario, workdir: Path, seed: int = 1,
                         keep: bool = False) -> ClusterResult:
    result = run_and_tidy(ClusterRun(scenario, workdir, seed), keep)
    assert isinstance(result, ClusterResult)
    return result

