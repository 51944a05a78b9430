"""Addresses of kiln's services as clients give them: `host:port` or URLs, one or several
replicas comma-separated (as KILN_ADDR may list them), and the gRPC target that names them."""

from __future__ import annotations

from typing import Any

# The metadata of every call a client makes: its bearer token, (("authorization", "Bearer ..."),),
# as a tuple (what grpc's stubs take).
Metadata = tuple[tuple[str, str], ...]

# A gRPC channel's options, (name, value) pairs, as grpc.insecure_channel takes them.
ChannelOptions = list[tuple[str, Any]]


def _url(address: str) -> str:
    return address if "://" in address else f"http://{address}"


def _host(url: str) -> str:
    authority = url.split("://", 1)[-1].split("/", 1)[0]
    if authority.startswith("["):
        return authority[1:].split("]", 1)[0]
    return authority.rsplit(":", 1)[0] if ":" in authority else authority


def _is_loopback(host: str) -> bool:
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _target(address: str) -> str:
    return address.split("://", 1)[-1]


def _replicas(address: str) -> list[str]:
    """The URLs of an address that may list several replicas, comma-separated (as KILN_ADDR may)."""
    return [_url(one.strip()) for one in address.split(",") if one.strip()]


def _replica_target(urls: list[str], options: ChannelOptions) -> str:
    """One gRPC target naming every replica: their addresses resolved now, in the order given,
    under the `pick_first` policy, which connects to the first that answers and, when that
    connection is lost, to the next that does; so a client outlives the replica it talked to
    (a call in flight then fails UNAVAILABLE, and one retried with its idempotency key reaches
    the next). With TLS every replica's certificate must name the first one's host."""
    import socket

    families = set()
    addresses = []
    for url in urls:
        authority = url.split("://", 1)[-1].split("/", 1)[0]
        host = _host(url)
        port = authority.rsplit(":", 1)[-1] if not authority.endswith("]") and ":" in authority else (
            "443" if url.startswith("https://") else "80")
        try:
            family, _, _, _, sockaddr = socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)[0]
        except (OSError, ValueError) as error:
            raise RuntimeError(f"kiln: cannot resolve the replica {url}: {error}") from error
        families.add(family)
        # An AF_INET or AF_INET6 address (a stream socket's): (host, port[, flowinfo, scope_id]).
        ip, port_number = str(sockaddr[0]), int(sockaddr[1])
        addresses.append(f"[{ip}]:{port_number}" if family == socket.AF_INET6 else f"{ip}:{port_number}")
    if len(families) > 1:
        raise RuntimeError(f"kiln: the replicas {', '.join(urls)} mix IPv4 and IPv6 addresses; name them all by one family")
    options.append(("grpc.lb_policy_name", "pick_first"))
    # The :authority of every call is the first replica's (a target of several addresses has
    # none a server would take).
    options.append(("grpc.default_authority", _target(urls[0])))
    if urls[0].startswith("https://"):
        options.append(("grpc.ssl_target_name_override", _host(urls[0])))
    scheme = "ipv6" if families == {socket.AF_INET6} else "ipv4"
    return f"{scheme}:{','.join(addresses)}"
