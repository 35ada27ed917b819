"""An S3-compatible object store for the tests of training data read from ``s3://bucket/prefix``: moto's standalone
server in a process of its own, which the tests' clients and the processes they start (the launcher, Slurm's tasks)
reach over HTTP as they would a real store, behind a proxy of our own that does what a real store does under load
and moto cannot: 503 SlowDown bursts, transfers reset or cut short, stalled ones, a cap on bandwidth. The proxy
also records every request, so that a test can say what its clients asked for (ranges, retries, who asked).

The fixtures (``s3_server``, ``s3_store``) reach every test module as a pytest plugin (tests/conftest.py). boto3
and support.helpers are imported only when a test asks for a store: every pytest process loads this module."""
from __future__ import annotations

import functools
import http.client
import os
import re
import socket
import struct
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlsplit

import pytest

if TYPE_CHECKING:
    from boto3.session import Session
    from botocore.client import BaseClient

FAKE_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}  # moto takes any
REGION = "us-east-1"
START_BOUND_S = 60  # moto's server starts in about a second; a busy 2-core machine may take many more
UPSTREAM_BOUND_S = 60  # only a bound on a hung moto
CHUNK = 64 * 1024  # what the proxy reads and writes at a time
PACED_SLICE = 8 * 1024  # at most this much at a time where a rate applies


class S3Server:
    """moto's standalone server (``python -m moto.server``) in a process of its own, on a loopback port that the
    kernel picks (``-p 0``: no race for a free port) and the server's log names. Its objects, its temporary files and
    its log stay in ``workdir``. moto serves every AWS service on one port and picks the service of a request by the
    scope of its Authorization header (boto3's say s3), checking no signature: a request of a test's own that has
    none never reaches S3 (tests/unit/test_s3_support.py sends one that names s3)."""

    def __init__(self, workdir: Path) -> None:
        from support.helpers import wait_for

        self.log = workdir / "moto.log"
        env = {**os.environ, **FAKE_CREDENTIALS, "AWS_DEFAULT_REGION": REGION, "TMPDIR": str(workdir)}
        with open(self.log, "wb") as log:
            self._process = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", "0"],
                                             cwd=workdir, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                             stderr=subprocess.STDOUT)
        try:
            port = wait_for(self._port, START_BOUND_S, "port in moto's log", interval=0.05)
            self.endpoint = f"http://127.0.0.1:{port}"
            wait_for(self._answers, START_BOUND_S, f"answer from moto at {self.endpoint}", interval=0.05)
        except BaseException:
            self.stop()
            raise

    def _port(self) -> int | None:
        if self._process.poll() is not None:
            raise AssertionError(f"moto's server exited with {self._process.returncode}: {self.log.read_text()}")
        found = re.search(r"Running on http://127\.0\.0\.1:(\d+)", self.log.read_text(errors="replace"))
        return int(found.group(1)) if found else None

    def _answers(self) -> bool:
        try:
            return _status(self.endpoint, "GET", "/") == 200  # ListBuckets
        except OSError:
            return False

    def clear(self) -> None:
        """Forget every bucket and object (moto's own reset)."""
        assert _status(self.endpoint, "POST", "/moto-api/reset") == 200

    def stop(self) -> None:
        self._process.terminate()
        try:
            self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()


def _status(endpoint: str, method: str, path: str) -> int:
    connection = http.client.HTTPConnection(urlsplit(endpoint).netloc, timeout=10)
    try:
        connection.request(method, path)
        response = connection.getresponse()
        response.read()
        return response.status
    finally:
        connection.close()


@dataclass
class Record:
    """One request the proxy saw, as its client sent it, and what the proxy answered. ``status`` and ``sent`` are
    set before the bytes they count leave: a client that has read its whole answer finds them complete."""

    method: str
    path: str  # decoded, path-style: /bucket/key
    query: str
    range: str | None  # the Range header
    user_agent: str
    status: int | None = None  # None: nothing answered (the client or moto went away first)
    sent: int = 0  # bytes of the body written to the client
    fault: str | None = None  # the fault it met: fail, reset, truncate or trickle


@dataclass
class _Fault:
    kind: str
    left: int
    method: str | None
    match: str | None
    status: int = 503
    code: str = "SlowDown"
    rate: float = 0.0

    def applies(self, method: str, path: str, query: str) -> bool:
        if self.method is not None and method != self.method:
            return False
        if self.match is None:  # an object: /bucket/key
            return "/" in path.strip("/")
        return self.match in (f"{path}?{query}" if query else path)


class _Pace:
    """A rate that every sender through it shares: each gets the next free slot of time for its bytes, so that all
    together send at most ``rate`` bytes a second (a token bucket without a burst)."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self._next = time.monotonic()
        self._lock = threading.Lock()

    def due(self, size: int) -> float:
        """When ``size`` more bytes may have left (time.monotonic)."""
        with self._lock:
            self._next = max(self._next, time.monotonic()) + size / self.rate
            return self._next


class FaultProxy:
    """A reverse proxy on a loopback port in front of ``upstream`` that forwards each request as its client sent it
    (the Host header too: SigV4 signs it) and streams the answer back, except for the faults asked for. Its
    controls may be called from any thread while clients, of this process or others, use it; each fault applies to
    the next ``n`` requests of ``method`` (None: any) whose path (with ``?query``) contains ``match``, or that name
    an object (``/bucket/key``) when ``match`` is None."""

    def __init__(self, upstream: str) -> None:
        self.upstream = urlsplit(upstream).netloc
        self._lock = threading.Lock()
        self._faults: list[_Fault] = []
        self._records: list[Record] = []
        self._bandwidth: _Pace | None = None
        self._connections: set[socket.socket] = set()
        self._stopped = threading.Event()
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.proxy = self
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name=f"fault-proxy {self.endpoint}", daemon=True)
        self._thread.start()

    def fail(self, n: int, status: int = 503, code: str = "SlowDown", match: str | None = None,
             method: str | None = "GET") -> None:
        """Answer the next ``n`` requests with ``status`` and S3's XML error ``code``, without forwarding them."""
        self._add(_Fault("fail", n, method, match, status=status, code=code))

    def reset(self, n: int, match: str | None = None, method: str | None = "GET") -> None:
        """Send the next ``n`` answers' headers and half their body, then reset the connection (RST)."""
        self._add(_Fault("reset", n, method, match))

    def truncate(self, n: int, match: str | None = None, method: str | None = "GET") -> None:
        """Send the next ``n`` answers' headers (their full Content-Length) and half their body, then close the
        connection cleanly (FIN)."""
        self._add(_Fault("truncate", n, method, match))

    def trickle(self, n: int, bytes_per_s: float, match: str | None = None, method: str | None = "GET") -> None:
        """Send the next ``n`` answers' bodies at ``bytes_per_s``: a slow or stalled transfer (a few bytes a second:
        a client's read times out)."""
        if bytes_per_s <= 0:
            raise ValueError(f"a trickle of {bytes_per_s} bytes a second")
        self._add(_Fault("trickle", n, method, match, rate=bytes_per_s))

    def bandwidth(self, bytes_per_s: float | None) -> None:
        """Cap the bodies of GET answers, all connections together, at ``bytes_per_s`` (None: no cap), from the
        next answer on (one under way keeps the cap it began with)."""
        if bytes_per_s is not None and bytes_per_s <= 0:
            raise ValueError(f"a cap of {bytes_per_s} bytes a second")
        with self._lock:
            self._bandwidth = _Pace(bytes_per_s) if bytes_per_s is not None else None

    def requests(self) -> list[Record]:
        """Every request seen since the start or the last ``clear``, in the order they arrived."""
        with self._lock:
            return [replace(record) for record in self._records]

    def clear(self) -> None:
        """Forget the requests seen (not the faults still to come)."""
        with self._lock:
            self._records.clear()

    def calm(self) -> None:
        """Drop the faults still to come."""
        with self._lock:
            self._faults.clear()

    def stop(self) -> None:
        """Stop listening and close every client's connection."""
        self._stopped.set()
        self._server.shutdown()
        self._server.server_close()
        with self._lock:
            for connection in self._connections:
                try:
                    connection.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass  # closed meanwhile

    def _add(self, fault: _Fault) -> None:
        with self._lock:
            self._faults.append(fault)

    def _arrived(self, record: Record) -> _Fault | None:
        """Record a request; the fault it meets, if any (each fault taken by one request)."""
        with self._lock:
            self._records.append(record)
            fault = next((f for f in self._faults if f.applies(record.method, record.path, record.query)), None)
            if fault is not None:
                fault.left -= 1
                if fault.left <= 0:
                    self._faults.remove(fault)
                record.fault = fault.kind
            return fault

    def _paces(self, record: Record, fault: _Fault | None) -> list[_Pace]:
        paces = [_Pace(fault.rate)] if fault is not None and fault.kind == "trickle" else []
        with self._lock:
            if self._bandwidth is not None and record.method == "GET":
                paces.append(self._bandwidth)
        return paces

    def _opened(self, connection: socket.socket) -> None:
        with self._lock:
            self._connections.add(connection)

    def _closed(self, connection: socket.socket) -> None:
        with self._lock:
            self._connections.discard(connection)


class _Server(ThreadingHTTPServer):
    daemon_threads = True  # a stalled transfer must not hold up stop()
    request_queue_size = 64  # many tasks may connect at once
    proxy: FaultProxy


# Headers of one connection, not of the request: the proxy's own with each side. Transfer-Encoding is forwarded as
# sent (the body is forwarded as framed); an Expect: 100-continue is answered by the proxy itself.
HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "te", "upgrade", "expect"}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: botocore reuses its connections
    server: _Server

    def setup(self) -> None:
        super().setup()
        self.server.proxy._opened(self.connection)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.proxy._closed(self.connection)

    def handle(self) -> None:
        try:
            super().handle()
        except OSError:  # a client that reset its connection between requests (one that left a body unread)
            pass

    def log_message(self, format: str, *args) -> None:
        """Quiet: the proxy's records say what it saw."""

    def respond(self) -> None:
        path, _, query = self.path.partition("?")
        record = Record(self.command, unquote(path), query, self.headers.get("Range"),
                        self.headers.get("User-Agent", ""))
        fault = self.server.proxy._arrived(record)
        try:
            if fault is not None and fault.kind == "fail":
                for _ in self._body():
                    pass
                self._error(record, fault)
            else:
                self._forward(record, fault)
        except (OSError, http.client.HTTPException):  # the client went away, or moto did: neither can go on
            self.close_connection = True

    do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = respond

    def _body(self) -> Iterator[bytes]:
        """The request's body as its client framed it (Content-Length, or chunked as sent)."""
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            while True:
                line = self.rfile.readline(CHUNK)
                yield line
                size = int(line.split(b";")[0], 16)
                if size == 0:
                    break
                yield from self._read(size + 2)  # the chunk and its CRLF
            while line not in (b"\r\n", b"\n", b""):  # the trailer, to its empty line
                line = self.rfile.readline(CHUNK)
                yield line
        else:
            yield from self._read(int(self.headers.get("Content-Length", 0)))

    def _read(self, size: int) -> Iterator[bytes]:
        while size > 0:
            piece = self.rfile.read(min(size, CHUNK))
            if not piece:
                raise ConnectionError("the client closed the connection within a request's body")
            size -= len(piece)
            yield piece

    def _error(self, record: Record, fault: _Fault) -> None:
        message = "Please reduce your request rate." if fault.code == "SlowDown" else "Injected by the tests' proxy."
        body = (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{fault.code}</Code><Message>{message}'
                f"</Message><RequestId>{uuid.uuid4().hex}</RequestId></Error>").encode()
        record.status = fault.status
        self.send_response(fault.status)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            record.sent = len(body)
            self.wfile.write(body)

    def _forward(self, record: Record, fault: _Fault | None) -> None:
        upstream = http.client.HTTPConnection(self.server.proxy.upstream, timeout=UPSTREAM_BOUND_S)
        try:
            upstream.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
            for name, value in self.headers.items():
                if name.lower() not in HOP_BY_HOP:
                    upstream.putheader(name, value)
            upstream.putheader("Connection", "close")
            upstream.endheaders()
            for piece in self._body():
                upstream.send(piece)
            self._answer(record, upstream.getresponse(), fault)
        finally:
            upstream.close()

    def _answer(self, record: Record, response: http.client.HTTPResponse, fault: _Fault | None) -> None:
        """Stream moto's answer back, as the fault says. An answer without a length (none of moto's so far) goes to
        the client chunked, so that the connection stays open."""
        chunked = response.length is None  # http.client: neither a Content-Length nor an answer without a body
        record.status = response.status
        self.send_response_only(response.status, response.reason)
        for name, value in response.getheaders():
            if name.lower() not in HOP_BY_HOP | {"transfer-encoding"}:
                self.send_header(name, value)
        if chunked:
            self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        cut = fault is not None and fault.kind in ("reset", "truncate")
        self._send(record, _pieces(response, (response.length or 0) // 2 if cut else None),
                   self.server.proxy._paces(record, fault), chunked)
        if not cut:
            if chunked:
                self.wfile.write(b"0\r\n\r\n")
        elif fault.kind == "reset":
            self._reset()
        else:
            self.close_connection = True  # a clean close (FIN) once the handler returns

    def _send(self, record: Record, pieces: Iterable[bytes], paces: list[_Pace], chunked: bool) -> None:
        stopped = self.server.proxy._stopped
        size = max(1, min([PACED_SLICE, *(int(pace.rate / 10) for pace in paces)])) if paces else CHUNK
        for piece in pieces:
            for start in range(0, len(piece), size):
                part = piece[start:start + size]
                if paces:
                    due = max(pace.due(len(part)) for pace in paces)
                    while not stopped.is_set() and (delay := due - time.monotonic()) > 0:
                        stopped.wait(delay)
                record.sent += len(part)
                self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part) if chunked else part)

    def _reset(self) -> None:
        """Close the connection now with a reset (SO_LINGER 0), not the clean close that would follow."""
        self.close_connection = True
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.rfile.close()  # the socket's file holds it open
        self.connection.close()


def _pieces(response: http.client.HTTPResponse, limit: int | None) -> Iterator[bytes]:
    """The response's body as it comes, or its first ``limit`` bytes."""
    left = limit
    while left is None or left > 0:
        piece = response.read(CHUNK if left is None else min(CHUNK, left))
        if not piece:
            return
        if left is not None:
            left -= len(piece)
        yield piece


_SESSION_LOCK = threading.Lock()  # a boto3 session is not thread-safe; its clients are


@functools.cache
def _session() -> Session:
    """One session for the suite's clients (a fresh one loads S3's model again: 65 ms of CPU a client, not 3). Made
    under the store's environment (``s3_store``), so it reads no configuration of the developer's."""
    import boto3

    return boto3.session.Session()


def s3_client(endpoint: str, **config) -> BaseClient:
    """A boto3 S3 client of ``endpoint`` with the store's fake credentials, path-style addressing and standard
    retries (3 attempts); ``config``: botocore Config's arguments over those (``retries={"mode": "standard",
    "total_max_attempts": 1}``: no retry; ``max_attempts`` there counts the retries, not the attempts)."""
    from botocore.config import Config

    settings = {"s3": {"addressing_style": "path"}, "retries": {"mode": "standard"}, **config}
    with _SESSION_LOCK:
            return _session().client("s3", endpoint_url=endpoint, region_name=REGION,
                                 aws_access_key_id=FAKE_CREDENTIALS["AWS_ACCESS_KEY_ID"],
                                 aws_secret_access_key=FAKE_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
                                 config=Config(**settings))


@dataclass(frozen=True)
class S3Store:
    """A test's store: a fresh bucket on moto's server, reached through a FaultProxy of the test's own."""

    endpoint: str  # the proxy's: what clients use
    proxy: FaultProxy
    server_endpoint: str  # moto's own, past the proxy
    bucket: str
    env: dict[str, str]  # what a client process needs (s3_store sets it in the test's own environment too)

    def client(self, **config) -> BaseClient:
        """A boto3 client through the proxy (``config`` as for ``s3_client``)."""
        return s3_client(self.endpoint, **config)


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory) -> Iterator[S3Server]:
    """moto's server, started the first time a test of this process (a pytest-xdist worker) asks for it."""
    server = S3Server(tmp_path_factory.mktemp("s3-server"))
    yield server
    server.stop()


@pytest.fixture
def s3_store(s3_server, tmp_path, monkeypatch) -> Iterator[S3Store]:
    """A fresh bucket behind a proxy of the test's own, with the environment a client needs set in the test's own
    process (what it starts inherits it) in place of every AWS_ variable of the developer's: no profile, config
    file or credentials of theirs is read. The proxy stops after the test, and moto forgets every object."""
    proxy = FaultProxy(s3_server.endpoint)
    nowhere = tmp_path / "no-aws"  # never made
    env = {"AWS_ENDPOINT_URL": proxy.endpoint, **FAKE_CREDENTIALS, "AWS_DEFAULT_REGION": REGION,
           "AWS_CONFIG_FILE": str(nowhere / "config"), "AWS_SHARED_CREDENTIALS_FILE": str(nowhere / "credentials"),
           "AWS_EC2_METADATA_DISABLED": "true"}  # a client left without credentials fails at once, not in seconds
    for name in [name for name in os.environ if name.startswith("AWS_")]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    bucket = f"test-{uuid.uuid4().hex[:16]}"
    s3_client(s3_server.endpoint).create_bucket(Bucket=bucket)  # past the proxy: its records start empty
    try:
        yield S3Store(proxy.endpoint, proxy, s3_server.endpoint, bucket, env)
    finally:
        proxy.stop()
        s3_server.clear()
