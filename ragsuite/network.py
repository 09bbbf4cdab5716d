"""Where the servers ragsuite starts listen, and who holds a port.

A server listens on loopback unless the user asks for other machines with ``--allow-remote``. The decision is
made on the address ``--host`` resolves to, not on its spelling: ``0``, ``0.0``, ``::0`` and
``0:0:0:0:0:0:0:0`` all mean every interface, as ``0.0.0.0`` and ``::`` do.

Example:
    >>> listen_address("0.0", allow_remote=False)
    ListenAddress(bind='127.0.0.1', connect='127.0.0.1', remote=False, widened=True)
"""

from __future__ import annotations

import errno
import ipaddress
import os
import socket
from dataclasses import dataclass
from pathlib import Path

from ragsuite.errors import ConfigError, PortInUseError

LOOPBACK = "127.0.0.1"

Address = ipaddress.IPv4Address | ipaddress.IPv6Address


@dataclass(frozen=True)
class ListenAddress:
    """Where a server binds, the host clients on this machine put in its URL, and whether other machines
    can reach it.

    ``widened`` is true when ``--host`` asked for every interface and the server was kept on loopback
    because ``--allow-remote`` was not given.
    """

    bind: str
    connect: str
    remote: bool
    widened: bool = False


def resolve_host(host: str) -> list[Address]:
    """The addresses ``host`` resolves to (an empty host or ``*`` is every interface).

    Raises:
        ConfigError: ``host`` resolves to nothing.
    """
    text = host.strip().strip("[]")
    if text in ("", "*"):
        return [ipaddress.IPv4Address("0.0.0.0")]
    try:
        infos = socket.getaddrinfo(text, None, proto=socket.IPPROTO_TCP)
    except (socket.gaierror, UnicodeError):
        raise ConfigError(
            f"--host {host!r} resolves to no address; give an IP address or a host name"
        ) from None
    # A link-local IPv6 address carries its interface after "%", which ipaddress does not parse.
    return [ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in infos]


def listen_address(host: str, *, allow_remote: bool) -> ListenAddress:
    """Decide where a server for ``--host host`` listens.

    Without ``allow_remote`` a loopback host is kept, any spelling of every interface becomes loopback
    (``widened``), and any other address is refused. With it, the server binds what was asked and clients
    on this machine reach an every-interface server through loopback.

    Raises:
        ConfigError: a host other machines could reach, without ``allow_remote``; or one that does not
            resolve.
    """
    addresses = resolve_host(host)
    first = addresses[0]
    if all(address.is_loopback for address in addresses):
        return ListenAddress(bind=str(first), connect=str(first), remote=False)
    unspecified = next((address for address in addresses if address.is_unspecified), None)
    if not allow_remote:
        if unspecified is not None:
            return ListenAddress(bind=LOOPBACK, connect=LOOPBACK, remote=False, widened=True)
        raise ConfigError(
            f"--host {host} ({first}) is reachable from other machines; use a loopback address, or pass "
            "--allow-remote to serve them (the server then requires a key)"
        )
    if unspecified is not None:
        return ListenAddress(bind=str(unspecified), connect=client_host(str(unspecified)), remote=True)
    return ListenAddress(bind=str(first), connect=str(first), remote=True)


def client_host(bind: str) -> str:
    """The host a client on this machine connects to for a server bound to ``bind``: loopback for a server
    on every interface."""
    try:
        address = ipaddress.ip_address(bind.strip("[]"))
    except ValueError:
        return bind
    if not address.is_unspecified:
        return bind
    return "::1" if address.version == 6 else LOOPBACK


def url_host(host: str) -> str:
    """``host`` as it goes in a URL: an IPv6 address in brackets."""
    try:
        return f"[{host}]" if ipaddress.ip_address(host.strip("[]")).version == 6 else host
    except ValueError:
        return host


def port_in_use(host: str, port: int) -> bool:
    """Whether a server already listens on ``port`` where one bound to ``host`` would (a listener on every
    interface counts). Bound the way servers bind (``SO_REUSEADDR``), so closed connections do not count."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            return exc.errno == errno.EADDRINUSE
    return False


def _listening_inodes(port: int) -> set[str] | None:
    """Socket inodes listening on TCP ``port`` (Linux's ``/proc/net/tcp*``); None where there is no such
    table to read."""
    tables = [Path("/proc/net/tcp"), Path("/proc/net/tcp6")]
    if not any(table.is_file() for table in tables):
        return None
    inodes = set()
    for table in tables:
        try:
            lines = table.read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            # local address "HEXIP:HEXPORT", state 0A = LISTEN, inode in column 10
            if len(fields) > 9 and fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(fields[9])
    return inodes


def listening_pids(port: int) -> set[int] | None:
    """The processes (of those this user may inspect) that hold a socket listening on TCP ``port``: an empty
    set when the listener belongs to a process that cannot be inspected, or when none listens; None where
    this cannot be found out (no ``/proc``)."""
    inodes = _listening_inodes(port)
    if inodes is None:
        return None
    targets = {f"socket:[{inode}]" for inode in inodes}
    owners = set()
    for entry in Path("/proc").iterdir() if targets else ():
        if not entry.name.isdigit():
            continue
        try:
            descriptors = list((entry / "fd").iterdir())
        except OSError:  # another user's process, or one that just exited
            continue
        for descriptor in descriptors:
            try:
                if os.readlink(descriptor) in targets:
                    owners.add(int(entry.name))
                    break
            except OSError:
                continue
    return owners


def held_by(pids: set[int], process_id: int) -> bool:
    """Whether one of ``pids`` is ``process_id`` or in its process group (a server started in a session of
    its own leads the group its workers share)."""
    for pid in pids:
        try:
            if pid == process_id or os.getpgid(pid) == process_id:
                return True
        except OSError:
            continue
    return False


def port_taken_error(host: str, port: int) -> PortInUseError:
    """The one-line error for a port another process holds, naming that process where it can be found."""
    pids = listening_pids(port) or set()
    who = f"pid {', '.join(str(pid) for pid in sorted(pids))}" if pids else "pid unknown"
    return PortInUseError(
        f"port {port} on {host} is in use by another process ({who}); choose another --port or stop it"
    )


def check_port_free(host: str, port: int) -> None:
    """Raise :class:`PortInUseError` when a server already listens on ``port`` where one on ``host`` would."""
    if port_in_use(host, port):
        raise port_taken_error(host, port)


__all__ = [
    "LOOPBACK",
    "ListenAddress",
    "check_port_free",
    "client_host",
    "held_by",
    "listen_address",
    "listening_pids",
    "port_in_use",
    "port_taken_error",
    "resolve_host",
    "url_host",
]
