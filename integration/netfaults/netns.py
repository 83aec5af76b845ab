"""Test hosts on one machine: network namespaces on a private bridge, loopback-range addresses.

``Hosts({"svc": 10, "master": 20, "driver": 30, "w1": 41, "w2": 42}).up()`` makes, for a
unique tag:

- a namespace ``cdc<tag>-sw`` holding a bridge (the switch); nothing else lives there;
- per host a namespace ``cdc<tag>-<host>`` with a veth to the switch whose end carries the
  host's address ``127.42.0.<n>/24``. The addresses are in the loopback range, as the sandbox
  allows: each namespace has ``route_localnet`` on, its ``lo`` keeps only ``127.0.0.1/32`` and the
  kernel's catch-all ``local 127.0.0.0/8`` route is removed, so 127.42.0.x goes out through the
  veth to the other hosts instead of looping back. Every namespace's ``127.0.0.1`` is its own
  (Spark's and PySpark's local sockets stay inside their host).

The root namespace is not touched (no address, no route, no bridge there), and nothing is
reachable from outside these namespaces. ``down()`` kills what ``popen`` started and deletes the
namespaces (their veths go with them).

``cut(host, peer)`` / ``mend(host, peer)`` add and remove a blackhole route on ``host`` for
``peer``'s address: packets between the two vanish (a partition) while both stay up and reach
every other host.

Needs root and iproute2 (``ip netns``); ``unavailable()`` says why not, for a skip.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from testkit.processes import kill_tree

SUBNET = "127.42.0"


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check,
                          timeout=30)


def unavailable() -> str | None:
    """Why network namespaces cannot be made here, or None when they can."""
    if os.geteuid() != 0:
        return "needs root (ip netns add)"
    if shutil.which("ip") is None:
        return "iproute2's ip is not installed"
    probe = f"cdcprobe{uuid.uuid4().hex[:6]}"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"ip netns add failed: {made.stderr.strip()}"
    try:
        ns = ["ip", "netns", "exec", probe, "sh", "-c"]
        script = ("ip link set lo up && ip addr del 127.0.0.1/8 dev lo && "
                  "ip addr add 127.0.0.1/32 dev lo && "
                  "sysctl -qw net.ipv4.conf.all.route_localnet=1")
        done = subprocess.run([*ns, script], capture_output=True, text=True, timeout=30)
        if done.returncode != 0:
            return f"loopback-range addressing is refused here: {done.stderr.strip()}"
    finally:
        _ip("netns", "del", probe, check=False)
    return None


class Hosts:
    """Namespaced hosts on one bridge (module docstring)."""

    def __init__(self, hosts: Mapping[str, int]) -> None:
        self.tag = uuid.uuid4().hex[:5]
        self.hosts = dict(hosts)
        self.switch = f"cdc{self.tag}-sw"
        self.processes: list[subprocess.Popen[Any]] = []
        self._made: list[str] = []

    def ns(self, host: str) -> str:
        return f"cdc{self.tag}-{host}"

    def addr(self, host: str) -> str:
        return f"{SUBNET}.{self.hosts[host]}"

    def _exec(self, ns: str, script: str) -> None:
        done = subprocess.run(["ip", "netns", "exec", ns, "sh", "-ec", script],
                              capture_output=True, text=True, timeout=30)
        if done.returncode != 0:
            raise RuntimeError(f"in {ns}: {script!r} failed: {done.stderr.strip()}")

    def up(self) -> Hosts:
        try:
            _ip("netns", "add", self.switch)
            self._made.append(self.switch)
            # the switch has no address and its lo stays down: an up lo owns 127.0.0.0/8
            # there, and the switch would answer the hosts' ARP for each other's addresses
            self._exec(self.switch, "sysctl -qw net.ipv4.conf.all.route_localnet=0; "
                       "ip link add br0 type bridge; ip link set br0 up")
            for i, host in enumerate(self.hosts):
                ns, inner, outer = self.ns(host), f"c{self.tag}{i}h", f"c{self.tag}{i}s"
                _ip("netns", "add", ns)
                self._made.append(ns)
                _ip("link", "add", inner, "type", "veth", "peer", "name", outer)
                _ip("link", "set", inner, "netns", ns)
                _ip("link", "set", outer, "netns", self.switch)
                self._exec(self.switch, f"ip link set {outer} master br0; ip link set {outer} up")
                self._exec(ns, "\n".join([
                    "ip link set lo up",
                    "ip addr del 127.0.0.1/8 dev lo",
                    "ip addr add 127.0.0.1/32 dev lo",
                    "ip route del local 127.0.0.0/8 dev lo table local 2>/dev/null || true",
                    "sysctl -qw net.ipv4.conf.all.route_localnet=1",
                    f"sysctl -qw net.ipv4.conf.{inner}.route_localnet=1",
                    f"ip addr add {self.addr(host)}/24 dev {inner}",
                    f"ip link set {inner} up",
                ]))
        except BaseException:
            self.down()
            raise
        return self

    def popen(self, host: str, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
              log: Path | None = None, **kwargs: Any) -> subprocess.Popen[Any]:
        """Start ``argv`` inside ``host``'s namespace (tracked: ``down()`` kills it)."""
        out = open(log, "ab") if log is not None else subprocess.DEVNULL  # noqa: SIM115
        kwargs.setdefault("stdout", out)
        kwargs.setdefault("stderr", subprocess.STDOUT if log is not None else out)
        proc = subprocess.Popen(["ip", "netns", "exec", self.ns(host), *argv],
                                env={**os.environ, **(env or {})}, start_new_session=True,
                                **kwargs)
        self.processes.append(proc)
        return proc

    def cut(self, host: str, peer: str) -> None:
        """Packets from ``host`` to ``peer`` vanish (both stay up)."""
        self._exec(self.ns(host), f"ip route add blackhole {self.addr(peer)}/32")

    def mend(self, host: str, peer: str) -> None:
        self._exec(self.ns(host), f"ip route del blackhole {self.addr(peer)}/32")

    def down(self) -> None:
        for proc in self.processes:
            kill_tree(proc.pid)
        self.processes.clear()
        for ns in reversed(self._made):
            _ip("netns", "del", ns, check=False)
        self._made.clear()

    def __enter__(self) -> Hosts:
        return self.up()

    def __exit__(self, *exc: object) -> None:
        self.down()
