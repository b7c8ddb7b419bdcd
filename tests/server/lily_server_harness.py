# Test harness for `lily serve`: tiny checkpoint, server process with log capture, raw HTTP/1.1 client.
"""Stdlib-only helpers shared by the raw-HTTP server tests.

* `Checkpoint` writes a tiny synthetic checkpoint (`lily make-checkpoint --profile tiny`) into
  a temporary directory that is removed again by `cleanup()`.
* `LilyServer` starts `lily serve --bind 127.0.0.1:0 ...`, reads its stderr on a thread
  (every line is kept, for assertions on the request log), parses the port from the
  `listening on http://127.0.0.1:PORT` line and waits for `serving ... on`.
* `RawConnection` speaks HTTP/1.1 over a plain socket: it sends exactly the bytes a test gives
  it and parses responses itself (status line, headers, Content-Length or chunked body,
  interim 1xx), so malformed, pipelined and half-sent requests can be tested.
* `EventStream` reads a `text/event-stream` response (openai mode's `stream: true`) one HTTP
  chunk and one `data: ...` event at a time, keeping every raw byte for assertions.
* `LilyServer(..., strict=True)` runs `lily serve --strict` (Lily's contract exactly); the
  default is the server's default, openai mode.
* Some tests build on facts of the tiny seed-1 checkpoint's greedy answers (a prompt that stops
  within 4 tokens, one that runs for ~1,100), found with the GCC build's CPU kernels. Other
  arithmetic (clang's vectorised sums) can change them: LILY_TEST_NUMERICS=<name>
  (tools/tsan.sh sets it) makes such a test check its fact and skip, visibly, where it fails.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import signal
import socket
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field

SERVED_MODEL = "Qwen3.6-35B-A3B"
CHAT_PATH = "/v1/chat/completions"


class ConnectionClosed(Exception):
    """The peer closed the connection (EOF) before a complete response arrived."""


class ConnectionReset(Exception):
    """The peer reset the connection (RST) before a complete response arrived."""


@dataclass
class Response:
    status: int
    reason: str
    version: str  # "HTTP/1.1"
    headers: list[tuple[str, str]]
    body: bytes
    raw_head: bytes = b""
    interim: list[int] = field(default_factory=list)  # 1xx statuses seen before this one

    def header(self, name: str) -> str | None:
        values = [v for k, v in self.headers if k.lower() == name.lower()]
        return values[-1] if values else None

    def header_count(self, name: str) -> int:
        return sum(1 for k, _ in self.headers if k.lower() == name.lower())

    def json(self):
        # Strict: the body must be valid UTF-8 and strict JSON (no NaN/Infinity constants).
        text = self.body.decode("utf-8", errors="strict")

        def refuse_constant(name):
            raise ValueError(f"non-standard JSON constant {name}")

        return json.loads(text, parse_constant=refuse_constant)


class RawConnection:
    """One TCP connection to the server. All reads honour `timeout` seconds."""

    def __init__(self, port: int, timeout: float = 30.0, host: str = "127.0.0.1"):
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.timeout = timeout
        self.buffer = b""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass

    def send(self, data: bytes):
        self.sock.sendall(data)

    def settimeout(self, timeout: float):
        self.timeout = timeout
        self.sock.settimeout(timeout)

    def _fill(self) -> bool:
        """Reads more bytes into the buffer; False on EOF. Raises ConnectionReset on RST."""
        try:
            chunk = self.sock.recv(65536)
        except ConnectionResetError as e:
            raise ConnectionReset(str(e)) from e
        if not chunk:
            return False
        self.buffer += chunk
        return True

    def _read_until(self, marker: bytes, limit: int = 1 << 20) -> bytes:
        while marker not in self.buffer:
            if len(self.buffer) > limit:
                raise AssertionError(f"no {marker!r} within {limit} bytes")
            if not self._fill():
                raise ConnectionClosed(f"EOF while waiting for {marker!r}; have {self.buffer!r}")
        index = self.buffer.index(marker) + len(marker)
        data, self.buffer = self.buffer[:index], self.buffer[index:]
        return data

    def _read_exact(self, n: int) -> bytes:
        while len(self.buffer) < n:
            if not self._fill():
                raise ConnectionClosed(f"EOF after {len(self.buffer)} of {n} body bytes")
        data, self.buffer = self.buffer[:n], self.buffer[n:]
        return data

    def read_head(self) -> Response:
        """Reads the head of one final response (skipping and recording interim 1xx ones);
        the body is left in the connection."""
        interim = []
        while True:
            head = self._read_until(b"\r\n\r\n")
            lines = head[:-4].split(b"\r\n")
            status_line = lines[0].decode("latin-1")
            match = re.fullmatch(r"(HTTP/\d\.\d) (\d{3}) ?(.*)", status_line)
            if not match:
                raise AssertionError(f"bad status line {status_line!r}")
            version, status, reason = match.group(1), int(match.group(2)), match.group(3)
            headers = []
            for line in lines[1:]:
                name, sep, value = line.decode("latin-1").partition(":")
                if not sep:
                    raise AssertionError(f"bad header line {line!r}")
                headers.append((name.strip(), value.strip()))
            if 100 <= status < 200:
                interim.append(status)
                continue
            return Response(status, reason, version, headers, b"", head, interim)

    def read_chunk(self) -> bytes | None:
        """One chunk of a chunked body: its data, or None for the last (zero-size) chunk."""
        size_line = self._read_until(b"\r\n")
        size = int(size_line.split(b";")[0].strip(), 16)
        if size == 0:
            self._read_until(b"\r\n")  # no trailers expected
            return None
        data = self._read_exact(size)
        if self._read_exact(2) != b"\r\n":
            raise AssertionError(f"chunk of {size} bytes not followed by CRLF")
        return data

    def read_response(self, head_request: bool = False,
                      content_type: str = "application/json") -> Response:
        """Reads one final response (skipping and recording interim 1xx responses)."""
        response = self.read_head()
        head, status = response.raw_head, response.status
        # Every final response of this server that is not a stream is JSON (docs/api.md: "All
        # JSON bodies are compact UTF-8"), errors included, but for /metrics' 200 (Prometheus
        # text, `content_type` given): checked here so that no test can forget it. Streams are
        # read with EventStream.
        if response.header_count("Content-Type") != 1 or \
                response.header("Content-Type") != content_type:
            raise AssertionError(f"response without exactly one Content-Type: {content_type}: "
                                 f"{head!r}")
        if head_request or status in (204, 304):
            return response
        length = response.header("Content-Length")
        if (response.header("Transfer-Encoding") or "").lower() == "chunked":
            body = b""
            while True:
                chunk = self.read_chunk()
                if chunk is None:
                    break
                body += chunk
            response.body = body
        elif length is not None:
            response.body = self._read_exact(int(length))
        else:  # read until close
            while self._fill():
                pass
            response.body, self.buffer = self.buffer, b""
        return response

    def wait_closed(self, timeout: float) -> bytes:
        """Waits until the peer closes; returns any bytes received meanwhile (b"" if none).
        Raises AssertionError if the connection is still open after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        received = self.buffer
        self.buffer = b""
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(
                    f"connection still open after {timeout}s (received {received!r})")
            self.sock.settimeout(remaining)
            try:
                chunk = self.sock.recv(65536)
            except socket.timeout:
                continue
            except ConnectionResetError:
                return received
            finally:
                self.sock.settimeout(self.timeout)
            if not chunk:
                return received
            received += chunk


class EventStream:
    """A server-sent-events response read from a RawConnection whose head has been read.

    The body must be chunked (HTTP/1.1) and consist only of `data: <payload>\n\n` events (no
    comments, no other fields, no CR). `next_event()` returns one payload at a time (bytes),
    None after the last chunk; `chunks` keeps every HTTP chunk as received and `events` every
    payload so far."""

    EVENT = re.compile(rb"data: ([^\n]*)\n\n")

    def __init__(self, conn: RawConnection, response: Response):
        if response.header("Content-Type") != "text/event-stream" or \
                response.header_count("Content-Type") != 1:
            raise AssertionError(f"not exactly one Content-Type: text/event-stream: "
                                 f"{response.raw_head!r}")
        if (response.header("Transfer-Encoding") or "").lower() != "chunked" or \
                response.header("Content-Length") is not None:
            raise AssertionError(f"a stream must be chunked without Content-Length: "
                                 f"{response.raw_head!r}")
        self.conn = conn
        self.response = response
        self.pending = b""
        self.chunks: list[bytes] = []
        self.events: list[bytes] = []
        self.ended = False

    def next_event(self) -> bytes | None:
        while True:
            match = self.EVENT.match(self.pending)
            if match:
                self.pending = self.pending[match.end():]
                self.events.append(match.group(1))
                return match.group(1)
            if self.pending and not b"data: ".startswith(self.pending[:6]):
                raise AssertionError(f"not an SSE data event: {self.pending[:200]!r}")
            if self.ended:
                if self.pending:
                    raise AssertionError(f"stream ended inside an event: {self.pending!r}")
                return None
            chunk = self.conn.read_chunk()
            if chunk is None:
                self.ended = True
                continue
            self.chunks.append(chunk)
            self.pending += chunk

    def read_all(self) -> list[bytes]:
        """Every remaining event payload, up to the end of the body."""
        out = []
        while (event := self.next_event()) is not None:
            out.append(event)
        return out


def request_bytes(method: str, path: str, body: bytes | str | None = None,
                  headers: list[tuple[str, str]] | None = None, version: str = "HTTP/1.1",
                  content_type: str | None = "application/json",
                  content_length: bool = True) -> bytes:
    """An HTTP request as bytes. `Host` is always added first; `Content-Type` (unless None)
    and `Content-Length` (when there is a body) are added after the given headers."""
    if isinstance(body, str):
        body = body.encode("utf-8")
    lines = [f"{method} {path} {version}", "Host: 127.0.0.1"]
    for name, value in headers or []:
        lines.append(f"{name}: {value}")
    if body is not None:
        if content_type is not None:
            lines.append(f"Content-Type: {content_type}")
        if content_length:
            lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (body or b"")


def chat_body(content: str = "Hello", max_tokens: int | None = 8, **extra) -> bytes:
    request = {"model": SERVED_MODEL, "messages": [{"role": "user", "content": content}]}
    if max_tokens is not None:
        request["max_tokens"] = max_tokens
    request.update(extra)
    return json.dumps(request).encode("utf-8")


def rust_debug_quote(text: str) -> str:
    """Rust's `{:?}` of a string, for the characters our messages contain."""
    out = ['"']
    for ch in text:
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\r":
            out.append("\\r")
        elif ch == "\t":
            out.append("\\t")
        elif ch == "\0":
            out.append("\\0")
        elif ord(ch) < 0x20 or ord(ch) == 0x7F or 0x80 <= ord(ch) < 0xA0:
            out.append("\\u{%x}" % ord(ch))
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def long_text(words: int, seed: int = 7) -> str:
    """Deterministic varied English-like text of `words` words (a long prompt for tests that
    need a request to run for seconds)."""
    import random

    vocabulary = (
        "the a river mountain quickly slowly analysis budget seventeen purple library "
        "engine whisper market orbit cathedral gradient lantern harvest protocol ember "
        "violin glacier archive syntax copper meadow theorem voyage canyon puzzle "
        "signal harbor thunder velvet compass pilgrim quartz saffron meridian falcon "
        "ledger tundra mosaic beacon orchard cipher lagoon tapestry nebula bramble "
        "is was runs builds carries measures explains forgets remembers paints sings "
        "under over between beyond within across toward despite because although "
        "1984 42 3.14 2,048 #7 (note) [draft] {x} café naïve über Ωmega 東京 ñandú"
    ).split()
    rng = random.Random(seed)
    out = []
    for i in range(words):
        word = rng.choice(vocabulary)
        if i % 13 == 12:
            word += "."
        elif i % 7 == 6:
            word += ","
        out.append(word)
    return " ".join(out)


class Checkpoint:
    """A tiny synthetic checkpoint in a temporary directory, or, when LILY_TEST_MODEL names a
    checkpoint directory (tools/gpu/run.sh: the full synthetic one), that one, untouched."""

    def __init__(self, lily: str, seed: int = 1):
        given = os.environ.get("LILY_TEST_MODEL")
        if given and seed == 1:
            self._tmp = None
            self.path = given
            return
        self._tmp = tempfile.TemporaryDirectory(prefix="lily-http-ckpt-")
        self.path = os.path.join(self._tmp.name, "tiny")
        result = subprocess.run(
            [lily, "make-checkpoint", "--profile", "tiny", "--seed", str(seed), "--out", self.path],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=120)
        if result.returncode != 0:
            self._tmp.cleanup()
            raise RuntimeError(f"make-checkpoint failed ({result.returncode}): "
                               f"{result.stderr.decode(errors='replace')}")

    def cleanup(self):
        if self._tmp is not None:
            self._tmp.cleanup()


# Servers not stopped yet: killed at interpreter exit so that a crashed test leaves no process.
_live_servers: set = set()


@atexit.register
def _kill_leftover_servers():
    for server in list(_live_servers):
        if server.proc is not None and server.proc.poll() is None:
            server.proc.kill()


LISTENING = re.compile(r"^listening on http://127\.0\.0\.1:(\d+) ")
SERVING = re.compile(r"^serving " + re.escape(SERVED_MODEL) + r" on http://127\.0\.0\.1:(\d+) ")


class LilyServer:
    """A `lily serve` process bound to 127.0.0.1:0. Its stderr lines are collected in
    `self.lines` (guarded by `self.cond`)."""

    def __init__(self, lily: str, model: str, *args: str, bind: str = "127.0.0.1:0",
                 env: dict[str, str] | None = None, strict: bool = False):
        self.lily = lily
        # LILY_SERVE_EXTRA_ARGS (e.g. "--device cuda" on the GPU machine) goes to every server.
        extra = os.environ.get("LILY_SERVE_EXTRA_ARGS", "").split()
        if "cuda" in extra:  # --threads is the CPU backend's (lily serve refuses it with cuda)
            kept: list[str] = []
            skip = False
            for arg in args:
                if skip:
                    skip = False
                elif arg == "--threads":
                    skip = True
                else:
                    kept.append(arg)
            args = tuple(kept)
        self.argv = [lily, "serve", "--model", model, "--bind", bind, *extra, *args]
        self.strict = strict or "--strict" in args
        if strict:  # Lily's contract exactly (unknown fields refused, no streaming, greedy)
            self.argv.append("--strict")
        self.env = env
        self.lines: list[str] = []
        self.cond = threading.Condition()
        self.eof = False
        self.port: int | None = None
        self.proc: subprocess.Popen | None = None
        self._reader: threading.Thread | None = None
        self._sync = 0

    # --- process
    def start(self, wait_ready: bool = True, timeout: float = 60.0) -> "LilyServer":
        environment = None
        if self.env is not None:
            environment = dict(os.environ)
            environment.update(self.env)
        self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, env=environment,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        _live_servers.add(self)
        self._reader = threading.Thread(target=self._read_stderr, daemon=True)
        self._reader.start()
        if wait_ready:
            match = self.wait_line(LISTENING, timeout=timeout)
            self.port = int(match.group(1))
            ready = self.wait_line(SERVING, timeout=timeout)
            assert int(ready.group(1)) == self.port, self.log_text()
            # The serving line names the API mode: a test of one mode never runs against the
            # other by accident.
            mode = "strict" if self.strict else "openai"
            assert f", {mode} API, " in ready.string, (mode, ready.string)
        return self

    def _read_stderr(self):
        assert self.proc is not None and self.proc.stderr is not None
        for raw in self.proc.stderr:
            line = raw.decode("utf-8", errors="replace").rstrip("\n")
            with self.cond:
                self.lines.append(line)
                self.cond.notify_all()
        with self.cond:
            self.eof = True
            self.cond.notify_all()

    def signal(self, number: int = signal.SIGTERM):
        assert self.proc is not None
        self.proc.send_signal(number)

    def wait_exit(self, timeout: float = 30.0) -> int:
        assert self.proc is not None
        code = self.proc.wait(timeout=timeout)
        if self._reader is not None:
            self._reader.join(timeout=10)
        return code

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM, then SIGKILL if it does not exit within `timeout`. Returns the exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        if self._reader is not None:
            self._reader.join(timeout=10)
        if self.proc.stderr is not None:
            self.proc.stderr.close()
        _live_servers.discard(self)
        return self.proc.returncode

    # --- log
    def mark(self, sync: bool = True) -> int:
        """Index of the next stderr line, to look only at lines logged after this point.

        A request's log line is written before its response, but this process reads stderr
        on a thread, so a line of an earlier request may still be in the pipe. With `sync`,
        a unique request (GET /__sync__/N, a 404) is made first and its own log line awaited:
        every line of earlier requests is then in `lines`, before the returned index."""
        if not sync:
            with self.cond:
                return len(self.lines)
        self._sync += 1
        path = f"/__sync__/{self._sync}"
        response = self.exchange(request_bytes("GET", path))
        assert response.status == 404, response
        self.wait_line(f"^GET {re.escape(path)} 404 ", timeout=30)
        with self.cond:
            for index in range(len(self.lines) - 1, -1, -1):
                if self.lines[index].startswith(f"GET {path} 404 "):
                    return index + 1
        raise AssertionError("sync line vanished")

    def wait_line(self, pattern, start: int = 0, timeout: float = 30.0) -> re.Match:
        """Waits for a stderr line at index >= start matching `pattern` (re.search)."""
        regex = re.compile(pattern) if isinstance(pattern, str) else pattern
        deadline = time.monotonic() + timeout
        with self.cond:
            index = start
            while True:
                while index < len(self.lines):
                    match = regex.search(self.lines[index])
                    if match:
                        return match
                    index += 1
                remaining = deadline - time.monotonic()
                if self.eof or remaining <= 0:
                    raise AssertionError(
                        f"no stderr line matching {regex.pattern!r} "
                        f"({'process exited' if self.eof else f'within {timeout}s'}); "
                        f"stderr:\n{self.log_text()}")
                self.cond.wait(remaining)

    def wait_lines(self, prefix: str, count: int, start: int = 0,
                   timeout: float = 10.0, sync: bool = True) -> list[str]:
        """The lines at index >= start that begin with `prefix`, once there are `count` of them
        (or the timeout passes: the caller asserts on the count). A stream's log line follows
        the completion of its last write, which can come just after the client has read that
        write, so a line can lag its response; each poll syncs (mark) first. Without `sync`
        (a server that is going down may not answer the sync request) it only waits for the
        reader thread: right for lines the server writes before the response was read."""
        deadline = time.monotonic() + timeout
        while True:
            if sync:
                self.mark()
            lines = [line for line in self.lines_since(start) if line.startswith(prefix)]
            if len(lines) >= count or time.monotonic() > deadline:
                return lines
            time.sleep(0.05)

    def lines_since(self, start: int) -> list[str]:
        with self.cond:
            return list(self.lines[start:])

    def log_text(self) -> str:
        """The last 200 stderr lines, for failure messages (safe with or without the lock:
        the list is only ever appended to)."""
        return "\n".join(self.lines[-200:])

    # --- requests
    def connect(self, timeout: float = 30.0) -> RawConnection:
        assert self.port is not None
        return RawConnection(self.port, timeout=timeout)

    def exchange(self, data: bytes, timeout: float = 30.0,
                 content_type: str = "application/json") -> Response:
        """Sends one request on a fresh connection and reads one response."""
        with self.connect(timeout) as conn:
            conn.send(data)
            return conn.read_response(content_type=content_type)

    def chat(self, body: bytes, timeout: float = 60.0, headers=None) -> Response:
        return self.exchange(request_bytes("POST", CHAT_PATH, body, headers=headers), timeout)
