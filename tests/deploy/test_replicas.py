#!/usr/bin/env python3
# Three tiny `lily serve` replicas behind a real HAProxy running packaging/haproxy.cfg: cache affinity, no 429, dead and stopped replicas, clear errors.
"""The replica test of docs/deploy.md, run by CTest (deploy_replicas):

    python3 tests/deploy/test_replicas.py --lily BUILD/lily --haproxy /usr/sbin/haproxy \
        --template packaging/haproxy.cfg

Three `lily serve --device cpu --threads 1 --queue 3` replicas of one tiny checkpoint, and
HAProxy on the shipped template (its global section swapped for a foreground one with a
stats socket, its bind and server lines for local ports, maxconn set to the replicas'
--queue as the template prescribes). Phases, in order:

  config    the untouched template passes `haproxy -c`; its maxconn is lily's default --queue
  affinity  conversations keyed in the body, in X-Prompt-Cache-Key, in both (the body wins),
            not at all (the client address), and one with a 40 KB body: each second turn
            reaches the first turn's replica and reuses its cache (the replicas' own
            lily_cache_hits_total agree with the answers)
  overload  a burst on one key beyond a replica's queue: HAProxy holds the excess, no 429
            reaches anyone; the same burst sent to the replica directly gets its 429
  kill      SIGKILL of a replica with a stream running, two requests in its queue and six
            waiting in HAProxy for it: the stream is cut (it had started), every other
            request is answered by the other replicas; the restarted replica gets its keys back
  stop      SIGTERM of a replica with a stream running and two queued: the two queued ones
            (lily's 503 shutting_down) are retried elsewhere, the stream keeps flowing while
            HAProxy's /health check sees the 503 and marks the replica DOWN, lily exits 0
  down      every replica gone: HAProxy's own JSON 503

Every request has a client timeout and ends as an answer, a complete stream, a cut stream
(counted) or a JSON error; any other ending fails the test. Waits are on conditions (queue
depths read from the replicas' /metrics and HAProxy's stats socket), never on sleeps. The
figures are printed at the end (a table, and one line starting `FIGURES `).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "server"))

from lily_server_harness import (  # noqa: E402
    CHAT_PATH,
    SERVED_MODEL,
    Checkpoint,
    ConnectionClosed,
    ConnectionReset,
    EventStream,
    LilyServer,
    RawConnection,
    long_text,
    request_bytes,
)

QUEUE = 3            # the replicas' --queue, and so HAProxy's maxconn per replica
CLIENT_TIMEOUT = 120  # seconds any one read may take before the request counts as hung
WAIT = 90            # seconds any awaited condition may take on a loaded 2-core machine
BACKEND = "lily_replicas"
PAD = 40_000         # spaces before prompt_cache_key in the large body (> HAProxy's default 16 KB)


def fail(message: str):
    raise AssertionError(message)


def wait_for(what: str, condition, timeout: float = WAIT, debug=lambda: ""):
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            fail(f"timed out after {timeout} s waiting for {what}\n{debug()}")
        time.sleep(0.05)


# --- HAProxy ------------------------------------------------------------------------------

def sections(text: str) -> list[tuple[str, list[str]]]:
    """The config as (section header line, body lines) in order; lines before the first
    section (comments) under the header ""."""
    out: list[tuple[str, list[str]]] = [("", [])]
    for line in text.splitlines():
        if line and not line[0].isspace() and not line.startswith("#"):
            out.append((line, []))
        else:
            out[-1][1].append(line)
    return out


def keyword(line: str) -> str:
    stripped = line.strip()
    return "" if not stripped or stripped.startswith("#") else stripped.split()[0]


def template_maxconn(text: str) -> int:
    for header, body in sections(text):
        if header.split() == ["backend", BACKEND]:
            for line in body:
                if keyword(line) == "default-server":
                    match = re.search(r"\bmaxconn (\d+)\b", line)
                    if match:
                        return int(match.group(1))
    fail(f"the template has no `default-server ... maxconn N` line in backend {BACKEND}")


def render_config(text: str, port: int, replicas: list[tuple[str, int]], stats_socket: str) -> str:
    """The template for this test: a foreground global section with a stats socket, the
    front end on `port`, one server line per replica, maxconn = QUEUE. Everything else is
    the template's, verbatim; a missing piece fails loudly (the template drifted)."""
    seen = {"global": False, "bind": False, "servers": False}
    lines: list[str] = []
    for header, body in sections(text):
        if header:
            lines.append(header)
        words = header.split()
        if words == ["global"]:
            seen["global"] = True
            dropped = {"log", "chroot", "user", "group", "daemon", "stats"}
            lines += [line for line in body if keyword(line) not in dropped]
            lines += ["\tlog stdout format raw local0 info",
                      f"\tstats socket {stats_socket} mode 600 level admin"]
            continue
        for line in body:
            if words == ["frontend", "lily"] and keyword(line) == "bind":
                if seen["bind"]:
                    fail("the template's frontend lily has more than one bind line")
                seen["bind"] = True
                lines.append(f"\tbind 127.0.0.1:{port}")
            elif words == ["backend", BACKEND] and keyword(line) == "server":
                if not seen["servers"]:
                    seen["servers"] = True
                    lines += [f"\tserver {name} 127.0.0.1:{p}" for name, p in replicas]
            elif words == ["backend", BACKEND] and keyword(line) == "default-server":
                lines.append(re.sub(r"\bmaxconn \d+\b", f"maxconn {QUEUE}", line))
            else:
                lines.append(line)
    missing = [name for name, present in seen.items() if not present]
    if missing:
        fail(f"the template lacks {missing} (global section, frontend lily's bind, "
             f"backend {BACKEND}'s server lines)")
    return "\n".join(lines) + "\n"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class HAProxy:
    """haproxy -db (foreground) on a rendered config; its log lines kept in `lines`."""

    def __init__(self, binary: str, config: str, workdir: str, stats_socket: str):
        self.binary, self.config, self.socket = binary, config, stats_socket
        self.lines: list[str] = []
        self.proc = subprocess.Popen([binary, "-db", "-f", config], cwd=workdir,
                                     stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for raw in self.proc.stdout:
            self.lines.append(raw.decode("utf-8", errors="replace").rstrip("\n"))

    def log_text(self) -> str:
        return "\n".join(self.lines[-60:])

    def stats(self) -> dict[str, dict[str, str]]:
        """`show stat` of the backend: {server name or "BACKEND": row}."""
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(10)
            s.connect(self.socket)
            s.sendall(b"show stat\n")
            data = b""
            while chunk := s.recv(65536):
                data += chunk
        rows = data.decode().splitlines()
        names = rows[0].lstrip("# ").split(",")
        out = {}
        for row in rows[1:]:
            if row:
                entry = dict(zip(names, row.split(",")))
                if entry["pxname"] == BACKEND:
                    out[entry["svname"]] = entry
        return out

    def status(self, server: str) -> str:
        try:
            return self.stats()[server]["status"]
        except OSError:
            return ""

    def wait_started(self, servers: list[str]) -> bool:
        """False if HAProxy exits first (its port was taken); else once every server is UP
        and has been checked once."""
        def ready():
            if self.proc.poll() is not None:
                return "exited"
            return os.path.exists(self.socket) and all(
                self.status(n) == "UP" and self.check(n) not in ("", "INI") for n in servers)
        return wait_for("HAProxy's stats socket, the replicas UP and checked once", ready,
                        debug=self.log_text) is True

    def check(self, server: str) -> str:
        """The last health check's result (L4OK, L7OK, L7STS, ...; INI before the first)."""
        try:
            return self.stats()[server]["check_status"].removeprefix("* ")
        except OSError:
            return ""

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.reader.join(timeout=5)


# --- replicas -----------------------------------------------------------------------------

METRIC = re.compile(r"^([a-z_]+)(\{[^}]*\})? ([0-9.eE+-]+)$")


def metrics(port: int) -> dict[str, float]:
    """A replica's /metrics (read directly, not through HAProxy) as {"name{labels}": value}."""
    with RawConnection(port, timeout=30) as conn:
        conn.send(request_bytes("GET", "/metrics"))
        response = conn.read_response(content_type="text/plain; version=0.0.4; charset=utf-8")
    if response.status != 200:
        fail(f"GET /metrics on port {port}: {response.status} {response.body!r}")
    out = {}
    for line in response.body.decode().splitlines():
        match = METRIC.match(line)
        if match:
            out[match.group(1) + (match.group(2) or "")] = float(match.group(3))
    return out


def queue_depth(port: int) -> float:
    return metrics(port)["lily_queue_depth"]


def status_count(values: dict[str, float], status: int) -> float:
    return values.get(f'lily_requests_total{{endpoint="{CHAT_PATH}",status="{status}"}}', 0.0)


# --- requests -----------------------------------------------------------------------------

@dataclass
class Outcome:
    """How one request ended."""
    label: str
    kind: str = "lost"           # answer | stream | cut | closed (by us) | error | lost
    status: int = 0
    replica: str = ""            # X-Lily-Replica (HAProxy's), "" when sent directly
    retries: str = ""            # X-Lily-Retries: "0", "1", "+1" ("+": redispatched)
    body: dict = field(default_factory=dict)
    content: str = ""            # a stream's content, concatenated
    events: int = 0
    detail: str = ""

    @property
    def cached(self) -> int:
        return self.body.get("usage", {}).get("prompt_tokens_details", {}).get("cached_tokens", 0)


OUTCOMES: list[Outcome] = []
OUTCOMES_LOCK = threading.Lock()


def record(outcome: Outcome) -> Outcome:
    with OUTCOMES_LOCK:
        OUTCOMES.append(outcome)
    return outcome


def chat(messages: list[dict], max_tokens: int, *, key: str | None = None,
         header_key: str | None = None, pad: int = 0, **fields) -> tuple[bytes, list]:
    """A request body (prompt_cache_key last, after `pad` spaces) and its headers."""
    request = {"model": SERVED_MODEL, "messages": messages, "max_tokens": max_tokens, **fields}
    body = json.dumps(request)
    if key is not None:
        body = body[:-1] + "," + " " * pad + json.dumps("prompt_cache_key") + ":" + json.dumps(key) + "}"
    headers = [("X-Prompt-Cache-Key", header_key)] if header_key is not None else []
    return body.encode(), headers


def post(port: int, label: str, body: bytes, headers: list) -> Outcome:
    outcome = Outcome(label)
    try:
        with RawConnection(port, timeout=CLIENT_TIMEOUT) as conn:
            conn.send(request_bytes("POST", CHAT_PATH, body, headers=headers))
            response = conn.read_response()
        outcome.status = response.status
        outcome.replica = response.header("X-Lily-Replica") or ""
        outcome.retries = response.header("X-Lily-Retries") or ""
        outcome.body = response.json()
        if response.status == 200 and outcome.body.get("choices"):
            outcome.kind = "answer"
        elif response.status >= 400 and outcome.body.get("error", {}).get("message"):
            outcome.kind = "error"
        else:
            outcome.detail = f"neither an answer nor a JSON error: {response.body[:300]!r}"
    except (OSError, ConnectionClosed, ConnectionReset, AssertionError, ValueError) as error:
        outcome.detail = f"{type(error).__name__}: {error}"
    return record(outcome)


class Stream:
    """A streamed request read on a thread; `started` is set at its first content delta.
    close() drops the connection (the client going away)."""

    def __init__(self, port: int, label: str, body: bytes, headers: list):
        self.outcome = Outcome(label)
        self.started = threading.Event()
        self.finished = threading.Event()
        self.conn: RawConnection | None = None
        self.closed_by_us = False
        self.thread = threading.Thread(target=self._run, args=(port, body, headers), daemon=True)
        self.thread.start()

    def _run(self, port: int, body: bytes, headers: list):
        outcome = self.outcome
        got_head = done = False
        try:
            self.conn = RawConnection(port, timeout=CLIENT_TIMEOUT)
            self.conn.send(request_bytes("POST", CHAT_PATH, body, headers=headers))
            head = self.conn.read_head()
            got_head = True
            outcome.status = head.status
            outcome.replica = head.header("X-Lily-Replica") or ""
            outcome.retries = head.header("X-Lily-Retries") or ""
            if head.status != 200:
                head.body = self.conn._read_exact(int(head.header("Content-Length") or 0))
                outcome.body = head.json()
                outcome.kind = "error" if outcome.body.get("error", {}).get("message") else "lost"
                return
            events = EventStream(self.conn, head)
            while (event := events.next_event()) is not None:
                if event == b"[DONE]":
                    done = True
                    continue
                outcome.events += 1
                chunk = json.loads(event)
                if "error" in chunk:
                    outcome.body = chunk
                    continue
                for choice in chunk.get("choices", []):
                    text = choice.get("delta", {}).get("content") or ""
                    outcome.content += text
                    if text:
                        self.started.set()
            if done and "error" in outcome.body:
                outcome.kind = "error"  # lily's own error after the stream had started
            elif done:
                outcome.kind = "stream"
            else:  # a client sees a stream without its end: as good as cut
                outcome.kind = "cut"
                outcome.detail = "the body ended without data: [DONE]"
        except (OSError, ConnectionClosed, ConnectionReset, AssertionError, ValueError) as error:
            if self.closed_by_us:
                outcome.kind = "closed"
            elif got_head and outcome.status == 200:
                outcome.kind = "cut"
            outcome.detail = f"{type(error).__name__}: {error}"
        finally:
            if self.conn is not None:
                self.conn.close()
            record(outcome)
            self.finished.set()

    def wait_started(self, what: str):
        wait_for(what, lambda: self.started.is_set() or self.finished.is_set())
        if not self.started.is_set():
            fail(f"{what}: the stream ended before its first token: {self.outcome}")

    def close(self):
        self.closed_by_us = True
        if self.conn is not None:
            self.conn.close()

    def join(self) -> Outcome:
        if not self.finished.wait(CLIENT_TIMEOUT + 60):
            fail(f"stream {self.outcome.label} still running (hung)")
        return self.outcome


# --- the test -----------------------------------------------------------------------------

class ReplicaTest:
    def __init__(self, args):
        self.args = args
        self.figures: dict = {}
        self.walls: dict[str, float] = {}
        self.tmp = tempfile.TemporaryDirectory(prefix="lily-replicas-")
        self.checkpoint: Checkpoint | None = None
        self.replicas: dict[str, LilyServer] = {}
        self.ports: dict[str, int] = {}
        self.haproxy: HAProxy | None = None
        self.lb_port = 0
        self.home: dict[str, str] = {}   # routing key -> replica name, as observed
        self.pool = ThreadPoolExecutor(max_workers=32)

    # -- set-up
    def replica_args(self) -> tuple[str, ...]:
        return ("--device", "cpu", "--threads", "1", "--queue", str(QUEUE))

    def start_replica(self, name: str, bind: str = "127.0.0.1:0") -> LilyServer:
        deadline = time.monotonic() + WAIT
        while True:
            server = LilyServer(self.args.lily, self.checkpoint.path, *self.replica_args(), bind=bind)
            try:
                server.start(timeout=WAIT)
                break
            except AssertionError:
                server.stop()
                # A restart on the killed replica's port can race the kernel releasing it.
                if bind.endswith(":0") or time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        self.replicas[name] = server
        self.ports[name] = server.port
        return server

    def setup(self):
        self.checkpoint = Checkpoint(self.args.lily)
        for name in ("lily1", "lily2", "lily3"):
            self.start_replica(name)
        with open(self.args.template, encoding="utf-8") as f:
            template = f.read()
        stats_socket = os.path.join(self.tmp.name, "haproxy.sock")
        config = os.path.join(self.tmp.name, "haproxy.cfg")
        for attempt in range(3):  # the free port can be taken before HAProxy binds it
            self.lb_port = free_port()
            with open(config, "w", encoding="utf-8") as f:
                f.write(render_config(template, self.lb_port, sorted(self.ports.items()), stats_socket))
            self.haproxy = HAProxy(self.args.haproxy, config, self.tmp.name, stats_socket)
            if self.haproxy.wait_started(list(self.ports)):
                break
            self.haproxy.stop()
            if attempt == 2:
                fail(f"HAProxy exited at start three times:\n{self.haproxy.log_text()}")
        stats = self.haproxy.stats()
        for name in self.ports:  # an HTTP check of /health, not a bare TCP connect
            if (self.haproxy.check(name), stats[name]["check_code"]) != ("L7OK", "200"):
                fail(f"HAProxy's check of {name}: {stats[name]['check_status']} "
                     f"{stats[name]['check_code']}, expected L7OK 200 (option httpchk)")

    def teardown(self):
        self.pool.shutdown(wait=False, cancel_futures=True)
        for server in self.replicas.values():
            server.stop()
        if self.haproxy is not None:
            self.haproxy.stop()
        if self.checkpoint is not None:
            self.checkpoint.cleanup()
        self.tmp.cleanup()

    def stop_token_bias(self) -> dict:
        """logit_bias banning the checkpoint's stop tokens, so a long request runs its length."""
        with open(os.path.join(self.checkpoint.path, "generation_config.json"), encoding="utf-8") as f:
            eos = json.load(f)["eos_token_id"]
        return {str(token): -100 for token in (eos if isinstance(eos, list) else [eos])}

    # -- helpers
    def lb_post(self, label: str, body: bytes, headers: list) -> Outcome:
        return post(self.lb_port, label, body, headers)

    def short(self, label: str, key: str | None, max_tokens: int = 8, port: int | None = None):
        """A future of one short non-streamed request (keyed in the body)."""
        prompt = long_text(12, seed=zlib.crc32(label.encode()) % 1000)
        body, headers = chat([{"role": "user", "content": prompt}], max_tokens, key=key)
        return self.pool.submit(post, port or self.lb_port, label, body, headers)

    def long_stream(self, label: str, key: str | None, max_tokens: int, port: int | None = None) -> Stream:
        body, headers = chat([{"role": "user", "content": "Tell me a very long story."}], max_tokens,
                             key=key, stream=True, logit_bias=self.stop_token_bias())
        return Stream(port or self.lb_port, label, body, headers)

    def keys_of(self, replica: str) -> list[str]:
        return [k for k, r in self.home.items() if r == replica and k.startswith("conv-")]

    def expect_answer(self, outcome: Outcome, not_from: str | None = None):
        if outcome.kind != "answer":
            fail(f"{outcome.label}: expected a 200 answer, got {outcome}")
        if not_from and outcome.replica == not_from:
            fail(f"{outcome.label}: answered by {not_from}, which was gone: {outcome}")

    # -- phases
    def phase_config(self):
        result = subprocess.run([self.args.haproxy, "-c", "-f", self.args.template],
                                capture_output=True, text=True, timeout=60)
        if result.returncode != 0:
            fail(f"haproxy -c rejects the shipped template {self.args.template}:\n"
                 f"{result.stdout}{result.stderr}")
        with open(self.args.template, encoding="utf-8") as f:
            maxconn = template_maxconn(f.read())
        help_text = subprocess.run([self.args.lily, "serve", "--help"], capture_output=True,
                                   text=True, timeout=60).stdout
        match = re.search(r"--queue VALUE.*\(default (\d+)\)", help_text)
        if not match:
            fail(f"`lily serve --help` names no default for --queue:\n{help_text}")
        if maxconn != int(match.group(1)):
            fail(f"the template's maxconn {maxconn} is not lily's default --queue "
                 f"{match.group(1)}: with more, lily answers 429s that HAProxy 2.6 cannot retry")
        self.figures["template_maxconn"] = maxconn

    def probe(self, label: str, key: str | None = None, header_key: str | None = None) -> str:
        """The replica a one-token request keyed this way reaches."""
        body, headers = chat([{"role": "user", "content": "Hi"}], 1, key=key, header_key=header_key)
        outcome = self.lb_post(label, body, headers)
        self.expect_answer(outcome)
        return outcome.replica

    def conversation(self, index: int, mode: str, key: str):
        """Two turns of one conversation as a generator: yields after the first turn."""
        routing = {"body": dict(key=key), "header": dict(header_key=key),
                   "both": dict(key=key, header_key=f"decoy-{index}"),
                   "none": {}, "padded": dict(key=key, pad=PAD)}[mode]
        user = {"role": "user", "content": long_text(30, seed=100 + index)}
        body, headers = chat([user], 8, **routing)
        first = self.lb_post(f"{mode} {key} turn 1", body, headers)
        self.expect_answer(first)
        yield
        answer = first.body["choices"][0]["message"]["content"]
        second_turn = [user, {"role": "assistant", "content": answer},
                       {"role": "user", "content": "Go on, and be brief."}]
        if mode == "both":  # the body's key alone now: it is what routed the first turn
            routing = dict(key=key)
        body, headers = chat(second_turn, 8, **routing)
        second = self.lb_post(f"{mode} {key} turn 2", body, headers)
        self.expect_answer(second)
        if second.replica != first.replica:
            fail(f"{mode} {key}: turn 1 went to {first.replica}, turn 2 to {second.replica}")
        if second.cached <= 0:
            fail(f"{mode} {key}: turn 2 on {second.replica} reused no cached tokens: {second.body}")
        self.home["src" if mode == "none" else key] = first.replica
        self.turns.append((first, second))
        yield

    def phase_affinity(self):
        before = {name: metrics(port) for name, port in self.ports.items()}
        mark = len(OUTCOMES)
        modes = ["body", "header", "both"] * 4 + ["none", "padded"]
        keys = [f"conv-{i}" for i in range(len(modes))]
        # The large body's key must route elsewhere than a keyless request (the client
        # address), or a body HAProxy could not read whole would pass unnoticed.
        keyless = self.probe("probe: no key")
        keys[-1] = next((k for k in (f"padded-{i}" for i in range(50))
                         if self.probe(f"probe: {k}", header_key=k) != keyless), None)
        if keys[-1] is None:
            fail(f"50 keys sent in X-Prompt-Cache-Key all reached {keyless}, the keyless "
                 "requests' replica: the header is not hashed")
        self.turns: list[tuple[Outcome, Outcome]] = []
        # Two conversations at a time, their turns interleaved: each replica's session cache
        # (two entries) can hold both, so a miss could only come from the routing.
        for start in range(0, len(modes), 2):
            pair = [self.conversation(i, modes[i], keys[i])
                    for i in range(start, min(start + 2, len(modes)))]
            for conv in pair:
                next(conv)
            for conv in pair:
                next(conv)
        # A key routes the same in the body and in the header (the key, not where it was).
        for index, mode in enumerate(modes):
            if mode in ("body", "both", "padded"):
                elsewhere = self.probe(f"probe: {keys[index]} in the header", header_key=keys[index])
            elif mode == "header":
                elsewhere = self.probe(f"probe: {keys[index]} in the body", key=keys[index])
            else:
                elsewhere = self.probe("probe: no key again")
            home = self.home["src" if mode == "none" else keys[index]]
            if elsewhere != home:
                fail(f"{mode} conversation {keys[index]} went to {home}, the same key sent the "
                     f"other way to {elsewhere}")
        used = sorted(set(self.home.values()))
        if used != sorted(self.ports):
            fail(f"the conversations reached only {used} of {sorted(self.ports)}: the hash does "
                 f"not spread keys (routing: {self.home})")
        # The replicas' own counters: every answer with cached tokens is one hit where it says.
        after = {name: metrics(port) for name, port in self.ports.items()}
        for name in self.ports:
            hits = after[name]["lily_cache_hits_total"] - before[name]["lily_cache_hits_total"]
            reported = sum(1 for o in OUTCOMES[mark:] if o.replica == name and o.cached > 0)
            if hits != reported:
                fail(f"{name}: lily_cache_hits_total rose by {hits}, the answers that named it "
                     f"report {reported} hits")
        seconds = [second for _, second in self.turns]
        self.figures["affinity"] = {
            "conversations": len(self.turns),
            "second_turn_same_replica": sum(1 for f, s in self.turns if f.replica == s.replica),
            "second_turn_cache_hits": sum(1 for s in seconds if s.cached > 0),
            "cached_share_of_second_prompt": round(
                sum(s.cached for s in seconds) / sum(s.body["usage"]["prompt_tokens"] for s in seconds), 3),
            "conversations_per_replica": {n: list(self.home.values()).count(n) for n in sorted(self.ports)},
        }

    def phase_overload(self):
        key = "conv-0"
        replica = self.home[key]
        port = self.ports[replica]
        before = metrics(port)
        # Through HAProxy: a stream keeps the replica busy; eight more on the same key.
        blocker = self.long_stream("overload blocker", key, 400)
        blocker.wait_started("the overload blocker's first token")
        burst = [self.short(f"overload burst {i}", key) for i in range(8)]
        waiting = 8 - (QUEUE - 1)
        wait_for(f"{waiting} requests waiting in HAProxy for {replica} and {QUEUE - 1} in its queue",
                 lambda: int(self.haproxy.stats()[replica]["qcur"]) == waiting
                 and queue_depth(port) == QUEUE - 1, debug=self.haproxy.log_text)
        qmax = int(self.haproxy.stats()[replica]["qmax"])
        blocker.close()
        blocker.join()
        for future in burst:
            outcome = future.result(timeout=CLIENT_TIMEOUT + 60)
            self.expect_answer(outcome)
            if outcome.replica != replica:
                fail(f"{outcome.label}: key {key} answered by {outcome.replica}, not {replica}")
        through = status_count(metrics(port), 429) - status_count(before, 429)
        if through != 0:
            fail(f"{replica} answered {through} requests with 429 behind HAProxy")
        # Directly: the same replica refuses the request beyond its queue.
        blocker = self.long_stream("direct blocker", None, 400, port=port)
        blocker.wait_started("the direct blocker's first token")
        queued = [self.short(f"direct queued {i}", None, port=port) for i in range(QUEUE)]
        wait_for(f"{QUEUE} requests in {replica}'s queue", lambda: queue_depth(port) == QUEUE)
        extra = self.short("direct extra", None, port=port).result(timeout=CLIENT_TIMEOUT)
        if extra.status != 429 or extra.body.get("error", {}).get("code") != "queue_full":
            fail(f"the request beyond {replica}'s queue sent directly: expected 429 queue_full, "
                 f"got {extra}")
        blocker.close()
        blocker.join()
        for future in queued:
            self.expect_answer(future.result(timeout=CLIENT_TIMEOUT + 60))
        self.figures["overload"] = {
            "burst_through_haproxy": len(burst), "answered_200": len(burst),
            "haproxy_queue_max": qmax, "lily_429_behind_haproxy": int(through),
            "direct_request_beyond_queue": extra.status,
        }

    def phase_kill(self):
        victim = self.home["conv-1"]
        others = [n for n in sorted(self.ports) if n != victim]
        victim_keys = self.keys_of(victim)
        other_keys = [k for n in others for k in self.keys_of(n)]
        port = self.ports[victim]
        running = self.long_stream("kill: running stream", victim_keys[0], 400)
        running.wait_started("the victim's running stream")
        queued = [self.short(f"kill: in {victim}'s queue {i}", victim_keys[i % len(victim_keys)], 16)
                  for i in range(QUEUE - 1)]
        wait_for(f"{QUEUE - 1} requests in {victim}'s queue", lambda: queue_depth(port) == QUEUE - 1)
        waiting = [self.short(f"kill: waiting for {victim} {i}", victim_keys[i % len(victim_keys)], 16)
                   for i in range(4)]
        waiting_streams = [self.long_stream(f"kill: stream waiting for {victim} {i}", victim_keys[0], 16)
                           for i in range(2)]
        elsewhere = [self.short(f"kill: other {i}", other_keys[i % len(other_keys)], 16) for i in range(8)]
        elsewhere_streams = [self.long_stream(f"kill: other stream {i}", other_keys[i % len(other_keys)], 16)
                             for i in range(4)]
        wait_for(f"six requests waiting in HAProxy for {victim}",
                 lambda: int(self.haproxy.stats()[victim]["qcur"]) == 6, debug=self.haproxy.log_text)
        killed_at = time.monotonic()
        self.replicas[victim].proc.kill()
        self.replicas[victim].stop()
        cut = running.join()
        if cut.kind != "cut" or cut.events < 1:
            fail(f"the stream running on the killed {victim}: expected cut after its first "
                 f"tokens, got {cut}")
        answers = [f.result(timeout=CLIENT_TIMEOUT + 60) for f in queued + waiting + elsewhere]
        for outcome in answers:
            self.expect_answer(outcome, not_from=victim)
        streams = [s.join() for s in waiting_streams + elsewhere_streams]
        for outcome in streams:
            if outcome.kind != "stream" or outcome.replica == victim:
                fail(f"{outcome.label}: expected a complete stream from another replica, got {outcome}")
        retried = [o for o in answers[:QUEUE - 1] if o.retries not in ("", "0")]
        if len(retried) != QUEUE - 1:
            fail(f"the requests that were in {victim}'s queue should each show a retry "
                 f"(X-Lily-Retries): {answers[:QUEUE - 1]}")
        wait_for(f"HAProxy marking {victim} DOWN", lambda: self.haproxy.status(victim).startswith("DOWN"),
                 debug=self.haproxy.log_text)
        down_after = time.monotonic() - killed_at
        stats = self.haproxy.stats()
        # Back on its port: HAProxy sees it UP again and its keys return to it.
        self.start_replica(victim, bind=f"127.0.0.1:{port}")
        wait_for(f"HAProxy marking the restarted {victim} UP", lambda: self.haproxy.status(victim) == "UP",
                 debug=self.haproxy.log_text)
        back = self.short("kill: after restart", victim_keys[0]).result(timeout=CLIENT_TIMEOUT)
        self.expect_answer(back)
        if back.replica != victim:
            fail(f"after {victim} restarted, its key went to {back.replica}")
        self.figures["kill"] = {
            "requests": 1 + len(answers) + len(streams), "non_streamed_answered_200": len(answers),
            "streams_complete": len(streams), "streams_cut": 1,
            "answers_retried_on_another_replica": sum(1 for o in answers if o.retries not in ("", "0")),
            "haproxy_retries_so_far": int(stats["BACKEND"]["wretr"]),
            "haproxy_redispatches_so_far": int(stats["BACKEND"]["wredis"]),
            "seconds_until_marked_down": round(down_after, 1),
        }

    def phase_stop(self):
        target = self.home["conv-2"]
        keys = self.keys_of(target)
        port = self.ports[target]
        # Long enough (thousands of tokens) to still run when HAProxy's check has seen the
        # 503: a TCP check would keep the stopping replica UP until it exits.
        running = self.long_stream("stop: running stream", keys[0], 4000)
        running.wait_started("the stopped replica's running stream")
        queued = [self.short(f"stop: in {target}'s queue {i}", keys[i % len(keys)], 8)
                  for i in range(QUEUE - 1)]
        wait_for(f"{QUEUE - 1} requests in {target}'s queue", lambda: queue_depth(port) == QUEUE - 1)
        self.replicas[target].signal(signal.SIGTERM)
        signalled_at, events_at_signal = time.monotonic(), running.outcome.events
        for future in queued:
            outcome = future.result(timeout=CLIENT_TIMEOUT + 60)
            self.expect_answer(outcome, not_from=target)
            if outcome.retries in ("", "0"):
                fail(f"{outcome.label}: answered elsewhere without a retry? {outcome}")

        def marked_down_by_its_503():
            if running.finished.is_set():
                fail(f"the stream on the stopping {target} ended before HAProxy marked it DOWN "
                     f"on /health's 503: {running.outcome}")
            row = self.haproxy.stats()[target]
            return row["status"].startswith("DOWN") and \
                row["check_status"].removeprefix("* ") == "L7STS" and row["check_code"] == "503"

        wait_for(f"HAProxy marking the stopping {target} DOWN on /health's 503",
                 marked_down_by_its_503, debug=self.haproxy.log_text)
        down_after = time.monotonic() - signalled_at
        if running.outcome.events <= events_at_signal:
            fail(f"the stream on {target} delivered nothing after SIGTERM: {running.outcome}")
        events_after = running.outcome.events - events_at_signal
        running.close()  # the client leaves; lily has nothing left to finish
        running.join()
        code = self.replicas[target].wait_exit(timeout=WAIT)
        if code != 0:
            fail(f"{target} exited {code} after SIGTERM, expected 0")
        self.figures["stop"] = {"queued_retried_elsewhere": QUEUE - 1,
                                "stream_events_after_sigterm": events_after,
                                "seconds_until_marked_down_on_503": round(down_after, 1),
                                "exit_code": code}

    def phase_down(self):
        for server in self.replicas.values():
            server.stop()
        body, headers = chat([{"role": "user", "content": "Anyone there?"}], 8, key="conv-0")
        outcome = self.lb_post("down: no replica", body, headers)
        if outcome.kind != "error" or outcome.status != 503 or \
                not outcome.body["error"]["message"].startswith("load balancer:"):
            fail(f"with every replica gone: expected HAProxy's JSON 503, got {outcome}")
        self.figures["down"] = {"status": outcome.status, "code": outcome.body["error"].get("code")}

    def run(self) -> int:
        started = time.monotonic()
        try:
            for name, phase in (("config", self.phase_config), ("setup", self.setup),
                                ("affinity", self.phase_affinity), ("overload", self.phase_overload),
                                ("kill", self.phase_kill), ("stop", self.phase_stop),
                                ("down", self.phase_down)):
                phase_start = time.monotonic()
                phase()
                self.walls[name] = round(time.monotonic() - phase_start, 1)
                print(f"ok: {name} ({self.walls[name]} s)", flush=True)
        except Exception as error:  # noqa: BLE001 (every failure is reported the same way)
            print(f"FAIL: {type(error).__name__}: {error}", file=sys.stderr)
            if self.haproxy is not None:
                print(f"--- haproxy log (last lines)\n{self.haproxy.log_text()}", file=sys.stderr)
            return 1
        finally:
            self.teardown()
        lost = [o for o in OUTCOMES if o.kind == "lost"]
        if lost:
            print("FAIL: requests that got neither an answer nor a clear error:\n" +
                  "\n".join(str(o) for o in lost), file=sys.stderr)
            return 1
        kinds = {k: sum(1 for o in OUTCOMES if o.kind == k)
                 for k in ("answer", "stream", "cut", "closed", "error")}
        self.figures["all_requests"] = {"total": len(OUTCOMES), **kinds, "lost": 0}
        self.figures["wall_seconds"] = {**self.walls, "total": round(time.monotonic() - started, 1)}
        for phase, values in self.figures.items():
            print(f"{phase:>16}: {values}")
        print("FIGURES " + json.dumps(self.figures, sort_keys=True))
        return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lily", required=True)
    parser.add_argument("--haproxy", required=True,
                        help="the haproxy binary (a bare name is looked up on PATH and /usr/sbin)")
    parser.add_argument("--template", required=True, help="packaging/haproxy.cfg")
    args = parser.parse_args()
    found = shutil.which(args.haproxy, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin")
    if not found:
        print(f"FAIL: haproxy not found ({args.haproxy!r} on PATH, /usr/sbin, /sbin): install "
              "Debian's haproxy package (bash tools/dev.sh test installs it)", file=sys.stderr)
        return 1
    args.haproxy = found
    return ReplicaTest(args).run()


if __name__ == "__main__":
    sys.exit(main())
