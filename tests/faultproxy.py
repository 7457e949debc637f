"""A fault-injecting HTTP proxy on the loopback interface, in front of a test server (the moto S3
server), started and stopped by the tests themselves.

It forwards each request to the server unchanged and hands the answer back, except where its
*plan* says otherwise. A plan is a list of :class:`Rule` values: a rule matches requests by method,
a pattern searched in the path (with its query), and whether the request asks for a byte range;
it lets ``skip`` matching requests pass, then does its :class:`Fault` to the next ``times`` of them
(every later one when ``times`` is None). The first rule that matches a request and still has
faults to do decides what happens to it. The faults:

- ``answer(status, retry_after=…, forward=…, echo=…)``: a 503, 429, … of its own, without asking
  the server (``forward=True``: after the server did the request, as a gateway that gave up
  waiting would; ``echo=True``: its body repeats the request's headers, as some servers' error
  pages do, so that a test can check what reaches a message);
- ``cut(keep=…, reset=…)``: the server's status line and headers, then ``keep`` bytes of its
  body, then the connection closed (``reset=True``: with a TCP reset);
- ``drop(reset=…)``: the connection closed before anything is answered (the server never sees
  the request);
- ``lost_answer(…)``: the request *is* forwarded (the server does it), then the connection is
  closed without an answer, as when a connection breaks while the answer is on its way;
- ``slow(pause, pieces=…)``: the server's answer, its body sent in ``pieces`` pieces with a pause
  before each (a slow link; the answer is whole);
- ``short(keep)``: the server's answer with only ``keep`` bytes of its body and a Content-Length
  that says so (a server that answers a range with fewer bytes than asked, cleanly).

Everything the proxy saw is in :attr:`FaultProxy.seen`, one :class:`Seen` a request, so that a
test checks what was tried by counting requests, never by timing them. Nothing here reaches
beyond 127.0.0.1.
"""

from __future__ import annotations

import dataclasses
import http.client
import http.server
import os
import re
import socket
import socketserver
import struct
import threading
import time
import urllib.parse

__all__ = ["Fault", "FaultProxy", "Rule", "Seen", "answer", "cut", "drop", "lost_answer", "short", "slow"]

_HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer", "upgrade",
               "expect"}
_REASONS = {429: "Too Many Requests", 500: "Internal Server Error", 502: "Bad Gateway", 503: "Service Unavailable",
            504: "Gateway Timeout"}
_CODES = {429: "TooManyRequests", 503: "SlowDown"}


@dataclasses.dataclass(frozen=True)
class Fault:
    """What to do to a request (made by :func:`answer`, :func:`cut`, :func:`drop`,
    :func:`lost_answer`, :func:`slow`)."""

    kind: str  # "answer", "cut", "drop", "lost_answer", "slow", "short"
    status: int = 503
    retry_after: str | None = None
    forward: bool = False  # "answer": the server does the request first
    echo: bool = False  # "answer": the body repeats the request's headers
    keep: int | None = None  # "cut", "short": the bytes of the body sent (None: half of it)
    reset: bool = False  # "cut", "drop", "lost_answer": close with a TCP reset rather than a FIN
    pause: float = 0.0  # "slow": the pause before each piece
    pieces: int = 4


def answer(status: int = 503, retry_after: str | None = None, forward: bool = False, echo: bool = False) -> Fault:
    """An answer of the proxy's own (the server is not asked unless ``forward``), with
    ``Retry-After`` when given."""
    return Fault("answer", status=status, retry_after=retry_after, forward=forward, echo=echo)


def cut(keep: int | None = None, reset: bool = False) -> Fault:
    """The server's headers and ``keep`` bytes of its body (half when None), then the end."""
    return Fault("cut", keep=keep, reset=reset)


def drop(reset: bool = False) -> Fault:
    """The connection closed before the request is forwarded or answered."""
    return Fault("drop", reset=reset)


def lost_answer(reset: bool = False) -> Fault:
    """The request done by the server, its answer never delivered."""
    return Fault("lost_answer", reset=reset)


def slow(pause: float = 0.05, pieces: int = 4) -> Fault:
    """The server's answer, delivered in ``pieces`` pieces with ``pause`` seconds before each."""
    return Fault("slow", pause=pause, pieces=pieces)


def short(keep: int | None = None) -> Fault:
    """The server's answer cut to ``keep`` bytes of body (half when None), its length saying so."""
    return Fault("short", keep=keep)


@dataclasses.dataclass
class Rule:
    """Which requests get ``fault``: those of ``method`` (any when None) whose path and query
    ``path`` is found in (a regular expression; any when None), ranged or not (``ranged``: True for
    requests with a Range header, False for those without, None for both); ``skip`` of them pass
    first, then ``times`` of them get the fault (None: every one from then on)."""

    fault: Fault
    method: str | None = None
    path: str | None = None
    ranged: bool | None = None
    skip: int = 0
    times: int | None = 1
    matched: int = 0  # requests this rule matched so far
    done: int = 0  # faults it did

    def matches(self, method: str, target: str, ranged: bool) -> bool:
        return ((self.method is None or self.method == method)
                and (self.path is None or re.search(self.path, urllib.parse.unquote(target)) is not None)
                and (self.ranged is None or self.ranged == ranged))

    def take(self) -> bool:
        """Whether this matching request gets the fault (and counts it)."""
        self.matched += 1
        if self.matched <= self.skip or (self.times is not None and self.done >= self.times):
            return False
        self.done += 1
        return True


@dataclasses.dataclass(frozen=True)
class Seen:
    """One request the proxy received: its method, path (with query), whether it asked for a
    range, the fault done to it (None when forwarded untouched) and the status the client was
    sent (None when it was sent no answer)."""

    method: str
    path: str
    ranged: bool
    fault: str | None
    status: int | None


class FaultProxy:
    """The proxy: ``FaultProxy(upstream).start()``; :attr:`endpoint` is its URL; :meth:`plan` sets
    the rules (and forgets what was seen); :meth:`stop` ends it."""

    def __init__(self, upstream: str):
        parsed = urllib.parse.urlsplit(upstream)
        if parsed.hostname not in ("127.0.0.1", "localhost") or parsed.scheme != "http":
            raise ValueError(f"{upstream}: the proxy forwards only to a plain-HTTP server on the loopback interface")
        self.upstream = (parsed.hostname, parsed.port or 80)
        self.rules: list[Rule] = []
        self.seen: list[Seen] = []
        self._lock = threading.Lock()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def endpoint(self) -> str:
        assert self._server is not None, "the proxy is not started"
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> FaultProxy:
        self._server = _Server(("127.0.0.1", 0), _Handler, self)
        # A short poll: stop() waits for the serving loop to notice (half a second by default).
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.02},
                                        name="fault-proxy", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def plan(self, *rules: Rule) -> None:
        with self._lock:
            self.rules = list(rules)
            self.seen = []

    def count(self, method: str | None = None, path: str | None = None, fault: str | bool | None = True) -> int:
        """How many requests were seen of ``method`` whose path holds ``path`` (a regular
        expression), with ``fault`` (True: any fault or none; None: untouched; a kind: that)."""
        with self._lock:
            return sum(1 for s in self.seen
                       if (method is None or s.method == method)
                       and (path is None or re.search(path, urllib.parse.unquote(s.path)) is not None)
                       and (fault is True or s.fault == fault))

    def faults_done(self) -> int:
        with self._lock:
            return sum(rule.done for rule in self.rules)

    def _fault_for(self, method: str, target: str, ranged: bool) -> Fault | None:
        with self._lock:
            for rule in self.rules:
                if rule.matches(method, target, ranged) and rule.take():
                    return rule.fault
            return None

    def _saw(self, seen: Seen) -> None:
        with self._lock:
            self.seen.append(seen)


class _Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], handler: type, proxy: FaultProxy):
        self.proxy = proxy
        super().__init__(address, handler)

    def handle_error(self, request, client_address) -> None:  # a client that went away is no error
        pass


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # connections kept alive, as the client pools them
    server: _Server

    def setup(self) -> None:
        super().setup()
        self._upstream: http.client.HTTPConnection | None = None

    def finish(self) -> None:
        try:
            super().finish()
        except OSError:
            pass
        if self._upstream is not None:
            self._upstream.close()

    def log_message(self, format: str, *args) -> None:  # quiet
        pass

    def do_GET(self) -> None:
        self._serve()

    do_HEAD = do_PUT = do_POST = do_DELETE = do_PATCH = do_GET

    # -- one request -------------------------------------------------------------------------------

    def _serve(self) -> None:
        body = self._request_body()
        ranged = "range" in {name.lower() for name in self.headers}
        proxy = self.server.proxy
        fault = proxy._fault_for(self.command, self.path, ranged)
        kind = fault.kind if fault is not None else None

        def saw(status: int | None, what: str | None = kind) -> None:
            # Recorded before the client hears anything, so that a client that has its answer
            # finds its request counted.
            proxy._saw(Seen(self.command, self.path, ranged, what, status))

        if fault is not None and fault.kind == "answer" and not fault.forward:
            saw(fault.status)
            self._answer_own(fault)
            return
        if fault is not None and fault.kind == "drop":
            saw(None)
            self._close(fault.reset)
            return
        try:
            status, reason, headers, data = self._forward(body)
        except OSError:
            saw(None, "upstream-failed")
            self._close(reset=True)
            return
        if fault is not None and fault.kind == "lost_answer":
            saw(None)
            self._close(fault.reset)
            return
        if fault is not None and fault.kind == "answer":  # forwarded first
            saw(fault.status)
            self._answer_own(fault)
            return
        if fault is not None and fault.kind == "short":
            data = data[:len(data) // 2 if fault.keep is None else fault.keep]
        saw(status)
        self._send_head(status, reason, headers, len(data))
        if fault is not None and fault.kind == "cut":
            keep = len(data) // 2 if fault.keep is None else min(fault.keep, max(len(data) - 1, 0))
            self.wfile.write(data[:keep])
            self._close(fault.reset)
        elif self.command != "HEAD" and fault is not None and fault.kind == "slow":
            self._send_slowly(data, fault)
        elif self.command != "HEAD":
            self.wfile.write(data)

    def _request_body(self) -> bytes:
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            pieces = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(pieces)
                pieces.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _forward(self, body: bytes) -> tuple[int, str, list[tuple[str, str]], bytes]:
        for attempt in (0, 1):  # the server may have closed a kept-alive connection: one new try
            if self._upstream is None:
                self._upstream = http.client.HTTPConnection(*self.server.proxy.upstream, timeout=120)
            try:
                self._upstream.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
                for name, value in self.headers.items():
                    if name.lower() not in _HOP_BY_HOP and name.lower() != "content-length":
                        self._upstream.putheader(name, value)
                if body or self.command in ("PUT", "POST", "PATCH"):
                    self._upstream.putheader("Content-Length", str(len(body)))
                self._upstream.endheaders(body)
                response = self._upstream.getresponse()
                data = response.read()
            except (http.client.HTTPException, OSError):
                self._upstream.close()
                self._upstream = None
                if attempt:
                    raise OSError("the upstream server did not answer") from None
                continue
            headers = [(n, v) for n, v in response.getheaders() if n.lower() not in _HOP_BY_HOP]
            if response.will_close:
                self._upstream.close()
                self._upstream = None
            return response.status, response.reason, headers, data
        raise AssertionError("unreachable")

    def _send_head(self, status: int, reason: str, headers: list[tuple[str, str]], length: int) -> None:
        self.send_response_only(status, reason)
        for name, value in headers:
            if name.lower() != "content-length" or self.command == "HEAD":
                self.send_header(name, value)
        if self.command != "HEAD":
            self.send_header("Content-Length", str(length))
        self.end_headers()

    def _answer_own(self, fault: Fault) -> None:
        code = _CODES.get(fault.status, "InternalError")
        said = "".join(f" {name}: {value};" for name, value in self.headers.items()) if fault.echo else ""
        body = (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
                f"<Message>injected by the test proxy{said}</Message></Error>").encode()
        self.send_response_only(fault.status, _REASONS.get(fault.status, "Error"))
        self.send_header("Content-Type", "application/xml")
        if fault.retry_after is not None:
            self.send_header("Retry-After", fault.retry_after)
        self.send_header("Content-Length", str(len(body) if self.command != "HEAD" else 0))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _send_slowly(self, data: bytes, fault: Fault) -> None:
        step = max(1, -(-len(data) // max(fault.pieces, 1)))
        for start in range(0, max(len(data), 1), step):
            time.sleep(fault.pause)
            self.wfile.write(data[start:start + step])

    def _close(self, reset: bool) -> None:
        """Ends the client's connection at once: a FIN, or with ``reset`` a TCP reset (SO_LINGER 0).
        The descriptor is closed here, not when the handler's file objects let go of it."""
        sock = self.connection
        try:
            if reset:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            else:
                sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        os.close(sock.detach())
        self.close_connection = True
