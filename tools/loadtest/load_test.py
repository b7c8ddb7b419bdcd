# Load test for `lily serve`: concurrent keep-alive chat clients; checks statuses, resets, RSS, log lines, latency.
"""Load test for `lily serve` (issue 5): N concurrent clients x M chat completions each.

Starts the server itself (on a tiny seed-1 checkpoint made in a temporary directory unless
--model is given), then runs three phases:

  calibration  one client, sequential: the server's log gives each request's service time with
               no queueing; a least-squares fit  ms = a + b*(prompt - cached) + c*completion
               lets the main phase's engine time be estimated from its own log lines (the
               engine serves one request at a time, so requests/s <= 1 / mean engine time).
  warm-up      every client sends a couple of requests concurrently; then all connections
               close and the server's VmRSS is read ("before").
  main         every client sends --requests-per-client requests over one persistent
               connection (reconnecting when the server closes it); then all connections close
               and VmRSS ("after") and VmHWM (peak) are read.

Requirements checked (exit status 1 with the reasons printed when any fails): no 5xx, no
connection error of any kind (reset, closed without a response, timeout), every 200 body a
well-formed chat.completion, every intended-invalid request answered 400 and every valid one
200 (or 429 when the queue can fill: --queue smaller than --clients), no 429 at all when
--queue >= --clients, one server log line per request sent, no "request failed" in the log,
|RSS after - RSS before| <= --rss-tolerance of before, and exit status 0 after SIGTERM.

Python 3.11 standard library only. Run `python3 tools/loadtest/load_test.py --help`.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

MODEL_ID = "Qwen3.6-35B-A3B"
CHAT_PATH = "/v1/chat/completions"
READY_RE = re.compile(r"^serving \S+ on http://([^\s:]+|\[[^\]]+\]):(\d+) ")
# "POST /v1/chat/completions 200 44ms prompt=34 cached=0 completion=8 tok/s=179.8"
LOG_RE = re.compile(r"^(\S+) (\S+) (\d{3}) (\d+)ms(.*)$")
COUNTS_RE = re.compile(r" prompt=(\d+) cached=(\d+) completion=(\d+) tok/s=")
SUSPICIOUS_RE = re.compile(r"request failed|handler threw|accept failed|second signal")

WORDS = (
    "the a of to and in is it that for on with as was at by be this from or have an are not "
    "but what all were when we there can your which their said if do will each about how up out "
    "them then she many some so these would other into has more her two like him see time could "
    "no make than first been its who now people my made over did down only way find use may "
    "water long little very after words called just where most know get through back much go "
    "good new write our me man too any day same right look think also around another came come "
    "work three word must because does part even place well such here take why things help put "
    "years different away again off went old number great tell men say small every found still "
    "between name should home big give air line set own under read last never us left end along "
    "while might next sound below saw something thought both few those always looked show large "
    "often together asked house don't world going want school important until form food keep "
    "children feet land side without boy once animals life enough took sometimes four head above "
    "kind began almost live page got earth need far hand high year mother light parts country "
    "father let night following picture being study second eyes soon times story boys since white "
    "days ever paper hard near sentence better best across during today others sure means knew "
    "it's try told young miles sun ways thing whole hear example heard several change answer room "
    "sea against top turned learn point city play toward five using himself usually"
).split()
EXTRA_WORDS = ["café", "naïve", "Zürich", "日本語", "数据", "🙂", "résumé", "Ελλάδα", "\"quoted\"",
               "tab\there", "back\\slash", "line\nbreak", "x=1;", "<tag>", "{json}", "C++20"]
SYSTEM_PROMPTS = [
    "You are a helpful assistant.",
    "Answer briefly.",
    "You are a terse assistant that answers in one short sentence and never uses lists.",
]
INVALID_KINDS = ("bad_json", "unknown_field", "max_tokens_zero", "wrong_model",
                 "last_role_assistant", "unknown_message_field")


# --------------------------------------------------------------------------- the server


class Server:
    """A `lily serve` child: start, read its stderr (log lines) continuously, stop."""

    def __init__(self, argv: list[str], log_path: str | None):
        self.argv = argv
        self.lines: list[tuple[float, str]] = []
        self.lock = threading.Lock()
        self.ready = threading.Event()
        self.port: int | None = None
        self.host: str | None = None
        self.log_file = open(log_path, "w", encoding="utf-8") if log_path else None
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE)
        self.reader = threading.Thread(target=self._read, name="server-stderr", daemon=True)
        self.reader.start()

    def _read(self) -> None:
        # Must keep draining: the server writes its log with blocking write(2) calls.
        assert self.proc.stderr is not None
        for raw in self.proc.stderr:
            line = raw.decode("utf-8", "replace").rstrip("\n")
            now = time.monotonic()
            if self.log_file:
                self.log_file.write(line + "\n")
            with self.lock:
                self.lines.append((now, line))
            if not self.ready.is_set():
                m = READY_RE.match(line)
                if m:
                    self.host = m.group(1).strip("[]")
                    self.port = int(m.group(2))
                    self.ready.set()
        if self.log_file:
            self.log_file.flush()

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not self.ready.wait(0.1):
            if self.proc.poll() is not None:
                raise SystemExit("server exited with status %s before it was ready:\n%s"
                                 % (self.proc.returncode, "\n".join(self.text_lines()[-20:])))
            if time.monotonic() > deadline:
                raise SystemExit("server not ready after %.0f s" % timeout)

    def text_lines(self) -> list[str]:
        with self.lock:
            return [line for _, line in self.lines]

    def request_lines(self) -> list[str]:
        return [line for line in self.text_lines() if LOG_RE.match(line)]

    def wait_request_lines(self, expected: int, timeout: float = 10.0) -> int:
        """The log line is written before the response, but our reader may lag a little."""
        deadline = time.monotonic() + timeout
        while True:
            n = len(self.request_lines())
            if n >= expected or time.monotonic() > deadline:
                return n
            time.sleep(0.02)

    def memory_kb(self) -> dict[str, int]:
        values = {}
        with open("/proc/%d/status" % self.proc.pid, encoding="ascii") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in ("VmRSS", "VmHWM", "Threads", "RssAnon", "RssFile"):
                    values[key] = int(rest.split()[0])
        return values

    def cpu_seconds(self) -> float:
        with open("/proc/%d/stat" % self.proc.pid, encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        ticks = os.sysconf("SC_CLK_TCK")
        return (int(fields[11]) + int(fields[12])) / ticks  # utime + stime

    def thread_times(self) -> dict[int, tuple[float, float]]:
        """(seconds on a CPU, seconds runnable but waiting for one) of each server thread,
        by thread id, from /proc/PID/task/TID/schedstat."""
        out = {}
        for tid in os.listdir("/proc/%d/task" % self.proc.pid):
            try:
                with open("/proc/%d/task/%s/schedstat" % (self.proc.pid, tid),
                          encoding="ascii") as f:
                    run_ns, wait_ns = f.read().split()[:2]
            except (OSError, ValueError):
                continue
            out[int(tid)] = (int(run_ns) / 1e9, int(wait_ns) / 1e9)
        return out

    def open_fds(self) -> int:
        return len(os.listdir("/proc/%d/fd" % self.proc.pid))

    def stop(self, timeout: float) -> int | None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            code = None
        self.reader.join(5)
        if self.log_file:
            self.log_file.close()
        return code


# --------------------------------------------------------------------------- the workload


@dataclass
class Planned:
    kind: str  # "valid" or one of INVALID_KINDS
    body: bytes
    max_tokens: int


class Conversation:
    """One client's chat: continued turn by turn, restarted after a few turns or when long."""

    def __init__(self, rng: random.Random, client: int, args: argparse.Namespace,
                 use_key: bool):
        self.rng = rng
        self.client = client
        self.args = args
        self.key = "client-%d" % client if use_key else None
        self.conversations = 0
        self.new_conversation()

    def new_conversation(self) -> None:
        self.conversations += 1
        self.messages: list[dict[str, str]] = []
        if self.rng.random() < 0.3:
            self.messages.append({"role": "system", "content": self.rng.choice(SYSTEM_PROMPTS)})
        self.turns_left = self.rng.randint(1, self.args.max_turns)
        self.pending_user: str | None = None
        self.last_prompt_tokens = 0

    def user_text(self, long: bool = False) -> str:
        r = self.rng.random()
        if long:
            n = 4 * self.args.long_words  # longer than any prompt of the main phase
        elif r < 0.75:
            n = self.rng.randint(1, 4)  # short
        elif r < 0.95:
            n = self.rng.randint(5, 12)  # medium
        else:
            n = self.rng.randint(13, self.args.long_words)  # long
        words = [self.rng.choice(EXTRA_WORDS) if self.rng.random() < 0.04
                 else self.rng.choice(WORDS) for _ in range(n)]
        return "c%d: %s?" % (self.client, " ".join(words))

    def _body(self, messages: list[dict[str, str]], max_tokens: int, extra=None) -> dict:
        body: dict = {"model": MODEL_ID, "messages": messages, "max_tokens": max_tokens}
        if self.key is not None:
            body["prompt_cache_key"] = self.key
        if extra:
            body.update(extra)
        return body

    def next_request(self, invalid_rate: float, force_long: bool = False) -> Planned:
        # A quarter of the turns ask for one token: nothing generated is fed back then, so the
        # next turn's prompt starts with this whole prompt and can hit the session cache.
        max_tokens = 1 if self.rng.random() < self.args.one_token_rate else self.args.max_tokens
        if invalid_rate > 0 and self.rng.random() < invalid_rate:
            return self.invalid_request(max_tokens)
        if (force_long or self.turns_left <= 0
                or self.last_prompt_tokens > self.args.max_prompt_tokens):
            self.new_conversation()
        if self.pending_user is None:
            self.pending_user = self.user_text(long=force_long)
        messages = self.messages + [{"role": "user", "content": self.pending_user}]
        data = json.dumps(self._body(messages, max_tokens), ensure_ascii=self.rng.random() < 0.5)
        return Planned("valid", data.encode("utf-8"), max_tokens)

    def answered(self, content: str, prompt_tokens: int) -> None:
        """A 200 for the pending turn: keep it and the assistant's answer in the history."""
        assert self.pending_user is not None
        self.messages.append({"role": "user", "content": self.pending_user})
        self.messages.append({"role": "assistant", "content": content})
        self.pending_user = None
        self.turns_left -= 1
        self.last_prompt_tokens = prompt_tokens

    def invalid_request(self, max_tokens: int) -> Planned:
        kind = self.rng.choice(INVALID_KINDS)
        messages = self.messages + [{"role": "user", "content": self.user_text()}]
        if kind == "bad_json":
            text = json.dumps(self._body(messages, max_tokens))
            cut = self.rng.randint(1, len(text) - 1)
            data = text[:cut]  # a prefix of an object is never valid JSON
            if self.rng.random() < 0.3:
                data = text + "}"  # trailing garbage
        elif kind == "unknown_field":
            data = json.dumps(self._body(messages, max_tokens,
                                         {self.rng.choice(["temperature", "top_p", "seed", "user"]):
                                          self.rng.choice([0.7, 1, "x", None])}))
        elif kind == "max_tokens_zero":
            data = json.dumps(self._body(messages, 0))
        elif kind == "wrong_model":
            data = json.dumps(dict(self._body(messages, max_tokens), model="gpt-4o"))
        elif kind == "last_role_assistant":
            data = json.dumps(self._body(messages + [{"role": "assistant", "content": "ok"}],
                                         max_tokens))
        else:  # unknown_message_field
            bad = [dict(m) for m in messages]
            bad[-1]["name"] = "bob"
            data = json.dumps(self._body(bad, max_tokens))
        return Planned(kind, data.encode("utf-8"), max_tokens)


def check_completion(body: bytes, max_tokens: int) -> tuple[str | None, dict | None]:
    """Returns (problem or None, parsed body)."""
    try:
        doc = json.loads(body)
    except ValueError as e:
        return "200 body is not JSON: %s" % e, None
    try:
        assert isinstance(doc, dict), "not an object"
        assert list(doc) == ["id", "object", "created", "model", "choices", "usage"], \
            "fields %s" % list(doc)
        assert isinstance(doc["id"], str) and doc["id"].startswith("chatcmpl-"), "id"
        assert doc["object"] == "chat.completion", "object"
        assert isinstance(doc["created"], int) and doc["created"] > 1_600_000_000, "created"
        assert doc["model"] == MODEL_ID, "model"
        choices = doc["choices"]
        assert isinstance(choices, list) and len(choices) == 1, "choices"
        c = choices[0]
        assert c.get("index") == 0, "index"
        assert c.get("message", {}).get("role") == "assistant", "role"
        assert isinstance(c["message"].get("content"), str), "content"
        assert c.get("finish_reason") in ("stop", "length"), "finish_reason"
        u = doc["usage"]
        p, n, t = u["prompt_tokens"], u["completion_tokens"], u["total_tokens"]
        cached = u["prompt_tokens_details"]["cached_tokens"]
        assert all(isinstance(v, int) for v in (p, n, t, cached)), "usage types"
        assert p > 0 and 1 <= n <= max_tokens and t == p + n, "usage counts %s" % u
        assert 0 <= cached < p, "cached_tokens %d of prompt %d" % (cached, p)
        if c["finish_reason"] == "length":
            assert n == max_tokens, "length finish with %d of %d tokens" % (n, max_tokens)
    except (AssertionError, KeyError, TypeError, AttributeError) as e:
        return "200 body has the wrong shape (%s): %.200r" % (e, body), None
    return None, doc


def check_error(body: bytes, status: int) -> str | None:
    try:
        doc = json.loads(body)
        err = doc["error"]
        assert list(doc) == ["error"] and list(err) == ["message", "type", "param", "code"]
        assert isinstance(err["message"], str) and err["message"]
        want_type = "invalid_request_error" if 400 <= status < 500 and status != 429 \
            else "server_error"
        assert err["type"] == want_type, "type %r" % err["type"]
        if status == 429:
            assert err["code"] == "queue_full", "code %r" % err["code"]
    except (ValueError, KeyError, TypeError, AssertionError) as e:
        return "%d body has the wrong shape (%s): %.200r" % (status, e, body)
    return None


# --------------------------------------------------------------------------- clients


@dataclass
class Stats:
    statuses: Counter = field(default_factory=Counter)
    by_kind: Counter = field(default_factory=Counter)  # (kind, status or error)
    errors: Counter = field(default_factory=Counter)  # connection errors by class
    error_samples: list = field(default_factory=list)
    problems: list = field(default_factory=list)  # body/status mismatches (first few kept)
    problem_count: int = 0
    latencies_ok: list = field(default_factory=list)  # seconds, 200s
    latencies_all: list = field(default_factory=list)  # every answered request
    sent: int = 0
    connects: int = 0  # TCP connections opened
    server_closes: int = 0  # responses carrying Connection: close
    cached_hits: int = 0
    cached_tokens: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish: Counter = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def problem(self, text: str) -> None:
        with self.lock:
            self.problem_count += 1
            if len(self.problems) < 20:
                self.problems.append(text)


class Client(threading.Thread):
    def __init__(self, index: int, host: str, port: int, args: argparse.Namespace,
                 conv: Conversation, requests: int, invalid_rate: float, stats: Stats,
                 start_barrier: threading.Barrier | None, long_first: int = 0):
        super().__init__(name="client-%d" % index, daemon=True)
        self.index = index
        self.host, self.port = host, port
        self.args = args
        self.conv = conv
        self.requests = requests
        self.invalid_rate = invalid_rate
        self.stats = stats
        self.barrier = start_barrier
        self.long_first = long_first
        self.conn: http.client.HTTPConnection | None = None
        self.busy = 0  # consecutive 429s

    def connection(self) -> http.client.HTTPConnection:
        if self.conn is None:
            self.conn = http.client.HTTPConnection(self.host, self.port, timeout=self.args.timeout)
        if self.conn.sock is None:  # new, or closed after a Connection: close response
            self.conn.connect()
            self.conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self.stats.lock:
                self.stats.connects += 1
        return self.conn

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    def run(self) -> None:
        if self.barrier is not None:
            self.barrier.wait()
        headers = {"Content-Type": "application/json"}
        if not self.args.keep_alive:
            headers["Connection"] = "close"
        st = self.stats
        try:
            for i in range(self.requests):
                plan = self.conv.next_request(self.invalid_rate, force_long=i < self.long_first)
                t0 = time.perf_counter()
                try:
                    conn = self.connection()
                    conn.request("POST", CHAT_PATH, body=plan.body, headers=headers)
                    resp = conn.getresponse()
                    data = resp.read()
                except (OSError, http.client.HTTPException) as e:
                    name = type(e).__name__
                    with st.lock:
                        st.sent += 1
                        st.errors[name] += 1
                        st.by_kind[(plan.kind, name)] += 1
                        if len(st.error_samples) < 20:
                            st.error_samples.append("client %d request %d (%s): %s: %s"
                                                    % (self.index, i, plan.kind, name, e))
                    self.close()
                    continue
                elapsed = time.perf_counter() - t0
                status = resp.status
                with st.lock:
                    st.sent += 1
                    st.statuses[status] += 1
                    st.by_kind[(plan.kind, status)] += 1
                    st.latencies_all.append(elapsed)
                    if resp.will_close:
                        st.server_closes += 1
                if resp.will_close:  # http.client has closed the socket; reconnect next time
                    self.close()
                self.handle(plan, status, data, elapsed, i)
        finally:
            self.close()

    def handle(self, plan: Planned, status: int, data: bytes, elapsed: float, i: int) -> None:
        st = self.stats
        if status != 429:
            self.busy = 0
        where = "client %d request %d (%s)" % (self.index, i, plan.kind)
        if plan.kind == "valid":
            if status == 200:
                problem, doc = check_completion(data, plan.max_tokens)
                if problem:
                    st.problem("%s: %s" % (where, problem))
                    return
                u = doc["usage"]
                cached = u["prompt_tokens_details"]["cached_tokens"]
                with st.lock:
                    st.latencies_ok.append(elapsed)
                    st.prompt_tokens += u["prompt_tokens"]
                    st.completion_tokens += u["completion_tokens"]
                    st.cached_tokens += cached
                    st.cached_hits += cached > 0
                    st.finish[doc["choices"][0]["finish_reason"]] += 1
                self.conv.answered(doc["choices"][0]["message"]["content"], u["prompt_tokens"])
                return
            if status == 429 and self.args.queue < self.args.clients:
                problem = check_error(data, status)
                if problem:
                    st.problem("%s: %s" % (where, problem))
                # Back off as a client library would (exponential, with jitter); the same turn
                # is retried as the next request.
                delay = min(self.args.backoff_cap_ms, self.args.backoff_ms * 2 ** self.busy)
                self.busy += 1
                time.sleep((delay / 2 + self.conv.rng.uniform(0, delay / 2)) / 1000)
                return
            st.problem("%s: expected 200, got %d: %.300r" % (where, status, data))
            return
        if status != 400:
            st.problem("%s: expected 400, got %d: %.300r" % (where, status, data))
            return
        problem = check_error(data, status)
        if problem:
            st.problem("%s: %s" % (where, problem))


def run_phase(host: str, port: int, args: argparse.Namespace, convs: list[Conversation],
              requests: int, invalid_rate: float, long_first: int = 0) -> tuple[Stats, float]:
    stats = Stats()
    barrier = threading.Barrier(len(convs) + 1)
    clients = [Client(i, host, port, args, conv, requests, invalid_rate, stats, barrier,
                      long_first) for i, conv in enumerate(convs)]
    for c in clients:
        c.start()
    barrier.wait()
    t0 = time.perf_counter()
    for c in clients:
        c.join()
    return stats, time.perf_counter() - t0


# --------------------------------------------------------------------------- analysis


def system_cpu() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine since boot, from /proc/stat."""
    with open("/proc/stat", encoding="ascii") as f:
        ticks = [int(x) for x in f.readline().split()[1:]]
    hz = os.sysconf("SC_CLK_TCK")
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)  # idle + iowait
    total = sum(ticks[:8])  # guest time is already inside user
    return (total - idle) / hz, total / hz


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of an ascending list (q in 0..100)."""
    if not sorted_values:
        return float("nan")
    rank = max(1, -(-len(sorted_values) * q // 100))
    return sorted_values[int(rank) - 1]


def latency_summary(values: list[float]) -> dict:
    v = sorted(values)
    if not v:
        return {"count": 0}
    return {"count": len(v), "mean_ms": 1000 * sum(v) / len(v),
            "p50_ms": 1000 * percentile(v, 50), "p90_ms": 1000 * percentile(v, 90),
            "p99_ms": 1000 * percentile(v, 99), "max_ms": 1000 * v[-1]}


def parse_log(lines: list[str]) -> dict:
    statuses: Counter = Counter()
    completions = []  # (ms, prompt, cached, completion)
    for line in lines:
        m = LOG_RE.match(line)
        if not m:
            continue
        statuses[int(m.group(3))] += 1
        c = COUNTS_RE.match(m.group(5))
        if c and m.group(3) == "200":
            completions.append((int(m.group(4)), int(c.group(1)), int(c.group(2)),
                                int(c.group(3))))
    return {"statuses": statuses, "completions": completions}


def solve3(a: list[list[float]], b: list[float]) -> list[float] | None:
    """Gaussian elimination for a 3x3 system."""
    m = [row[:] + [rhs] for row, rhs in zip(a, b)]
    n = 3
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(m[r][col]))
        if abs(m[pivot][col]) < 1e-12:
            return None
        m[col], m[pivot] = m[pivot], m[col]
        for r in range(n):
            if r != col:
                f = m[r][col] / m[col][col]
                m[r] = [x - f * y for x, y in zip(m[r], m[col])]
    return [m[i][n] / m[i][i] for i in range(n)]


def fit_service_time(completions: list[tuple[int, int, int, int]]) -> dict | None:
    """Least squares ms = a + b*(prompt - cached) + c*completion over sequential requests."""
    xs = [(1.0, float(p - c), float(n)) for _, p, c, n in completions]
    ys = [float(ms) for ms, _, _, _ in completions]
    if len(xs) < 6:
        return None
    ata = [[sum(x[i] * x[j] for x in xs) for j in range(3)] for i in range(3)]
    aty = [sum(x[i] * y for x, y in zip(xs, ys)) for i in range(3)]
    coef = solve3(ata, aty)
    if coef is None:  # e.g. every completion the same length: drop that column
        mean_n = sum(x[2] for x in xs) / len(xs)
        xs2 = [(1.0, x[1]) for x in xs]
        s11 = len(xs2)
        s12 = sum(x[1] for x in xs2)
        s22 = sum(x[1] ** 2 for x in xs2)
        t1, t2 = sum(ys), sum(x[1] * y for x, y in zip(xs2, ys))
        det = s11 * s22 - s12 * s12
        if abs(det) < 1e-12:
            return None
        a, b = (t1 * s22 - s12 * t2) / det, (s11 * t2 - s12 * t1) / det
        coef = [a, b, 0.0]
        del mean_n
    pred = [coef[0] + coef[1] * x[1] + coef[2] * x[2] for x in xs]
    mean_y = sum(ys) / len(ys)
    ss_res = sum((y - p) ** 2 for y, p in zip(ys, pred))
    ss_tot = sum((y - mean_y) ** 2 for y in ys) or 1.0
    return {"intercept_ms": coef[0], "ms_per_prefill_token": coef[1],
            "ms_per_completion_token": coef[2], "r2": 1 - ss_res / ss_tot,
            "mean_abs_error_ms": sum(abs(y - p) for y, p in zip(ys, pred)) / len(ys),
            "samples": len(ys), "mean_ms": mean_y}


def predicted_ms(fit: dict, prompt: int, cached: int, completion: int) -> float:
    return max(0.0, fit["intercept_ms"] + fit["ms_per_prefill_token"] * (prompt - cached)
               + fit["ms_per_completion_token"] * completion)


# --------------------------------------------------------------------------- main


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Appends "(default: X)" only where the default is a value, not None or False."""

    def _get_help_string(self, action: argparse.Action) -> str:
        if action.default in (None, False) or action.default is argparse.SUPPRESS:
            return action.help or ""
        return super()._get_help_string(action)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=HelpFormatter)
    p.add_argument("--lily", default=None,
                   help="the lily binary (default: build-load/lily, then build/lily, next to this "
                        "repository)")
    p.add_argument("--model", default=None,
                   help="checkpoint directory (default: a tiny seed-1 checkpoint made in a "
                        "temporary directory)")
    p.add_argument("--clients", type=int, default=None, help="concurrent clients (default 64)")
    p.add_argument("--requests-per-client", type=int, default=None,
                   help="requests each client sends in the main phase (default 200)")
    p.add_argument("--quick", action="store_true",
                   help="smoke run: 8 clients x 20 requests, 12 calibration requests (explicit "
                        "--clients/--requests-per-client/--calibration-requests still win)")
    p.add_argument("--max-tokens", type=int, default=4, help="max_tokens of the valid requests (--one-token-rate of them use 1)")
    p.add_argument("--queue", type=int, default=16, help="the server's --queue")
    p.add_argument("--threads", type=int, default=None,
                   help="the server's --threads (default: its own, all cores)")
    p.add_argument("--http-threads", type=int, default=None,
                   help="the server's --http-threads (default: its own, 4)")
    p.add_argument("--max-seq", type=int, default=None, help="the server's --max-seq")
    p.add_argument("--keep-alive", action=argparse.BooleanOptionalAction, default=True,
                   help="one persistent connection per client; --no-keep-alive sends "
                        "Connection: close and reconnects for every request")
    p.add_argument("--invalid-rate", type=float, default=0.03,
                   help="fraction of main-phase requests that are invalid on purpose (expect 400)")
    p.add_argument("--one-token-rate", type=float, default=0.25,
                   help="fraction of valid requests sent with max_tokens 1 (their next turn can "
                        "hit the session cache)")
    p.add_argument("--max-turns", type=int, default=3,
                   help="a conversation lasts 1..N answered turns, then a new one starts")
    p.add_argument("--max-prompt-tokens", type=int, default=48,
                   help="start a new conversation once the last prompt was longer than this")
    p.add_argument("--long-words", type=int, default=24, help="words in the longest messages")
    p.add_argument("--calibration-requests", type=int, default=None,
                   help="sequential requests (one client, after two long ones) used to fit the "
                        "service time (default 60)")
    p.add_argument("--warmup-per-client", type=int, default=2,
                   help="concurrent warm-up requests per client before RSS is read")
    p.add_argument("--backoff-ms", type=float, default=100.0,
                   help="after the k-th 429 in a row a client sleeps d/2 + uniform(0, d/2), "
                        "d = min(cap, this * 2^(k-1)), before retrying the turn")
    p.add_argument("--backoff-cap-ms", type=float, default=2000.0, help="the cap of that delay")
    p.add_argument("--timeout", type=float, default=120.0,
                   help="client socket timeout in seconds (a hang counts as a connection error)")
    p.add_argument("--rss-tolerance", type=float, default=0.10,
                   help="largest allowed |RSS after - RSS before| / RSS before")
    p.add_argument("--seed", type=int, default=1, help="workload random seed")
    p.add_argument("--json-out", default=None, help="write every figure to this JSON file")
    p.add_argument("--server-log", default=None, help="copy the server's stderr to this file")
    args = p.parse_args()
    quick = {"clients": 8, "requests_per_client": 20, "calibration_requests": 12}
    full = {"clients": 64, "requests_per_client": 200, "calibration_requests": 60}
    for key, value in (quick if args.quick else full).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.clients < 1 or args.requests_per_client < 1 or args.max_tokens < 1:
        p.error("--clients, --requests-per-client and --max-tokens must be positive")
    if args.lily is None:
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        for candidate in ("build-load/lily", "build/lily"):
            path = os.path.join(root, candidate)
            if os.access(path, os.X_OK):
                args.lily = path
                break
        else:
            p.error("no lily binary found; pass --lily")
    return args


def fmt_ms(summary: dict) -> str:
    if not summary.get("count"):
        return "n/a"
    return "p50 %.1f  p90 %.1f  p99 %.1f  max %.1f  mean %.1f ms (n=%d)" % (
        summary["p50_ms"], summary["p90_ms"], summary["p99_ms"], summary["max_ms"],
        summary["mean_ms"], summary["count"])


def main() -> int:
    args = parse_args()
    # SIGTERM/SIGHUP (e.g. `kill` of a nohup run): unwind so that the server is stopped too.
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, lambda number, frame: sys.exit(128 + number))
    tmp = tempfile.TemporaryDirectory(prefix="lily-load-")
    model = args.model
    if model is None:
        model = os.path.join(tmp.name, "tiny")
        made = subprocess.run([args.lily, "make-checkpoint", "--profile", "tiny", "--seed", "1",
                               "--out", model], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        if made.returncode != 0:
            raise SystemExit("lily make-checkpoint failed:\n" + made.stdout.decode(errors="replace"))
    argv = [args.lily, "serve", "--model", model, "--bind", "127.0.0.1:0",
            "--queue", str(args.queue)]
    for flag, value in (("--threads", args.threads), ("--http-threads", args.http_threads),
                        ("--max-seq", args.max_seq)):
        if value is not None:
            argv += [flag, str(value)]
    print("server: %s" % " ".join(argv), flush=True)
    server = Server(argv, args.server_log)
    failures: list[str] = []
    result: dict = {"argv": sys.argv, "server_argv": argv,
                    "settings": {k: v for k, v in vars(args).items()}}
    code: int | None = None
    try:
        server.wait_ready(120)
        host, port = server.host or "127.0.0.1", server.port
        assert port is not None
        rng = random.Random(args.seed)
        sent_total = 0

        # --- calibration: sequential, no invalids; two long prompts first touch both states.
        calib_conv = Conversation(random.Random(rng.random()), 9999, args, use_key=True)
        calib, calib_s = run_phase(host, port, args, [calib_conv], args.calibration_requests + 2,
                                   0.0, long_first=2)
        sent_total += calib.sent
        server.wait_request_lines(sent_total)
        calib_log = parse_log(server.request_lines()[:sent_total])
        # Skip the two long warm-up requests (first touch) and outliers (a stalled request, a
        # scheduling hiccup on a shared machine: over 5x the median) when fitting.
        calib_points = calib_log["completions"][2:]
        median_ms = sorted(c[0] for c in calib_points)[len(calib_points) // 2] if calib_points else 0
        fit_points = [c for c in calib_points if c[0] <= 5 * max(median_ms, 1)]
        fit = fit_service_time(fit_points)
        if fit is not None:
            fit["outliers_dropped"] = len(calib_points) - len(fit_points)
        result["calibration"] = {"requests": calib.sent, "seconds": calib_s,
                                 "statuses": dict(calib.statuses), "fit": fit,
                                 "cache_hits": calib.cached_hits}
        print("calibration: %d sequential requests in %.1f s, %d cache hits; fit %s"
              % (calib.sent, calib_s, calib.cached_hits,
                 "none" if fit is None else
                 "ms = %.2f + %.3f*(prompt-cached) + %.2f*completion (R2 %.2f, mean |err| %.1f ms)"
                 % (fit["intercept_ms"], fit["ms_per_prefill_token"],
                    fit["ms_per_completion_token"], fit["r2"], fit["mean_abs_error_ms"])),
              flush=True)
        if calib.errors or calib.problem_count or set(calib.statuses) - {200}:
            failures.append("calibration: statuses %s, errors %s, problems %s"
                            % (dict(calib.statuses), dict(calib.errors), calib.problems[:3]))

        # --- conversations for the clients; every other client sets prompt_cache_key.
        convs = [Conversation(random.Random(rng.random()), i, args, use_key=(i % 2 == 0))
                 for i in range(args.clients)]

        # --- warm-up: concurrent, then all connections closed.
        warm, warm_s = run_phase(host, port, args, convs, args.warmup_per_client, 0.0)
        sent_total += warm.sent
        server.wait_request_lines(sent_total)
        result["warmup"] = {"requests": warm.sent, "seconds": warm_s,
                            "statuses": dict(warm.statuses), "errors": dict(warm.errors)}
        if warm.errors or warm.problem_count:
            failures.append("warm-up: errors %s, problems %s" % (dict(warm.errors),
                                                                 warm.problems[:3]))
        time.sleep(1.0)
        mem_before = server.memory_kb()
        fds_before = server.open_fds()
        lines_before_main = len(server.request_lines())
        print("warm-up: %d requests in %.1f s %s; server VmRSS %d kB, VmHWM %d kB, %d fds"
              % (warm.sent, warm_s, dict(warm.statuses), mem_before["VmRSS"],
                 mem_before["VmHWM"], fds_before), flush=True)

        # --- main phase, with an RSS sampler alongside.
        samples: list[tuple[float, int]] = []
        stop_sampling = threading.Event()

        def sample() -> None:
            t0 = time.perf_counter()
            while not stop_sampling.wait(1.0):
                try:
                    samples.append((time.perf_counter() - t0, server.memory_kb()["VmRSS"]))
                except OSError:
                    return

        sampler = threading.Thread(target=sample, daemon=True)
        cpu_server0, cpu_self0, cpu_all0 = server.cpu_seconds(), os.times(), system_cpu()
        threads0 = server.thread_times()
        load0 = os.getloadavg()
        sampler.start()
        print("main: %d clients x %d requests, max_tokens %d, queue %d, keep-alive %s ..."
              % (args.clients, args.requests_per_client, args.max_tokens, args.queue,
                 args.keep_alive), flush=True)
        main_stats, main_s = run_phase(host, port, args, convs, args.requests_per_client,
                                       args.invalid_rate)
        stop_sampling.set()
        sampler.join()
        cpu_server = server.cpu_seconds() - cpu_server0
        threads1 = server.thread_times()
        t1 = os.times()
        cpu_self = (t1.user - cpu_self0.user) + (t1.system - cpu_self0.system)
        cpu_busy = [b - a for a, b in zip(cpu_all0, system_cpu())]
        load1 = os.getloadavg()
        sent_total += main_stats.sent
        n_lines = server.wait_request_lines(sent_total)
        time.sleep(1.0)
        mem_after = server.memory_kb()
        fds_after = server.open_fds()
        all_lines = server.request_lines()
        main_log = parse_log(all_lines[lines_before_main:])

        # --- figures
        st = main_stats
        expected_total = args.clients * args.requests_per_client
        n200 = st.statuses.get(200, 0)
        lat_ok = latency_summary(st.latencies_ok)
        lat_all = latency_summary(st.latencies_all)
        # The server's threads in creation order: main, the HTTP I/O threads (started before
        # the model loads), then the backend pool's workers, then the engine (inference) thread.
        # The engine thread runs every request and takes part in every parallel_for (spinning
        # while the workers finish), so its time on a CPU is the engine's busy time whenever
        # it was not waiting for a core, and it is blocked (neither) while the queue is empty.
        tids = sorted(threads1)
        http_count = args.http_threads if args.http_threads is not None else 4
        io_tids = tids[1:1 + http_count]
        compute_tids = tids[1 + http_count:]
        run = {t: threads1[t][0] - threads0.get(t, (0.0, 0.0))[0] for t in tids}
        wait = {t: threads1[t][1] - threads0.get(t, (0.0, 0.0))[1] for t in tids}
        cpu_threads = {"main": run[tids[0]],
                       "http_io": sum(run[t] for t in io_tids),
                       "http_io_waiting_for_cpu": sum(wait[t] for t in io_tids),
                       "pool_workers": sum(run[t] for t in compute_tids[:-1]),
                       "engine": run[compute_tids[-1]] if compute_tids else 0.0,
                       "engine_waiting_for_cpu": wait[compute_tids[-1]] if compute_tids else 0.0,
                       "compute_threads": len(compute_tids)}
        engine = None
        if fit is not None and main_log["completions"]:
            busy_ms = sum(predicted_ms(fit, p, c, n) for _, p, c, n in main_log["completions"])
            mean_engine_ms = busy_ms / len(main_log["completions"])
            engine = {"estimated_busy_s": busy_ms / 1000, "mean_engine_ms": mean_engine_ms,
                      "floor_completions_per_s": 1000 / mean_engine_ms,
                      "measured_completions_per_s": n200 / main_s,
                      "fraction_of_floor": (n200 / main_s) / (1000 / mean_engine_ms),
                      "engine_busy_fraction": busy_ms / 1000 / main_s}
        comp = main_log["completions"]
        rss_growth = (mem_after["VmRSS"] - mem_before["VmRSS"]) / mem_before["VmRSS"]
        result["main"] = {
            "clients": args.clients, "requests_per_client": args.requests_per_client,
            "requests_sent": st.sent, "seconds": main_s,
            "requests_per_s": st.sent / main_s, "completions_per_s": n200 / main_s,
            "statuses": {str(k): v for k, v in sorted(st.statuses.items())},
            "by_kind": {"%s:%s" % k: v for k, v in sorted(st.by_kind.items(), key=str)},
            "connection_errors": dict(st.errors), "connection_error_samples": st.error_samples,
            "problems": st.problems, "problem_count": st.problem_count,
            "connections_opened": st.connects, "server_close_responses": st.server_closes,
            "latency_200": lat_ok, "latency_all": lat_all,
            "cache_hits": st.cached_hits, "cached_tokens": st.cached_tokens,
            "prompt_tokens": st.prompt_tokens, "completion_tokens": st.completion_tokens,
            "mean_prompt_tokens": st.prompt_tokens / n200 if n200 else None,
            "finish_reasons": dict(st.finish),
            "server_log_statuses": {str(k): v for k, v in sorted(main_log["statuses"].items())},
            "server_log_mean_ms_200": (sum(c[0] for c in comp) / len(comp)) if comp else None,
            "engine": engine,
            "cpu_seconds_server": cpu_server, "cpu_seconds_load_script": cpu_self,
            "cpu_seconds_server_threads": cpu_threads,
            "engine_thread_ms_per_completion": (1000 * cpu_threads["engine"] / n200) if n200
            else None,
            "engine_thread_wait_ms_per_completion": (1000 * cpu_threads["engine_waiting_for_cpu"]
                                                     / n200) if n200 else None,
            "engine_thread_idle_fraction": max(0.0, 1 - (cpu_threads["engine"]
                                                         + cpu_threads["engine_waiting_for_cpu"])
                                               / main_s),
            "cpu_seconds_machine_busy": cpu_busy[0], "cpu_seconds_machine_total": cpu_busy[1],
            "cpu_seconds_other_processes": cpu_busy[0] - cpu_server - cpu_self,
            "loadavg_before": load0, "loadavg_after": load1, "cpus": os.cpu_count(),
        }
        result["memory_kb"] = {"before": mem_before, "after": mem_after,
                               "rss_growth_fraction": rss_growth,
                               "rss_samples": samples[:: max(1, len(samples) // 60)],
                               "rss_max_sampled": max((s[1] for s in samples), default=None)}
        result["fds"] = {"before": fds_before, "after": fds_after}
        result["log"] = {"request_lines": n_lines, "requests_sent_total": sent_total}

        # --- requirements
        fivexx = {k: v for k, v in st.statuses.items() if k >= 500}
        if fivexx:
            failures.append("5xx responses: %s" % fivexx)
        log5xx = {k: v for k, v in main_log["statuses"].items() if k >= 500}
        if log5xx and not fivexx:
            failures.append("5xx in the server log: %s" % log5xx)
        if st.errors:
            failures.append("connection errors: %s; e.g. %s" % (dict(st.errors),
                                                                st.error_samples[:3]))
        if st.sent != expected_total:
            failures.append("sent %d requests, expected %d" % (st.sent, expected_total))
        if st.problem_count:
            failures.append("%d responses with the wrong status or body; first: %s"
                            % (st.problem_count, st.problems[:5]))
        if args.queue >= args.clients and st.statuses.get(429):
            failures.append("%d 429s although the queue (%d) holds every client (%d)"
                            % (st.statuses[429], args.queue, args.clients))
        if n_lines != sent_total:
            failures.append("server logged %d request lines, the script sent %d requests"
                            % (n_lines, sent_total))
        if main_log["statuses"] != st.statuses:
            failures.append("server log statuses %s differ from the clients' %s"
                            % (dict(main_log["statuses"]), dict(st.statuses)))
        suspicious = [line for line in server.text_lines() if SUSPICIOUS_RE.search(line)]
        if suspicious:
            failures.append("server log: %d suspicious lines, e.g. %s"
                            % (len(suspicious), suspicious[:3]))
        if abs(rss_growth) > args.rss_tolerance:
            failures.append("VmRSS %d kB -> %d kB (%+.1f%%, limit %.0f%%)"
                            % (mem_before["VmRSS"], mem_after["VmRSS"], 100 * rss_growth,
                               100 * args.rss_tolerance))
        if fds_after > fds_before + 2:
            failures.append("server fds %d -> %d after every connection closed"
                            % (fds_before, fds_after))

        # --- report
        print("main: %d requests in %.1f s = %.1f requests/s (%.1f completions/s)"
              % (st.sent, main_s, st.sent / main_s, n200 / main_s))
        print("  statuses %s; by kind %s" % (dict(sorted(st.statuses.items())),
                                            result["main"]["by_kind"]))
        print("  connection errors %s; connections opened %d; Connection: close responses %d"
              % (dict(st.errors) or 0, st.connects, st.server_closes))
        print("  latency 200: %s" % fmt_ms(lat_ok))
        print("  latency all: %s" % fmt_ms(lat_all))
        if n200:
            print("  200s: mean prompt %.1f tokens, %d cache hits (%d cached tokens), finish %s"
                  % (st.prompt_tokens / n200, st.cached_hits, st.cached_tokens, dict(st.finish)))
        if engine:
            print("  engine: estimated mean %.1f ms per completion -> floor %.1f completions/s; "
                  "measured %.1f (%.0f%% of floor); engine busy ~%.0f%% of the run"
                  % (engine["mean_engine_ms"], engine["floor_completions_per_s"],
                     engine["measured_completions_per_s"], 100 * engine["fraction_of_floor"],
                     100 * engine["engine_busy_fraction"]))
        if n200:
            per = cpu_threads["engine"] / n200
            per_wait = cpu_threads["engine_waiting_for_cpu"] / n200
            print("  engine thread: on a CPU %.1f s = %.1f ms per completion -> floor %.1f "
                  "completions/s; measured %.1f (%.0f%% of it); runnable but waiting for a core "
                  "%.1f s (%.1f ms per completion); idle %.0f%% of the run; %d pool worker(s) "
                  "%.1f s" % (cpu_threads["engine"], 1000 * per, 1 / per if per else float("inf"),
                              n200 / main_s, 100 * (n200 / main_s) * per,
                              cpu_threads["engine_waiting_for_cpu"], 1000 * per_wait,
                              100 * result["main"]["engine_thread_idle_fraction"],
                              cpu_threads["compute_threads"] - 1, cpu_threads["pool_workers"]))
            print("  HTTP I/O threads: on a CPU %.1f s (%.2f ms per request), waiting for a "
                  "core %.1f s" % (cpu_threads["http_io"], 1000 * cpu_threads["http_io"] / st.sent,
                                   cpu_threads["http_io_waiting_for_cpu"]))
        print("  cpu: server %.1f s, this script %.1f s, other processes %.1f s of %.1f "
              "core-seconds (%d cpus x %.1f s wall); loadavg %.1f -> %.1f"
              % (cpu_server, cpu_self, cpu_busy[0] - cpu_server - cpu_self, cpu_busy[1],
                 os.cpu_count(), main_s, load0[0], load1[0]))
        print("  server VmRSS before %d kB, after %d kB (%+.2f%%), max sampled %s kB, "
              "VmHWM %d kB; fds %d -> %d"
              % (mem_before["VmRSS"], mem_after["VmRSS"], 100 * rss_growth,
                 result["memory_kb"]["rss_max_sampled"], mem_after["VmHWM"], fds_before,
                 fds_after))
        print("  server log: %d request lines for %d requests sent (all phases)"
              % (n_lines, sent_total), flush=True)
    finally:
        code = server.stop(60)
        tmp.cleanup()
    result["server_exit_status"] = code
    if code != 0:
        failures.append("server exit status after SIGTERM: %s" % code)
    result["failures"] = failures
    result["passed"] = not failures
    if args.json_out:
        with open(args.json_out, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=2, default=str)
            f.write("\n")
    if failures:
        print("FAIL:")
        for f in failures:
            print("  - " + f)
        return 1
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
