"""Hosts on one machine: network namespaces joined by a bridge, for tests of what crosses a
network (tests/system/deploy/test_two_hosts.py).

Each ``Host`` is a network namespace with its own loopback and one interface, ``eth0``, on a
private LAN: a bridge in a namespace of its own, so no address or rule of the machine's own
network is touched. The test process joins the LAN through one more veth (the operator's
machine), so it can reach the services the hosts publish. A host may also see a directory
mounted at a path of its own (a mount namespace per process, as an NFS mount on each host
would be), so a shared store is reached by different paths on different hosts.

Cutting a host's link (``Lan.cut``) takes its switch port down: its open TCP connections
stall, as they do when a cable is pulled or a switch port dies, rather than being reset.

Addresses come from 198.18.0.0/15 (RFC 2544, set aside for test networks), one /24 per LAN
chosen so it overlaps no route the machine has; names carry a per-LAN suffix so parallel test
sessions never meet.
"""

from __future__ import annotations

import ipaddress
import os
import random
import shlex
import shutil
import subprocess
import uuid
from dataclasses import dataclass, field
from pathlib import Path


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    out = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and out.returncode:
        raise RuntimeError(f"ip {' '.join(args)} failed ({out.returncode}): {out.stderr.strip()}")
    return out


def supported() -> str | None:
    """Why hosts cannot be made here, or None when they can (root, iproute2, netns, veth)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None or shutil.which("unshare") is None:
        return "needs iproute2 (ip) and util-linux (unshare)"
    probe = f"vlprobe{uuid.uuid4().hex[:6]}"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode:
        return f"ip netns add failed: {made.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


def _free_subnet() -> ipaddress.IPv4Network:
    routes = _ip("-4", "route", "show", "table", "all").stdout.split("\n")
    taken = []
    for line in routes:
        word = line.split(" ", 1)[0]
        if word and word[0].isdigit():
            try:
                taken.append(ipaddress.ip_network(word, strict=False))
            except ValueError:
                pass
    candidates = list(ipaddress.ip_network("198.18.0.0/15").subnets(new_prefix=24))
    random.shuffle(candidates)
    for net in candidates:
        if not any(net.overlaps(t) for t in taken):
            return net
    raise RuntimeError("no free /24 in 198.18.0.0/15")


@dataclass
class Host:
    name: str
    netns: str
    address: str
    port: str  # the switch port's interface name, in the LAN namespace
    mounts: dict[Path, Path] = field(default_factory=dict)  # where this host sees it -> what

    def command(self, argv: list[str]) -> list[str]:
        """``argv`` as run on this host: in its network namespace and, when it mounts
        something, in a mount namespace of its own with those bind mounts."""
        wrapped = ["ip", "netns", "exec", self.netns]
        if not self.mounts:
            return wrapped + list(argv)
        binds = " && ".join(f"mount --bind {shlex.quote(str(src))} {shlex.quote(str(dst))}"
                            for dst, src in self.mounts.items())
        return wrapped + ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
                          f'{binds} && exec "$@"', "sh", *argv]

    def mount(self, source: Path, at: Path) -> None:
        at.mkdir(parents=True, exist_ok=True)
        self.mounts[at] = source

    def run(self, argv: list[str], **kwargs) -> subprocess.CompletedProcess:
        return subprocess.run(self.command(argv), **kwargs)

    def popen(self, argv: list[str], **kwargs) -> subprocess.Popen:
        return subprocess.Popen(self.command(argv), **kwargs)


class Lan:
    """A switch (a bridge in its own namespace) and the hosts plugged into it."""

    def __init__(self) -> None:
        self.suffix = uuid.uuid4().hex[:6]
        self.net = _free_subnet()
        self._addresses = iter(self.net.hosts())
        self.switch = f"vlsw{self.suffix}"
        self.hosts: dict[str, Host] = {}
        self._operator_if: str | None = None
        self._ports = 0
        self._namespaces: list[str] = []
        _ip("netns", "add", self.switch)
        _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.switch, "link", "set", "br0", "up")

    def _plug(self, peer_netns: str | None, peer_name: str) -> tuple[str, str]:
        """A veth whose one end is a switch port and whose other end is ``peer_name`` in
        ``peer_netns`` (None: the test process's own namespace), with the next address."""
        self._ports += 1
        port = f"p{self._ports}{self.suffix}"
        address = str(next(self._addresses))
        where = ["netns", peer_netns] if peer_netns else []
        _ip("link", "add", peer_name, *where, "type", "veth", "peer", "name", port, "netns", self.switch)
        _ip("-n", self.switch, "link", "set", port, "master", "br0", "up")
        ns = ["-n", peer_netns] if peer_netns else []
        _ip(*ns, "addr", "add", f"{address}/{self.net.prefixlen}", "dev", peer_name)
        _ip(*ns, "link", "set", peer_name, "up")
        return port, address

    def add_host(self, name: str) -> Host:
        netns = f"vl{name[:6]}{self.suffix}"
        _ip("netns", "add", netns)
        self._namespaces.append(netns)
        _ip("-n", netns, "link", "set", "lo", "up")
        port, address = self._plug(netns, "eth0")
        host = Host(name, netns, address, port)
        self.hosts[name] = host
        return host

    def join_operator(self) -> str:
        """Put the test process on the LAN (a veth in its own namespace); returns its address."""
        self._operator_if = f"vlop{self.suffix}"
        _, address = self._plug(None, self._operator_if)
        return address

    def cut(self, host: Host) -> None:
        _ip("-n", self.switch, "link", "set", host.port, "down")

    def restore(self, host: Host) -> None:
        _ip("-n", self.switch, "link", "set", host.port, "up")

    def close(self) -> None:
        for netns in self._namespaces:
            # Whatever still runs in a namespace would keep it (and its addresses) alive.
            for pid in _ip("netns", "pids", netns, check=False).stdout.split():
                try:
                    os.kill(int(pid), 9)
                except (ProcessLookupError, ValueError):
                    pass
            _ip("netns", "del", netns, check=False)
        if self._operator_if:
            _ip("link", "del", self._operator_if, check=False)
        _ip("netns", "del", self.switch, check=False)
