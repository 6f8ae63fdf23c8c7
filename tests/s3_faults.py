"""A fault-injecting HTTP proxy on loopback in front of the S3 server (tests/s3_server.py).

Clients point ``AWS_ENDPOINT_URL`` at the proxy; it forwards every request to the moto
server unchanged (Host header included, so signatures and path-style addressing hold)
unless a ``Fault`` rule matches it first. A rule matches by HTTP method and a regular
expression over the path with its query string, and fires its next ``times`` matches:

- ``slowdown``: answer 503 with S3's ``SlowDown`` error (throttling);
- ``internal``: answer 500 with S3's ``InternalError``;
- ``reset``: read the request, then reset the connection (TCP RST, no answer);
- ``reset_body``: forward the request, send the answer's headers and half its body,
  then reset (a read that breaks off mid-object);
- ``vanish``: delete the object upstream first, then forward (an object deleted between
  the listing and the read).

``FaultProxy.fired`` lists ``(action, method, path)`` of every fault injected, so a test
can check that the faults it planted were met.
"""

from __future__ import annotations

import http.client
import re
import socket
import struct
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

ACTIONS = ("slowdown", "internal", "reset", "reset_body", "vanish")
_ERRORS = {
    "slowdown": (503, "SlowDown", "Please reduce your request rate."),
    "internal": (500, "InternalError", "We encountered an internal error. Please try again."),
}
_HOP_HEADERS = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "te", "trailer", "upgrade"}


@dataclass
class Fault:
    """Fire ``action`` on ``times`` requests of ``method`` whose path+query matches ``pattern``,
    once ``after`` of them went through."""

    action: str
    method: str  # a regular expression over the method: "PUT", "GET|HEAD"
    pattern: str
    times: int = 1
    after: int = 0  # let this many matching requests through first

    def __post_init__(self) -> None:
        assert self.action in ACTIONS, self.action
        self._re = re.compile(self.pattern)

    def matches(self, method: str, target: str) -> bool:
        return self.times > 0 and re.fullmatch(self.method, method) is not None and bool(self._re.search(target))


@dataclass
class FaultProxy:
    upstream: str  # http://host:port of the S3 server
    endpoint_url: str = ""
    faults: list[Fault] = field(default_factory=list)
    fired: list[tuple[str, str, str]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, *faults: Fault) -> None:
        with self._lock:
            self.faults.extend(faults)

    def clear(self) -> None:
        with self._lock:
            self.faults.clear()
            self.fired.clear()

    def take(self, method: str, target: str) -> Fault | None:
        """The rule that fires on this request (its count spent), or None."""
        with self._lock:
            for f in self.faults:
                if f.matches(method, target):
                    if f.after > 0:
                        f.after -= 1
                        return None
                    f.times -= 1
                    self.fired.append((f.action, method, target))
                    return f
        return None

    def fired_actions(self) -> list[str]:
        with self._lock:
            return [a for a, _, _ in self.fired]


def _handler(proxy: FaultProxy) -> type[BaseHTTPRequestHandler]:
    up = urlsplit(proxy.upstream)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as botocore's connection pool expects

        def log_message(self, *args) -> None:  # quiet
            pass

        def _body(self) -> bytes:
            if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                out = bytearray()
                while True:
                    size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                    if size == 0:
                        while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                            pass  # trailers
                        return bytes(out)
                    out += self.rfile.read(size)
                    self.rfile.readline()
            n = int(self.headers.get("Content-Length") or 0)
            return self.rfile.read(n) if n else b""

        def _reset(self) -> None:
            # SO_LINGER 0: close() sends a TCP RST, as a dropped connection does.
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.close_connection = True
            self.connection.close()

        def _upstream(self, method: str, body: bytes) -> tuple[int, str, list[tuple[str, str]], bytes]:
            conn = http.client.HTTPConnection(up.hostname, up.port, timeout=60)
            try:
                conn.putrequest(method, self.path, skip_host=True, skip_accept_encoding=True)
                for k, v in self.headers.items():
                    if k.lower() not in _HOP_HEADERS and k.lower() != "content-length":
                        conn.putheader(k, v)
                if body or method in ("PUT", "POST"):
                    conn.putheader("Content-Length", str(len(body)))
                conn.endheaders(body or None)
                resp = conn.getresponse()
                data = resp.read()
                return resp.status, resp.reason, resp.getheaders(), data
            finally:
                conn.close()

        def _proxy(self) -> None:
            method = self.command
            body = self._body()
            fault = proxy.take(method, self.path)
            if fault is not None and fault.action in _ERRORS:
                status, code, message = _ERRORS[fault.action]
                xml = (f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code>'
                       f"<Message>{message}</Message><RequestId>fault</RequestId></Error>").encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/xml")
                self.send_header("Content-Length", str(len(xml)))
                self.end_headers()
                if method != "HEAD":
                    self.wfile.write(xml)
                return
            if fault is not None and fault.action == "reset":
                self._reset()
                return
            if fault is not None and fault.action == "vanish":
                self._upstream("DELETE", b"")  # the object is gone before the read arrives
            status, reason, headers, data = self._upstream(method, body)
            self.send_response(status, reason)
            for k, v in headers:
                # A HEAD answer's Content-Length is the object's size: passed through as is.
                if k.lower() not in _HOP_HEADERS and (k.lower() != "content-length" or method == "HEAD"):
                    self.send_header(k, v)
            if method != "HEAD":
                self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if method == "HEAD":
                return
            if fault is not None and fault.action == "reset_body":
                self.wfile.write(data[: len(data) // 2])
                self.wfile.flush()
                self._reset()
                return
            self.wfile.write(data)

        do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _proxy

    return Handler


@contextmanager
def fault_proxy(upstream: str) -> Iterator[FaultProxy]:
    """A FaultProxy in front of ``upstream`` on 127.0.0.1 (a free port), for the ``with`` block."""
    proxy = FaultProxy(upstream)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(proxy))
    server.daemon_threads = True
    proxy.endpoint_url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, name="s3-fault-proxy", daemon=True)
    thread.start()
    try:
        yield proxy
    finally:
        server.shutdown()
        server.server_close()
