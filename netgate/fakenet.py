"""The servers of a fake internet, run as ``python -m netgate.fakenet CONFIG`` inside a namespace.

Used by the netgate integration tests and ``bench/netgate.py`` (through
``netgate.testing.FakeInternet``), never by the server. One Trio process
serves, per site address, HTTP on 80 and HTTPS on 443 (one certificate for
every site name, from the test's trustme CA), answers DNS on the configured
resolver addresses from a fixed table, and listens on extra TCP/UDP ports so
a test can show that traffic to them never arrives. Every request and every
DNS query is appended to a JSON-lines log (``log``) — headers included,
since the tests must see what arrived (the broker's secret among them).

Responses: ``GET /bytes/N`` streams N bytes (throughput); a path the site's
``pages`` name answers that document as text/html (the browser tests' pages);
any other path answers ``site=<identity> host=<Host> path=<path> auth=<yes|no>``.
"""

from __future__ import annotations

import json
import socket
import ssl
import sys
from pathlib import Path
from typing import Any

import trio

from netgate import dns
from netgate.sniff import HeadError, parse_request_head

CHUNK = b"x" * 65536


class Log:
    def __init__(self, path: str) -> None:
        self._fh = open(path, "a", buffering=1)  # noqa: SIM115 - lives as long as the process

    def write(self, **fields: Any) -> None:
        self._fh.write(json.dumps(fields) + "\n")


async def _read_head(stream: trio.abc.Stream) -> bytes | None:
    buf = bytearray()
    while b"\r\n\r\n" not in buf:
        if len(buf) > 65536:
            return None
        data = await stream.receive_some(65536)
        if not data:
            return None
        buf += data
    return bytes(buf[: buf.index(b"\r\n\r\n") + 4])


async def http_session(stream: trio.abc.Stream, site: dict[str, Any], scheme: str, log: Log) -> None:
    try:
        raw = await _read_head(stream)
        if raw is None:
            return
        try:
            head = parse_request_head(raw)
        except HeadError:
            await stream.send_all(b"HTTP/1.1 400 Bad Request\r\nConnection: close\r\n"
                                  b"Content-Length: 0\r\n\r\n")
            return
        headers = {k: v for k, v in head.headers}
        log.write(event="request", site=site["identity"], scheme=scheme, host=headers.get("host"),
                  path=head.target, headers=headers)
        if head.target.startswith("/bytes/") and head.target[7:].isdigit():
            n = int(head.target[7:])
            await stream.send_all(b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n"
                                  b"Connection: close\r\nContent-Length: " + str(n).encode() + b"\r\n\r\n")
            while n > 0:
                chunk = CHUNK[: min(n, len(CHUNK))]
                await stream.send_all(chunk)
                n -= len(chunk)
            return
        page = site.get("pages", {}).get(head.target.split("?", 1)[0])
        if isinstance(page, str):
            doc = page.encode()
            await stream.send_all(b"HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=utf-8\r\n"
                                  b"Connection: close\r\nContent-Length: " + str(len(doc)).encode()
                                  + b"\r\n\r\n" + doc)
            return
        body = (f"site={site['identity']} host={headers.get('host')} path={head.target} "
                f"auth={'yes' if 'authorization' in headers else 'no'}\n").encode()
        await stream.send_all(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nConnection: close\r\n"
                              b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    except (trio.BrokenResourceError, trio.ClosedResourceError, ssl.SSLError, OSError):
        return
    finally:
        await trio.aclose_forcefully(stream)


def _tcp_listener(address: str, port: int) -> trio.SocketListener:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((address, port))
    sock.listen(256)
    return trio.SocketListener(trio.socket.from_stdlib_socket(sock))


def _udp_socket(address: str, port: int) -> trio.socket.SocketType:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((address, port))
    return trio.socket.from_stdlib_socket(sock)


async def serve_dns(sock: trio.socket.SocketType, records: dict[str, list[str]], name: str, log: Log) -> None:
    while True:
        data, peer = await sock.recvfrom(4096)
        try:
            msg = dns.parse_message(data)
            q = msg.questions[0]
        except (dns.DnsFormatError, IndexError):
            continue
        log.write(event="dns", server=name, qname=q.name.lower(), qtype=dns.type_name(q.qtype))
        addrs = records.get(q.name.lower().rstrip("."))
        if addrs is None:
            reply = dns.build_reply(data, [], dns.RCODE_NXDOMAIN)
        else:
            want = 4 if q.qtype == dns.TYPE_A else 6 if q.qtype == dns.TYPE_AAAA else 0
            recs = []
            for a in addrs:
                packed = socket.inet_pton(socket.AF_INET6 if ":" in a else socket.AF_INET, a)
                if (len(packed) == 4 and want == 4) or (len(packed) == 16 and want == 6):
                    recs.append((q.qtype, 60, packed))
            reply = dns.build_reply(data, recs)
        await sock.sendto(reply, peer)


async def serve_udp_sink(sock: trio.socket.SocketType, address: str, port: int, log: Log) -> None:
    while True:
        data, peer = await sock.recvfrom(4096)
        log.write(event="udp", address=address, port=port, size=len(data))
        await sock.sendto(data, peer)


async def tcp_sink(stream: trio.SocketStream, address: str, port: int, log: Log) -> None:
    log.write(event="tcp", address=address, port=port)
    async with stream:
        await stream.send_all(b"hello from a port the guest must not reach\n")


async def main(config: dict[str, Any]) -> None:
    log = Log(config["log"])
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(config["cert_file"], config["key_file"])
    tls.set_alpn_protocols(["http/1.1"])
    async with trio.open_nursery() as nursery:
        for site in config["sites"]:
            http = _tcp_listener(site["address"], 80)
            https = _tcp_listener(site["address"], 443)

            async def on_http(stream: trio.SocketStream, site: dict[str, Any] = site) -> None:
                await http_session(stream, site, "http", log)

            async def on_https(stream: trio.SocketStream, site: dict[str, Any] = site) -> None:
                tls_stream = trio.SSLStream(stream, tls, server_side=True)
                try:
                    with trio.fail_after(10):
                        await tls_stream.do_handshake()
                except (trio.TooSlowError, trio.BrokenResourceError, ssl.SSLError, OSError):
                    await trio.aclose_forcefully(stream)
                    return
                await http_session(tls_stream, site, "https", log)

            nursery.start_soon(trio.serve_listeners, on_http, [http])
            nursery.start_soon(trio.serve_listeners, on_https, [https])
        for server in config["dns"]:
            sock = _udp_socket(server["address"], 53)
            nursery.start_soon(serve_dns, sock, config["records"], server["name"], log)
        for address, port in config.get("tcp_sinks", []):
            listener = _tcp_listener(address, port)

            async def on_tcp(stream: trio.SocketStream, address: str = address, port: int = port) -> None:
                await tcp_sink(stream, address, port, log)

            nursery.start_soon(trio.serve_listeners, on_tcp, [listener])
        for address, port in config.get("udp_sinks", []):
            nursery.start_soon(serve_udp_sink, _udp_socket(address, port), address, port, log)
        # Every socket above is bound: tell the parent (a tiny synchronous write, on purpose).
        Path(config["ready"]).write_text("ready\n")  # noqa: ASYNC240


if __name__ == "__main__":
    trio.run(main, json.loads(Path(sys.argv[1]).read_text()))
