"""Where torchrun's two stores listen: only on the address the nodes use, never on every interface,
and the rendezvous store on a socket bound before its port was handed out.

c10d's TCPStore has no authentication, and by itself it listens on every interface: node 0's agent
hosts the rendezvous store (on the port every node is given) and the workers' store (on a port it
picks). In an agent, `install_from_environment` makes both listen on sockets bound here:
- the rendezvous store, on the socket the launcher bound and passed down (LISTEN_FD_ENV): the port
  was never free between its choice and its use, so another process cannot take it; without one
  (a launcher in another network, a cluster's batch script), on the endpoint's own address;
- the workers' store, on the agent's own address (torchrun's --local-addr), at a port the kernel picks.
A name that resolves only to a loopback address other than the endpoint's own (a host whose name
is 127.0.1.1), or an address this host does not have, cannot say which address the other nodes
use: there the store listens as c10d would, on every interface, and the network must keep others out
(docs/slurm.md, docs/kubernetes.md)."""

from __future__ import annotations

import errno
import ipaddress
import os
import socket

LISTEN_FD_ENV = "TRAINFLOW_RDZV_LISTEN_FD"  # the rendezvous store's listening socket, bound by the launcher
BACKLOG = 4096  # as c10d's own listen


def listening_socket(host: str, port: int = 0) -> socket.socket:
    """A TCP socket bound to host:port (0: the kernel picks a free one) and listening."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(BACKLOG)
    except BaseException:
        sock.close()
        raise
    return sock


def bind_address(host: str) -> str | None:
    """The address to listen on for a store the nodes reach at `host`; None where that cannot be told."""
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        pass
    try:
        found = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError:
        return None
    addresses = [info[4][0] for info in found]
    if not addresses:
        return None
    if host == "localhost":
        return addresses[0]
    routable = [a for a in addresses if not ipaddress.ip_address(a.split("%")[0]).is_loopback]
    routable.sort(key=lambda a: ":" in a)  # IPv4 first, as the nodes' own lookups (ahostsv4) find it
    return routable[0] if routable else None


def store_socket(host: str, port: int) -> socket.socket | None:
    """A listening socket for a store reached at host:port; None where c10d must listen itself."""
    address = bind_address(host)
    if address is None:
        return None
    try:
        return listening_socket(address, port)
    except OSError as exc:
        if exc.errno == errno.EADDRNOTAVAIL:  # an address of another host (or of another network namespace)
            return None
        raise


def install_from_environment() -> None:
    """In an agent: torchrun's stores listen on the sockets described above."""
    from datetime import timedelta

    from torch.distributed import TCPStore
    from torch.distributed.elastic.rendezvous import c10d_rendezvous_backend as backend
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous
    from torch.distributed.elastic.rendezvous.utils import parse_rendezvous_endpoint

    passed = os.environ.pop(LISTEN_FD_ENV, None)
    handed_over = [int(passed)] if passed else []
    create_rendezvous_store = backend._create_tcp_store

    def rendezvous_store(params):
        if not params.get_as_bool("is_host"):
            return create_rendezvous_store(params)
        host, port = parse_rendezvous_endpoint(params.endpoint, default_port=backend.DEFAULT_PORT)
        if handed_over:
            listener = socket.socket(fileno=handed_over.pop())
        else:
            try:
                listener = store_socket(host, port)
            except OSError as exc:  # the port was chosen elsewhere, and something here has taken it since
                raise backend.RendezvousConnectionError(
                    f"the rendezvous port {host}:{port} cannot be listened on: {exc}"
                ) from exc
            if listener is None:
                return create_rendezvous_store(params)
        timeout = timedelta(seconds=params.get_as_int("read_timeout", 60))
        with listener:  # the store listens on a duplicate of its own; this one closes here
            return TCPStore(
                host,
                port,
                is_master=True,
                multi_tenant=True,
                timeout=timeout,
                master_listen_fd=os.dup(listener.fileno()),
            )

    def workers_store(self, master_addr, master_port):
        listener = store_socket(master_addr, master_port)
        if listener is None:
            return create_workers_store(self, master_addr, master_port)
        with listener:
            port = listener.getsockname()[1]
            return TCPStore(
                host_name=master_addr,
                port=port,
                is_master=True,
                multi_tenant=True,
                master_listen_fd=os.dup(listener.fileno()),
            )

    handler = dynamic_rendezvous.DynamicRendezvousHandler
    create_workers_store = handler._create_tcp_store_server
    backend._create_tcp_store = rendezvous_store
    handler._create_tcp_store_server = workers_store
