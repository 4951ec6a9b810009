"""A network namespace joined to the host by one veth pair: the emulated board's own little network.

Only the two /30 addresses of the pair are used; the namespace has no route anywhere else. Optional
link shaping is a token bucket (tbf) on both ends (netem is not available in every kernel).
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from pathlib import Path

from quarl_edge.devices import hostsys
from quarl_edge.runtimes.errors import InputError

_RATE = re.compile(r"^(\d+(?:\.\d+)?)(bit|kbit|mbit|gbit|bps|kbps|mbps|gbps)$")
_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,14}$")


@dataclass(frozen=True)
class Link:
    namespace: str
    """Name of the network namespace (``ip netns``)."""
    host_if: str
    """veth end left in the host (15 characters at most)."""
    device_if: str
    """veth end moved into the namespace."""
    subnet: str
    """A /30: the first address is the host's, the second the device's."""

    def __post_init__(self) -> None:
        for n in (self.namespace, self.host_if, self.device_if):
            if not _NAME.fullmatch(n):
                raise InputError(f"interface/namespace name {n!r} is not valid", "use 1-15 of a-z, 0-9, -")
        net = ipaddress.ip_network(self.subnet)
        if net.prefixlen != 30 or net.version != 4:
            raise InputError(f"subnet {self.subnet!r} is not an IPv4 /30", "use e.g. 10.231.4.0/30")

    @property
    def host_address(self) -> str:
        return str(ipaddress.ip_network(self.subnet)[1])

    @property
    def device_address(self) -> str:
        return str(ipaddress.ip_network(self.subnet)[2])


def parse_rate(rate: str) -> str:
    """Validate a tc rate such as ``20mbit``; returns it lower-cased."""
    r = rate.strip().lower()
    m = _RATE.fullmatch(r)
    if not m or float(m.group(1)) <= 0:
        raise InputError(f"rate {rate!r} is not a tc rate", "use e.g. 20mbit, 512kbit or 1gbit")
    return r


def exists(link: Link) -> bool:
    return Path(f"/run/netns/{link.namespace}").exists()


def host_if_exists(link: Link) -> bool:
    return Path(f"/sys/class/net/{link.host_if}").exists()


def _check_free(link: Link) -> None:
    net = ipaddress.ip_network(link.subnet)
    proc = hostsys.run(["ip", "-o", "-4", "addr", "show"], step="ip addr")
    for line in proc.stdout.splitlines():
        parts = line.split()
        if "inet" in parts:
            iface = ipaddress.ip_interface(parts[parts.index("inet") + 1])
            if iface.network.overlaps(net) and parts[1].rstrip(":") != link.host_if:
                raise InputError(
                    f"subnet {link.subnet} is already used by {parts[1]} on this host",
                    "free it or choose another board subnet",
                )


def create(link: Link, *, rate: str | None = None, log: Path | None = None) -> None:
    """Namespace + veth pair + addresses (+ tbf); undone by :func:`destroy` on any failure."""
    _check_free(link)
    try:
        ip = ["ip"]
        ns = ["ip", "-n", link.namespace]
        hostsys.run([*ip, "netns", "add", link.namespace], log=log, step="ip netns add")
        hostsys.run(
            [
                *ip,
                "link",
                "add",
                link.host_if,
                "type",
                "veth",
                "peer",
                "name",
                link.device_if,
                "netns",
                link.namespace,
            ],
            log=log,
            step="ip link add veth",
        )
        hostsys.run(
            [*ip, "addr", "add", f"{link.host_address}/30", "dev", link.host_if], log=log, step="ip addr add"
        )
        hostsys.run([*ip, "link", "set", link.host_if, "up"], log=log, step="ip link set up")
        hostsys.run(
            [*ns, "addr", "add", f"{link.device_address}/30", "dev", link.device_if],
            log=log,
            step="ip addr add (ns)",
        )
        hostsys.run([*ns, "link", "set", link.device_if, "up"], log=log, step="ip link set up (ns)")
        hostsys.run([*ns, "link", "set", "lo", "up"], log=log, step="ip link set lo up (ns)")
        if rate:
            shape(link, rate, log=log)
    except BaseException:
        destroy(link, log=log)
        raise


def shape(link: Link, rate: str, *, log: Path | None = None) -> None:
    """A token bucket at ``rate`` on both directions of the pair."""
    rate = parse_rate(rate)
    tbf = ["tbf", "rate", rate, "burst", "32kbit", "latency", "400ms"]
    hostsys.run(
        ["tc", "qdisc", "replace", "dev", link.host_if, "root", *tbf], log=log, step="tc tbf (host side)"
    )
    hostsys.run(
        [
            "ip",
            "netns",
            "exec",
            link.namespace,
            "tc",
            "qdisc",
            "replace",
            "dev",
            link.device_if,
            "root",
            *tbf,
        ],
        log=log,
        step="tc tbf (device side)",
    )


def destroy(link: Link, *, log: Path | None = None) -> None:
    """Delete the veth pair (both ends go together) and the namespace; quiet when already gone."""
    if host_if_exists(link):
        hostsys.run(["ip", "link", "del", link.host_if], log=log, step="ip link del", check=False)
    if exists(link):
        hostsys.run(["ip", "netns", "del", link.namespace], log=log, step="ip netns del")
