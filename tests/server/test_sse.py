# Raw-socket tests of lily serve's default (openai) mode: SSE streams, sampling, stop strings, logprobs, accepted and refused fields, cancellation.
"""Run one group per process (CTest does):

    python3 test_sse.py --lily build/lily --group stream [-v] [unittest args...]

Groups (one TestCase class and one `lily serve` on a tiny seed-1 checkpoint each, so CTest
runs them in parallel): stream, text, fields, cancel. `--group all` runs everything.

Streams are read byte by byte by the hand-written HTTP/1.1 parser of lily_server_harness.py
(`EventStream`): every HTTP chunk must be exactly one `data: ...\\n\\n` event, every event
strict compact JSON (or `[DONE]`, last). The expected shapes are OpenAI's wire format
(docs/clients.md) and docs/api.md "Streaming"; expected texts come
from the server's own non-streamed answers (a stream must say exactly the same) and from the
token bytes of its logprobs (HF's ByteLevel decoding: the bytes joined, invalid sequences
replaced, special tokens skipped).

Timing: the cancel group measures the decode rate on its own server first and bounds
"promptly" relative to how long the long request would have run (a loaded CI machine slows
both alike); what decides those tests is the log (499 and its reason) and the token counts.

Tests for server bugs these tests found (fixed in http_server.cpp since) carry a "FOUND SERVER BUG" comment.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import unittest

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from lily_server_harness import (  # noqa: E402
    CHAT_PATH,
    SERVED_MODEL,
    Checkpoint,
    EventStream,
    LilyServer,
    chat_body,
    long_text,
    request_bytes,
    rust_debug_quote,
)

LILY: str = ""  # path of the lily binary, from --lily
_checkpoint: Checkpoint | None = None
_vocab: dict | None = None

PARSE = "parsing chat request: "
CHESS = "Name the two colors of a chessboard."
# A user message whose greedy answer on the seed-1 checkpoint ends on <|endoftext|> within 4
# tokens (found by a scan, see tests/oracle/openai/cache.test.mjs); checked where used.
STOP_QUESTION = "Question 3973"
PROMPTS = ["Hello", CHESS, "東京の天気は?", "Écris un poème.", "🙂🙃 emoji",
           "def f(x): return x*2", "1 2 3 4 5", "Tell me a story about a falcon."]


def checkpoint_dir() -> str:
    global _checkpoint
    if _checkpoint is None:
        _checkpoint = Checkpoint(LILY)
    return _checkpoint.path


def vocab() -> dict:
    """The checkpoint's tokenizer.json: {"ids": {token: id}, "special": {id: content}}."""
    global _vocab
    if _vocab is None:
        with open(os.path.join(checkpoint_dir(), "tokenizer.json"), encoding="utf-8") as f:
            tokenizer = json.load(f)
        ids = dict(tokenizer["model"]["vocab"])
        special = {}
        for added in tokenizer["added_tokens"]:
            ids[added["content"]] = added["id"]
            if added["special"]:
                special[added["id"]] = added["content"]
        _vocab = {"ids": ids, "special": special}
    return _vocab


def stop_token_bias() -> dict:
    """logit_bias that bans the model's stop tokens (so a request runs to max_tokens)."""
    ids = vocab()["ids"]
    return {str(ids["<|endoftext|>"]): -100, str(ids["<|im_end|>"]): -100}


def tearDownModule():  # noqa: N802 (unittest's name)
    global _checkpoint
    if _checkpoint is not None:
        _checkpoint.cleanup()
        _checkpoint = None


def body_of(content: str = "Hello", max_tokens: int | None = 8, **fields) -> bytes:
    return chat_body(content, max_tokens=max_tokens, **fields)


def lossy_text(entries: list[dict]) -> str:
    """The content HF tokenizers would decode from logprob entries: their bytes joined, one
    U+FFFD per maximal invalid sequence (Python's "replace" = Rust's from_utf8_lossy), special
    tokens skipped."""
    special = set(vocab()["special"].values())
    data = b"".join(bytes(e["bytes"]) for e in entries if e["token"] not in special)
    return data.decode("utf-8", errors="replace")


class StreamResult:
    """A stream read to its end: the raw events, the JSON chunks and what they add up to."""

    def __init__(self, response, stream: EventStream, events: list[bytes]):
        self.response = response
        self.stream = stream
        self.raw = events
        self.done = events[-1] == b"[DONE]" if events else False
        self.chunks = [json.loads(e.decode("utf-8")) for e in events if e != b"[DONE]"]
        choices = [c["choices"][0] for c in self.chunks if c.get("choices")]
        self.deltas = [c["delta"].get("content") for c in choices[1:-1]]
        self.content = "".join(d for d in self.deltas if d is not None)
        self.finish_reason = choices[-1]["finish_reason"] if choices else None
        usage = [c["usage"] for c in self.chunks if c.get("usage")]
        self.usage = usage[-1] if usage else None
        self.logprobs = [entry for c in choices if c.get("logprobs")
                         for entry in c["logprobs"]["content"]]


class SseTest(unittest.TestCase):
    """One `lily serve` (default openai mode) per class, started with SERVER_ARGS."""

    SERVER_ARGS: tuple[str, ...] = ("--threads", "1", "--max-seq", "4096")
    STRICT = False
    server: LilyServer

    @classmethod
    def setUpClass(cls):
        cls.server = LilyServer(LILY, checkpoint_dir(), *cls.SERVER_ARGS,
                                strict=cls.STRICT).start()

    @classmethod
    def tearDownClass(cls):
        code = cls.server.stop()
        if code != 0:
            raise AssertionError(f"server exited {code} on SIGTERM:\n{cls.server.log_text()}")

    def tearDown(self):
        if self.server.proc.poll() is not None:
            self.fail(f"server died (exit {self.server.proc.returncode}):\n"
                      f"{self.server.log_text()}")

    # --- requests
    def post(self, body: bytes, server: LilyServer | None = None):
        return (server or self.server).exchange(request_bytes("POST", CHAT_PATH, body),
                                                timeout=120)

    def complete(self, content: str = "Hello", max_tokens: int | None = 8, **fields) -> dict:
        """A non-streamed completion in openai mode's shape (choice with logprobs)."""
        response = self.post(body_of(content, max_tokens, **fields))
        self.assertEqual(response.status, 200, response.body)
        body = response.json()
        self.assertEqual(list(body), ["id", "object", "created", "model", "choices", "usage"])
        self.assertEqual(body["object"], "chat.completion")
        self.assertEqual(len(body["choices"]), 1)
        choice = body["choices"][0]
        self.assertEqual(list(choice), ["index", "message", "logprobs", "finish_reason"])
        self.assertEqual(list(choice["message"]), ["role", "content"])
        if not fields.get("logprobs"):
            self.assertIsNone(choice["logprobs"])
        else:
            self.assertEqual(list(choice["logprobs"]), ["content", "refusal"])
            self.assertIsNone(choice["logprobs"]["refusal"])
        usage = body["usage"]
        self.assertEqual(usage["total_tokens"], usage["prompt_tokens"] + usage["completion_tokens"])
        return body

    def near_capacity_prompt(self, room: int = 30) -> tuple[str, int]:
        """A user message whose prompt leaves about `room` tokens of the server's 4096 (and its
        prompt token count): the words are scaled from a measured prompt."""
        words = 300
        for _ in range(4):
            text = long_text(words)
            prompt = self.complete(text, 1)["usage"]["prompt_tokens"]
            if 4096 - 2 * room <= prompt <= 4096 - room:
                return text, prompt
            words = max(1, int(words * (4096 - 1.5 * room) / prompt))
        self.fail(f"no prompt near capacity (last: {prompt} tokens of {words} words)")

    def assert_budget_is_clamped(self, **fields):
        """Openai mode: a budget beyond max_seq is clamped to what fits after the prompt (the
        answer ends with "length"); a prompt with no room for one token is refused."""
        text, prompt = self.near_capacity_prompt()
        room = 4096 - prompt - 1
        fields = dict(fields)
        budget = fields.pop("max_tokens", None)
        body = self.post(body_of(text, budget, logit_bias=stop_token_bias(), temperature=0,
                                 **fields))
        self.assertEqual(body.status, 200, body.body)
        answer = body.json()
        self.assertEqual(answer["usage"]["completion_tokens"], room)
        self.assertEqual(answer["choices"][0]["finish_reason"], "length")
        too_long = long_text(20000)
        response = self.post(body_of(too_long, 4))
        self.assertEqual(response.status, 400, response.body)
        error = response.json()["error"]
        self.assertEqual((error["param"], error["code"]), ("messages", "context_length_exceeded"))
        self.assertRegex(error["message"], r"^request needs \d+ tokens but server max_seq is 4096$")

    def open_stream(self, body: bytes, server: LilyServer | None = None,
                    conn=None, timeout: float = 120):
        """Sends a streamed request; returns (connection, head, EventStream) once the head is in."""
        conn = conn or (server or self.server).connect(timeout=timeout)
        conn.send(request_bytes("POST", CHAT_PATH, body))
        head = conn.read_head()
        self.assertEqual(head.status, 200, head.raw_head)
        return conn, head, EventStream(conn, head)

    def stream(self, content: str = "Hello", max_tokens: int | None = 8, *,
               server: LilyServer | None = None, conn=None, **fields) -> StreamResult:
        """A streamed completion read to its end and checked against the wire format."""
        fields.setdefault("stream", True)
        server = server or self.server
        own = conn is None
        start = server.mark()
        conn, head, events = self.open_stream(body_of(content, max_tokens, **fields), server, conn)
        try:
            raw = events.read_all()
            if own:
                # Closed only once the server has logged the request: a close right after the
                # last chunk can make it log 499 (see test_a_stream_read_to_its_end_is_logged_200).
                server.wait_line(f"^POST {re.escape(CHAT_PATH)} \\d{{3}} ", start)
        finally:
            if own:
                conn.close()
        result = StreamResult(head, events, raw)
        options = fields.get("stream_options") or {}
        self.check_stream(result, include_usage=bool(options.get("include_usage")),
                          logprobs=bool(fields.get("logprobs")))
        return result

    def precondition(self, holds: bool, message: str):
        """A fact of the tiny seed-1 checkpoint a test builds on. With LILY_TEST_MODEL naming
        another checkpoint (tools/gpu/run.sh), or LILY_TEST_NUMERICS naming other arithmetic
        than the GCC build's CPU kernels the facts were found with (tools/tsan.sh: clang), a
        test whose fact does not hold there is skipped, visibly; otherwise it fails."""
        if holds:
            return
        if os.environ.get("LILY_TEST_MODEL"):
            self.skipTest(f"SKIPPED: {message} does not hold for LILY_TEST_MODEL="
                          f"{os.environ['LILY_TEST_MODEL']}")
        if os.environ.get("LILY_TEST_NUMERICS"):
            self.skipTest(f"SKIPPED: {message} does not hold with LILY_TEST_NUMERICS="
                          f"{os.environ['LILY_TEST_NUMERICS']}")
        self.fail(f"precondition: {message}")

    # --- the wire format
    def check_stream(self, result: StreamResult, include_usage: bool, logprobs: bool):
        """OpenAI's chunk sequence, exactly (docs/clients.md, docs/api.md Streaming)."""
        head = result.response
        self.assertEqual(head.header("Cache-Control"), "no-cache")
        # Each write of the server is one HTTP chunk, and each chunk one event.
        self.assertEqual(len(result.stream.chunks), len(result.raw))
        for chunk, event in zip(result.stream.chunks, result.raw):
            self.assertEqual(chunk, b"data: " + event + b"\n\n")
        self.assertTrue(result.done, f"the stream does not end with data: [DONE]: {result.raw[-3:]}")
        self.assertEqual(result.raw.count(b"[DONE]"), 1)
        chunks = result.chunks
        self.assertGreaterEqual(len(chunks), 2)
        keys = ["id", "object", "created", "model", "choices"] + (["usage"] if include_usage else [])
        first = chunks[0]
        self.assertRegex(first["id"], r"^chatcmpl-\d+-\d+$")
        self.assertEqual(first["id"].split("-")[1], str(first["created"]))
        self.assertLessEqual(abs(first["created"] - time.time()), 300)
        for event, chunk in zip(result.raw, chunks):
            # compact JSON, non-ASCII raw (the server writes nothing Python would not)
            self.assertEqual(json.dumps(chunk, ensure_ascii=False, separators=(",", ":")).encode(),
                             event)
            self.assertEqual(list(chunk), keys, chunk)
            self.assertEqual(chunk["object"], "chat.completion.chunk")
            for name in ("id", "created", "model"):
                self.assertEqual(chunk[name], first[name], f"{name} changes between chunks")
            self.assertEqual(chunk["model"], SERVED_MODEL)
        choice_chunks = chunks[:-1] if include_usage else chunks
        for chunk in choice_chunks:
            self.assertEqual(len(chunk["choices"]), 1, chunk)
            self.assertEqual(list(chunk["choices"][0]),
                             ["index", "delta", "logprobs", "finish_reason"], chunk)
            self.assertEqual(chunk["choices"][0]["index"], 0)
            if include_usage:
                self.assertIsNone(chunk["usage"], chunk)
        self.assertEqual(chunks[0]["choices"][0], {
            "index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
            "finish_reason": None})
        final = choice_chunks[-1]["choices"][0]
        self.assertEqual(final["delta"], {})
        self.assertIsNone(final["logprobs"])
        self.assertIn(final["finish_reason"], ("stop", "length"))
        for chunk in choice_chunks[1:-1]:
            choice = chunk["choices"][0]
            self.assertEqual(list(choice["delta"]), ["content"], chunk)
            self.assertIsInstance(choice["delta"]["content"], str)
            self.assertIsNone(choice["finish_reason"])
            if logprobs:
                self.assertEqual(list(choice["logprobs"]), ["content", "refusal"])
                self.assertIsNone(choice["logprobs"]["refusal"])
                self.assertGreaterEqual(len(choice["logprobs"]["content"]), 1)
            else:
                self.assertIsNone(choice["logprobs"])
                self.assertNotEqual(choice["delta"]["content"], "", "an empty content chunk")
        if include_usage:
            last = chunks[-1]
            self.assertEqual(last["choices"], [])
            usage = last["usage"]
            self.assertEqual(list(usage), ["prompt_tokens", "completion_tokens", "total_tokens",
                                           "prompt_tokens_details"])
            self.assertEqual(list(usage["prompt_tokens_details"]), ["cached_tokens"])
            self.assertEqual(usage["total_tokens"],
                             usage["prompt_tokens"] + usage["completion_tokens"])

    def check_logprob_entries(self, entries: list[dict], top: int):
        for entry in entries:
            self.assertEqual(list(entry), ["token", "logprob", "bytes", "top_logprobs"], entry)
            self.assertLessEqual(entry["logprob"], 0.0)
            self.assertEqual(bytes(entry["bytes"]).decode("utf-8", errors="replace"),
                             entry["token"])
            self.assertEqual(len(entry["top_logprobs"]), top, entry)
            values = [t["logprob"] for t in entry["top_logprobs"]]
            self.assertEqual(values, sorted(values, reverse=True), entry)
            for alt in entry["top_logprobs"]:
                self.assertEqual(list(alt), ["token", "logprob", "bytes"])
                self.assertLessEqual(alt["logprob"], 0.0)

    def completion_log_regex(self, usage: dict, extra: str = "") -> str:
        return (f"^POST {re.escape(CHAT_PATH)} 200 \\d+ms prompt={usage['prompt_tokens']} "
                f"cached={usage['prompt_tokens_details']['cached_tokens']} "
                f"completion={usage['completion_tokens']} tok/s=\\d+\\.\\d{re.escape(extra)}$")

    def assert_error(self, response, status: int, message: str, param=None, code=None):
        self.assertEqual(response.status, status, response.body)
        body = response.json()  # Content-Type: application/json is checked by the harness
        type_ = "server_error" if status >= 500 or status == 429 else "invalid_request_error"
        self.assertEqual(body, {"error": {"message": message, "type": type_, "param": param,
                                          "code": code}})

    def assert_refused(self, body: bytes, message: str, param=None, code=None,
                       server: LilyServer | None = None):
        server = server or self.server
        start = server.mark()
        self.assert_error(self.post(body, server), 400, message, param, code)
        server.wait_line(f"^POST {re.escape(CHAT_PATH)} 400 \\d+ms" +
                         re.escape(" error=" + rust_debug_quote(message)) + "$", start)


# ------------------------------------------------------------------------------------------
class StreamTests(SseTest):
    """The stream's chunks, their order and shapes, usage, errors before the stream."""

    def test_chunk_order_and_shapes(self):
        start = self.server.mark()
        plain = self.complete("Shapes please", max_tokens=8)
        began = time.time()
        result = self.stream("Shapes please", max_tokens=8)
        self.assertEqual(result.response.header("Transfer-Encoding"), "chunked")
        self.assertIsNone(result.response.header("Content-Length"))
        # Without include_usage no chunk has a usage key at all (checked by check_stream).
        for chunk in result.chunks:
            self.assertNotIn("usage", chunk)
        self.assertLessEqual(abs(result.chunks[0]["created"] - began), 5)
        self.assertEqual(result.content, plain["choices"][0]["message"]["content"])
        self.assertEqual(result.finish_reason, plain["choices"][0]["finish_reason"])
        self.assertEqual(result.finish_reason, "length")
        # role chunk, one chunk per token with text (8 here: no token of this answer is held
        # back or empty; checked against the non-streamed logprobs), finish chunk
        entries = self.complete("Shapes please", 8, logprobs=True)["choices"][0]["logprobs"]["content"]
        with_text = sum(1 for e in entries if e["token"] and "\ufffd" not in e["token"])
        if with_text == len(entries):
            self.assertEqual(len(result.chunks), 2 + len(entries))
        # a fresh id: the non-streamed answer before it had another one
        self.assertNotEqual(result.chunks[0]["id"], plain["id"])
        self.assertGreater(int(result.chunks[0]["id"].rsplit("-", 1)[1]),
                           int(plain["id"].rsplit("-", 1)[1]))
        self.server.wait_line(self.completion_log_regex(plain["usage"]), start)
        lines = self.server.wait_lines("POST ", 3, start)
        self.assertEqual(len(lines), 3, lines)

    def test_include_usage_equals_the_non_streamed_usage(self):
        for prompt, max_tokens in (("Usage one", 6), (CHESS, 12), (STOP_QUESTION, 4)):
            with self.subTest(prompt=prompt):
                plain = self.complete(prompt, max_tokens)
                start = self.server.mark()
                result = self.stream(prompt, max_tokens, stream_options={"include_usage": True})
                # The same counts; cached_tokens may differ (the second request reuses the
                # first's snapshot; the log line check below ties it to the server's count).
                drop_cache = lambda u: {k: v for k, v in u.items() if k != "prompt_tokens_details"}
                self.assertEqual(drop_cache(result.usage), drop_cache(plain["usage"]))
                self.assertLess(result.usage["prompt_tokens_details"]["cached_tokens"],
                                result.usage["prompt_tokens"])
                self.assertEqual(result.content, plain["choices"][0]["message"]["content"])
                self.assertEqual(result.finish_reason, plain["choices"][0]["finish_reason"])
                self.server.wait_line(self.completion_log_regex(result.usage), start)
        # include_usage false is as if absent; stream_options without stream has no effect.
        result = self.stream("Usage one", 6, stream_options={"include_usage": False})
        self.assertTrue(all("usage" not in c for c in result.chunks))
        plain = self.complete("Usage one", 6, stream_options={"include_usage": True})
        self.assertEqual(plain["object"], "chat.completion")

    def test_stop_token_ends_the_stream_with_stop(self):
        plain = self.complete(STOP_QUESTION, 4)
        self.precondition(plain["choices"][0]["finish_reason"] == "stop",
                          f"{STOP_QUESTION!r} stops within 4 tokens on seed 1")
        result = self.stream(STOP_QUESTION, 4, stream_options={"include_usage": True})
        self.assertEqual(result.finish_reason, "stop")
        self.assertEqual(result.content, plain["choices"][0]["message"]["content"])
        self.assertNotIn("<|", result.content)  # the stop token is counted, not shown
        self.assertEqual(result.usage["completion_tokens"], plain["usage"]["completion_tokens"])

    def test_logprobs_in_chunks(self):
        plain = self.complete(CHESS, 10, logprobs=True, top_logprobs=3)
        result = self.stream(CHESS, 10, logprobs=True, top_logprobs=3)
        expected = plain["choices"][0]["logprobs"]["content"]
        self.assertEqual(len(expected), 10)
        self.check_logprob_entries(expected, 3)
        self.assertEqual(result.logprobs, expected)
        self.assertEqual(result.content, plain["choices"][0]["message"]["content"])
        self.assertEqual(lossy_text(expected), result.content)
        for entry in expected:  # greedy: the chosen token is the most likely one
            self.assertEqual(entry["top_logprobs"][0]["logprob"], entry["logprob"])
        # logprobs without top_logprobs: empty top lists
        result = self.stream(CHESS, 3, logprobs=True)
        self.assertEqual([e["top_logprobs"] for e in result.logprobs], [[], [], []])
        self.assertEqual([e["token"] for e in result.logprobs],
                         [e["token"] for e in expected[:3]])
        # top_logprobs 20 is the maximum, 21 is refused
        result = self.stream(CHESS, 2, logprobs=True, top_logprobs=20)
        self.check_logprob_entries(result.logprobs, 20)

    def test_errors_before_the_stream_are_plain_json(self):
        cases = [
            ({"temperature": 3},
             PARSE + "temperature must be a number in [0, 2], found number 3", "temperature"),
            ({"top_p": 0}, PARSE + "top_p must be a number in (0, 1], found number 0", "top_p"),
            ({"top_logprobs": 2}, "top_logprobs requires logprobs: true", "top_logprobs"),
            ({"logprobs": True, "top_logprobs": 21},
             PARSE + "top_logprobs must be an integer in [0, 20], found number 21", "top_logprobs"),
            ({"stop": ["a"] * 17}, PARSE + "stop has 17 strings, at most 16 allowed", "stop"),
            ({"stream_options": {"include_usage": 1}},
             PARSE + "stream_options.include_usage must be true, false or null, found number 1",
             "stream_options.include_usage"),
        ]
        for fields, message, param in cases:
            with self.subTest(fields=fields):
                self.assert_refused(body_of("Bad", 4, stream=True, **fields), message, param)
        self.assert_refused(body_of("Bad", 4, stream=True, model="gpt-4o"),
                            f'unknown model "gpt-4o"; this server exposes only {SERVED_MODEL}',
                            "model", "model_not_found")
        self.assert_budget_is_clamped(max_tokens=5000, stream=False)

    def test_http_1_0_stream_ends_by_closing(self):
        with self.server.connect(timeout=60) as conn:
            conn.send(request_bytes("POST", CHAT_PATH, body_of(CHESS, 6, stream=True),
                                    version="HTTP/1.0"))
            head = conn.read_head()
            self.assertEqual((head.version, head.status), ("HTTP/1.0", 200))
            self.assertEqual(head.header("Content-Type"), "text/event-stream")
            self.assertIsNone(head.header("Transfer-Encoding"))
            self.assertIsNone(head.header("Content-Length"))
            body = conn.wait_closed(60)
        events = re.findall(rb"data: ([^\n]*)\n\n", body)
        self.assertEqual(b"".join(b"data: " + e + b"\n\n" for e in events), body)
        self.assertEqual(events[-1], b"[DONE]")
        chunks = [json.loads(e) for e in events[:-1]]
        content = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
        self.assertEqual(content, self.complete(CHESS, 6)["choices"][0]["message"]["content"])

    def test_keep_alive_after_a_stream(self):
        with self.server.connect(timeout=60) as conn:
            first = self.stream("Keep alive", 4, conn=conn)
            second = self.stream("Keep alive", 4, conn=conn, stream_options={"include_usage": True})
            self.assertEqual(first.content, second.content)
            self.assertNotEqual(first.chunks[0]["id"], second.chunks[0]["id"])
            conn.send(request_bytes("POST", CHAT_PATH, body_of("Keep alive", 4)))
            plain = conn.read_response()
            self.assertEqual(plain.json()["choices"][0]["message"]["content"], first.content)

    def test_greedy_stream_equals_the_non_streamed_answer(self):
        for prompt in PROMPTS:
            with self.subTest(prompt=prompt):
                plain = self.complete(prompt, 24)
                result = self.stream(prompt, 24, stream_options={"include_usage": True})
                self.assertEqual(result.content, plain["choices"][0]["message"]["content"])
                self.assertEqual(result.finish_reason, plain["choices"][0]["finish_reason"])
                self.assertEqual(result.usage["completion_tokens"],
                                 plain["usage"]["completion_tokens"])


# ------------------------------------------------------------------------------------------
class TextTests(SseTest):
    """What the text says: UTF-8 across tokens, stop strings, sampling equivalences."""

    def check_streams_like_plain(self, prompt: str, max_tokens: int, **fields) -> StreamResult:
        plain = self.complete(prompt, max_tokens, logprobs=True, **fields)
        content = plain["choices"][0]["message"]["content"]
        entries = plain["choices"][0]["logprobs"]["content"]
        self.assertEqual(content, lossy_text(entries), "content = the tokens' bytes, decoded")
        result = self.stream(prompt, max_tokens, **fields)
        self.assertEqual(result.content, content)
        return result

    def test_utf8_character_forced_across_two_tokens(self):
        # "é" is C3 A9: the ByteLevel tokens "Ã" (byte C3) and "©" (A9). Biasing both (and
        # nothing else) makes every token one of the two, in the model's order: pairs C3 A9
        # make an é across two tokens, a lone byte a U+FFFD.
        ids = vocab()["ids"]
        bias = {str(ids["Ã"]): 100, str(ids["©"]): 100}
        fields = {"temperature": 0, "logit_bias": bias}
        plain = self.complete("Accents", 24, logprobs=True, **fields)
        entries = plain["choices"][0]["logprobs"]["content"]
        data = b"".join(bytes(e["bytes"]) for e in entries)
        self.assertEqual(set(data), {0xC3, 0xA9}, data)
        self.precondition(b"\xc3\xa9" in data, "the biased answer has an é split over two tokens")
        expected = data.decode("utf-8", errors="replace")
        self.assertEqual(plain["choices"][0]["message"]["content"], expected)
        self.assertEqual([e["token"] for e in entries],
                         ["\ufffd"] * len(entries), "a lone byte token is U+FFFD in token")
        for logprobs in (False, True):
            with self.subTest(logprobs=logprobs):
                result = self.stream("Accents", 24, logprobs=logprobs, **fields)
                self.assertEqual(result.content, expected)
                # é never arrives in halves: a delta is whole characters of the answer
                self.assertIn("é", result.content)
                self.assertEqual(result.content.count("\ufffd"), expected.count("\ufffd"))
                if logprobs:
                    self.assertEqual([bytes(e["bytes"]) for e in result.logprobs],
                                     [bytes(e["bytes"]) for e in entries])

    def test_utf8_characters_split_by_the_model(self):
        # Greedy answers of the seed-1 checkpoint with a valid multi-byte character whose bytes
        # fall into two tokens (found by a scan; checked here).
        split_found = 0
        for prompt in (CHESS, "def f(x): return x*2", "1 2 3 4 5"):
            with self.subTest(prompt=prompt):
                plain = self.complete(prompt, 32, logprobs=True)
                entries = plain["choices"][0]["logprobs"]["content"]
                split_found += len(split_characters(entries))
                self.check_streams_like_plain(prompt, 32)
        self.precondition(split_found > 0, "a greedy answer splits a character over two tokens")

    def stop_case(self, prompt: str, max_tokens: int = 40):
        """A greedy answer and a stop string inside it that spans a token boundary: returns
        (answer, entries, stop, offset of its first occurrence, tokens needed to complete it)."""
        plain = self.complete(prompt, max_tokens, logprobs=True, logit_bias=stop_token_bias(),
                              temperature=0)
        text = plain["choices"][0]["message"]["content"]
        entries = plain["choices"][0]["logprobs"]["content"]
        self.assertEqual(len(entries), max_tokens)
        data = b""
        for i in range(len(entries) - 1):
            data += bytes(entries[i]["bytes"])
            a, b = entries[i]["token"], entries[i + 1]["token"]
            if i < 2 or not all(t.isascii() and t.isprintable() and len(t) >= 2 for t in (a, b)):
                continue
            # The text up to this token boundary (a whole number of characters: a is ASCII).
            before = data.decode("utf-8", errors="replace")
            self.assertTrue(text.startswith(before), (text, before))
            stop = a[-2:] + b[:2]
            at = len(before) - 2
            if text.find(stop) == at:
                return text, entries, stop, at, i + 2
        self.fail(f"no stop string candidate in {text!r}")

    def test_stop_string_across_tokens_is_cut_and_held_back(self):
        text, entries, stop, at, needed = self.stop_case("Stop strings")
        fields = {"logit_bias": stop_token_bias(), "temperature": 0}
        for stops in ([stop], stop, ["\u2603never", stop]):
            with self.subTest(stop=stops):
                plain = self.complete("Stop strings", 40, stop=stops, **fields)
                self.assertEqual(plain["choices"][0]["message"]["content"], text[:at])
                self.assertEqual(plain["choices"][0]["finish_reason"], "stop")
                self.assertEqual(plain["usage"]["completion_tokens"], needed)
                result = self.stream("Stop strings", 40, stop=stops,
                                     stream_options={"include_usage": True}, **fields)
                # The deltas add up to exactly the text before the stop string: no delta ever
                # carried a part of it (what was sent cannot be taken back).
                self.assertEqual(result.content, text[:at])
                self.assertEqual(result.finish_reason, "stop")
                self.assertEqual(result.usage, plain["usage"])
                # Hold-back: after each delta, the text sent so far never ends with a part
                # of a stop string that could still complete.
                sent = ""
                for delta in result.deltas:
                    sent += delta
                    for string in ([stops] if isinstance(stops, str) else stops):
                        for k in range(1, len(string)):
                            self.assertFalse(sent.endswith(string[:k]), (sent, string[:k]))
                if stops == [stop]:
                    sys.stderr.write(f"[stop] {stop!r} at {at} of {text[:at + 8]!r}..., last "
                                     f"deltas {result.deltas[-3:]}\n")

    def test_a_stop_string_that_never_completes_releases_the_held_text(self):
        text, entries, stop, at, needed = self.stop_case("Stop strings")
        almost = stop + "\u2603"  # the first part matches, the last character never comes
        self.assertNotIn("\u2603", text)
        fields = {"logit_bias": stop_token_bias(), "temperature": 0}
        plain = self.complete("Stop strings", 40, stop=almost, **fields)
        self.assertEqual(plain["choices"][0]["message"]["content"], text)
        self.assertEqual(plain["choices"][0]["finish_reason"], "length")
        result = self.stream("Stop strings", 40, stop=[almost, "\u2603\u2603"], **fields)
        self.assertEqual(result.content, text)
        self.assertEqual(result.finish_reason, "length")
        # A stop string at the very start: nothing to say, no content chunk at all.
        result = self.stream("Stop strings", 40, stop=text[:3], **fields)
        self.assertEqual(result.content, "")
        self.assertEqual(len(result.chunks), 2)
        self.assertEqual(result.finish_reason, "stop")
        # The stop string cut also where it ends the last allowed token.
        result = self.stream("Stop strings", needed, stop=stop, **fields)
        self.assertEqual((result.content, result.finish_reason), (text[:at], "stop"))

    def test_temperature_zero_is_the_greedy_answer(self):
        for prompt in (CHESS, "Temperature zero"):
            with self.subTest(prompt=prompt):
                greedy = self.complete(prompt, 16, logprobs=True, top_logprobs=2)
                for fields in ({"temperature": 0}, {"temperature": 0, "top_p": 0.5, "seed": 9},
                               {"temperature": 0.0, "top_k": 1}):
                    zero = self.complete(prompt, 16, logprobs=True, top_logprobs=2, **fields)
                    self.assertEqual(zero["choices"][0]["logprobs"]["content"],
                                     greedy["choices"][0]["logprobs"]["content"], fields)
                    self.assertEqual(zero["choices"][0]["message"]["content"],
                                     greedy["choices"][0]["message"]["content"])
                result = self.stream(prompt, 16, temperature=0)
                self.assertEqual(result.content, greedy["choices"][0]["message"]["content"])

    def test_seeds(self):
        fields = {"temperature": 1, "logit_bias": stop_token_bias()}
        first = self.complete("Seeded", 16, seed=42, logprobs=True, **fields)
        again = self.complete("Seeded", 16, seed=42, logprobs=True, **fields)
        tokens = [e["bytes"] for e in first["choices"][0]["logprobs"]["content"]]
        self.assertEqual([e["bytes"] for e in again["choices"][0]["logprobs"]["content"]], tokens)
        self.assertEqual(again["choices"][0]["message"]["content"],
                         first["choices"][0]["message"]["content"])
        # The same seed streamed: the same text.
        result = self.stream("Seeded", 16, seed=42, **fields)
        self.assertEqual(result.content, first["choices"][0]["message"]["content"])
        # Different seeds: not all the same answer.
        answers = {self.complete("Seeded", 16, seed=seed, **fields)["choices"][0]["message"]["content"]
                   for seed in (1, 2, 3, 4)}
        self.assertGreater(len(answers), 1, answers)
        # At temperature 1 the answer is not simply the greedy one.
        greedy = self.complete("Seeded", 16, temperature=0, logit_bias=stop_token_bias())
        answers.add(first["choices"][0]["message"]["content"])
        self.assertTrue(answers - {greedy["choices"][0]["message"]["content"]})
        # Negative and 2^64-1 seeds are accepted (two's complement) and reproducible.
        for seed in (-1, 18446744073709551615):
            a = self.complete("Seeded", 6, seed=seed, **fields)
            b = self.complete("Seeded", 6, seed=seed, **fields)
            self.assertEqual(a["choices"][0]["message"]["content"],
                             b["choices"][0]["message"]["content"])
        neg = self.complete("Seeded", 6, seed=-1, **fields)
        top = self.complete("Seeded", 6, seed=18446744073709551615, **fields)
        self.assertEqual(neg["choices"][0]["message"]["content"],
                         top["choices"][0]["message"]["content"], "-1 is 2^64-1")

    def test_logit_bias_forces_and_bans(self):
        ids = vocab()["ids"]
        forced = self.complete("Bias", 5, temperature=0, logit_bias={str(ids["ab"]): 100})
        self.assertEqual(forced["choices"][0]["message"]["content"], "ab" * 5)
        greedy = self.complete(CHESS, 1, logprobs=True)["choices"][0]["logprobs"]["content"][0]
        first_id = ids.get(byte_level(bytes(greedy["bytes"])))
        self.assertIsNotNone(first_id, greedy)
        banned = self.complete(CHESS, 1, temperature=0, logprobs=True,
                               logit_bias={str(first_id): -100})
        self.assertNotEqual(banned["choices"][0]["logprobs"]["content"][0]["token"],
                            greedy["token"])

    def test_sampling_fields_are_accepted(self):
        for fields in ({"temperature": 0.7, "top_p": 0.8, "top_k": 20, "min_p": 0.05,
                        "presence_penalty": 1.5, "frequency_penalty": 0.5,
                        "repetition_penalty": 1.1, "seed": 3},
                       {"top_k": -1, "temperature": 2}, {"presence_penalty": -2},
                       {"frequency_penalty": 2}, {"repetition_penalty": 2}, {"min_p": 1}):
            with self.subTest(fields=fields):
                body = self.complete("Sampling", 6, **fields)
                self.assertLessEqual(body["usage"]["completion_tokens"], 6)
                result = self.stream("Sampling", 6, **fields)
                self.assertIn(result.finish_reason, ("stop", "length"))


def byte_level(data: bytes) -> str:
    """GPT-2's ByteLevel spelling of bytes (the vocabulary's keys: " k" is "Ġk")."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    table = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return "".join(table[b] for b in data)


def split_characters(entries: list[dict]) -> list[str]:
    """The valid multi-byte characters of the joined token bytes whose bytes lie in two or more
    tokens."""
    data = b""
    bounds = set()
    for entry in entries:
        data += bytes(entry["bytes"])
        bounds.add(len(data))
    found = []
    i = 0
    while i < len(data):
        lead = data[i]
        n = 2 if 0xC2 <= lead <= 0xDF else 3 if 0xE0 <= lead <= 0xEF else \
            4 if 0xF0 <= lead <= 0xF4 else 1
        if n > 1:
            try:
                character = data[i:i + n].decode("utf-8")
            except UnicodeDecodeError:
                i += 1
                continue
            if any(i < b < i + n for b in bounds):
                found.append(character)
            i += n
        else:
            i += 1
    return found


# ------------------------------------------------------------------------------------------
class FieldTests(SseTest):
    """Fields accepted and ignored, refused by name, max_completion_tokens, --strict."""

    strict_server: LilyServer

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.strict_server = LilyServer(LILY, checkpoint_dir(), *cls.SERVER_ARGS,
                                       strict=True).start()

    @classmethod
    def tearDownClass(cls):
        code = cls.strict_server.stop()
        super().tearDownClass()
        if code != 0:
            raise AssertionError(f"strict server exited {code}")

    def test_accepted_extras_answer_200_and_are_logged_as_ignored(self):
        plain = self.complete("Extras", 6)
        extras = {"user": {"id": "u-1", "name": "Open WebUI"}, "metadata": {"k": "v"},
                  "store": True, "parallel_tool_calls": False, "service_tier": "auto",
                  "zeta_unknown": [1, {"x": None}]}
        for stream in (False, True):
            with self.subTest(stream=stream):
                start = self.server.mark()
                if stream:
                    result = self.stream("Extras", 6, stream_options={"include_usage": True},
                                         **extras)
                    content, usage = result.content, result.usage
                else:
                    body = self.complete("Extras", 6, **extras)
                    content, usage = body["choices"][0]["message"]["content"], body["usage"]
                self.assertEqual(content, plain["choices"][0]["message"]["content"])
                self.server.wait_line(self.completion_log_regex(
                    usage, ' ignored="metadata,service_tier,store,user,zeta_unknown"'), start)
        # A string user, null extras (= absent), harmless values of known features.
        start = self.server.mark()
        body = self.complete("Extras", 6, user="someone", metadata=None, tools=[],
                             tool_choice="none", response_format={"type": "text"},
                             stream_options={"continuous_usage_stats": True})
        self.assertEqual(body["choices"][0]["message"]["content"],
                         plain["choices"][0]["message"]["content"])
        self.server.wait_line(self.completion_log_regex(
            body["usage"], ' ignored="stream_options.continuous_usage_stats,user"'), start)
        # Nothing ignored: no ignored= at all.
        start = self.server.mark()
        body = self.complete("Extras", 6)
        self.server.wait_line(self.completion_log_regex(body["usage"]), start)

    def test_extras_of_the_wrong_type_are_refused(self):
        self.assert_refused(body_of("Extras", 4, store="yes"),
                            PARSE + 'store must be true, false or null, found string "yes"', "store")
        self.assert_refused(body_of("Extras", 4, user=5),
                            PARSE + "user must be a string or an object, found number 5", "user")

    def test_refused_fields_are_named(self):
        tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
        image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
        cases = [
            ({"functions": [{"name": "f"}]}, '"functions" is not supported yet', "functions"),
            ({"response_format": {"type": "json_object"}},
             '"response_format" of type "json_object" is not supported yet', "response_format"),
            ({"response_format": {"type": "json_schema",
                                  "json_schema": {"name": "x", "schema": {"type": "object"}}}},
             '"response_format" of type "json_schema" is not supported yet', "response_format"),
            ({"n": 2}, "n > 1 is not supported", "n"),
            ({"tool_choice": "required"}, 'tool_choice "required" needs tools', "tool_choice"),
            ({"tools": [tool], "tool_choice": {"type": "function", "function": {"name": "g"}}},
             'tool_choice names the function "g", which is not among the tools', "tool_choice"),
            ({"messages": [{"role": "user", "content": [{"type": "text", "text": "look"}, image]}]},
             "messages[0].content[1]: image inputs are not supported", "messages[0].content[1]"),
        ]
        for fields, message, param in cases:
            for stream in (False, True):
                with self.subTest(fields=fields, stream=stream):
                    self.assert_refused(body_of("Refused", 4, stream=stream, **fields), message,
                                        param)
        # n: 1 and a text-only content array are fine.
        body = self.complete("Refused", 2, n=1)
        self.assertEqual(len(body["choices"]), 1)
        parts = self.complete("ignored", 4, messages=[{"role": "user", "content": [
            {"type": "text", "text": "Ab"}, {"type": "text", "text": "cd"}]}])
        self.assertEqual(parts["choices"][0]["message"]["content"],
                         self.complete("Abcd", 4)["choices"][0]["message"]["content"])

    def test_max_completion_tokens(self):
        alias = self.complete("Alias", None, max_completion_tokens=3, logit_bias=stop_token_bias(),
                              temperature=0)
        self.assertEqual((alias["usage"]["completion_tokens"], alias["choices"][0]["finish_reason"]),
                         (3, "length"))
        both = self.complete("Alias", 3, max_completion_tokens=3, logit_bias=stop_token_bias(),
                             temperature=0)
        self.assertEqual(both["choices"][0]["message"]["content"],
                         alias["choices"][0]["message"]["content"])
        result = self.stream("Alias", None, max_completion_tokens=3, logit_bias=stop_token_bias(),
                             temperature=0, stream_options={"include_usage": True})
        self.assertEqual(result.usage["completion_tokens"], 3)
        self.assertEqual(result.content, alias["choices"][0]["message"]["content"])
        self.assert_refused(body_of("Alias", 7, max_completion_tokens=8),
                            "max_tokens (7) and max_completion_tokens (8) differ; send one of them",
                            "max_completion_tokens")
        self.assert_refused(body_of("Alias", None, max_completion_tokens=0),
                            "max_completion_tokens must be greater than zero",
                            "max_completion_tokens")
        self.assert_refused(body_of("Alias", 0, max_completion_tokens=0),
                            "max_tokens must be greater than zero", "max_tokens")
        self.assert_budget_is_clamped(max_completion_tokens=64000)

    def test_strict_refuses_stream_and_sampling(self):
        accepted = '"model", "messages", "max_tokens", "stream", "prompt_cache_key"'
        server = self.strict_server
        self.assert_refused(body_of("Strict", 4, stream=True), "streaming is not supported",
                            "stream", server=server)
        for field, value in (("temperature", 0), ("stream_options", {"include_usage": True}),
                             ("seed", 1), ("logprobs", False), ("stop", "x"), ("user", "u"),
                             ("max_completion_tokens", 4)):
            with self.subTest(field=field):
                self.assert_refused(
                    body_of("Strict", 4, **{field: value}),
                    PARSE + f'unknown field "{field}", expected one of {accepted}', field,
                    server=server)
        # Lily's response bytes: no logprobs key in the choice.
        response = self.post(body_of("Strict", 4), server)
        self.assertEqual(response.status, 200)
        self.assertEqual(list(response.json()["choices"][0]), ["index", "message", "finish_reason"])
        # --strict with a sampling default is a start-up error.
        result = subprocess.run([LILY, "serve", "--strict", "--temperature", "0.7", "--model",
                                 checkpoint_dir(), "--bind", "127.0.0.1:0"],
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, timeout=60)
        self.assertEqual(result.returncode, 2, result.stderr)
        self.assertIn(b"error: --strict decodes greedily", result.stderr)


# ------------------------------------------------------------------------------------------
class CancelTests(SseTest):
    """Clients that leave mid-stream, clients that do not read, errors mid-stream."""

    LONG_TOKENS = 3000
    rate: float = 50.0  # tokens per second of this server, measured in setUpClass

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        began = time.monotonic()
        response = cls.server.exchange(request_bytes("POST", CHAT_PATH, cls.long_body(200)),
                                       timeout=300)
        elapsed = time.monotonic() - began
        if response.status != 200:
            raise AssertionError(f"calibration: {response.status} {response.body!r}")
        cls.rate = 200 / elapsed
        sys.stderr.write(f"[{cls.__name__}] 200 tokens in {elapsed:.2f}s; the long request "
                         f"({cls.LONG_TOKENS} tokens) would take about {cls.long_seconds():.0f}s\n")

    @classmethod
    def long_seconds(cls) -> float:
        return cls.LONG_TOKENS / cls.rate

    @classmethod
    def long_body(cls, max_tokens: int | None = None, **fields) -> bytes:
        """A request that decodes max_tokens (default LONG_TOKENS) tokens: stop tokens banned."""
        return body_of(CHESS, max_tokens or cls.LONG_TOKENS, temperature=0,
                       logit_bias=stop_token_bias(), **fields)

    def check_disconnect(self, reset: bool):
        start = self.server.mark()
        conn, _, events = self.open_stream(self.long_body(stream=True))
        self.assertEqual(json.loads(events.next_event())["choices"][0]["delta"],
                         {"role": "assistant", "content": ""})
        first = json.loads(events.next_event())
        self.assertIn("content", first["choices"][0]["delta"])
        if reset:  # RST instead of FIN
            conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                 b"\x01\x00\x00\x00\x00\x00\x00\x00")
        closed_at = time.monotonic()
        conn.close()
        response = self.post(body_of("After the disconnect", 2))
        latency = time.monotonic() - closed_at
        self.assertEqual(response.status, 200, response.body)
        bound = 0.2 * self.long_seconds()
        self.assertLess(latency, bound, f"the next request took {latency:.2f}s after the close; "
                        f"the long one would run about {self.long_seconds():.1f}s")
        line = self.server.wait_line(
            f"^POST {re.escape(CHAT_PATH)} 499 \\d+ms prompt=\\d+ cached=\\d+ completion=(\\d+) "
            f"tok/s=\\d+\\.\\d error=\"client disconnected\"$", start).string
        completion = int(re.search(r"completion=(\d+)", line).group(1))
        self.assertGreaterEqual(completion, 1)
        self.assertLess(completion, self.LONG_TOKENS * 0.2, line)
        # The next request's line (read from stderr on a thread: it may lag its response).
        after_line = self.server.wait_line(f"^POST {re.escape(CHAT_PATH)} 200 ", start).string
        lines = self.server.lines_since(start)
        self.assertLess(lines.index(line), lines.index(after_line), lines)

    def test_close_mid_stream_cancels_within_a_step(self):
        self.check_disconnect(reset=False)

    def test_reset_mid_stream_cancels(self):
        self.check_disconnect(reset=True)

    def test_error_mid_stream_on_shutdown(self):
        # The only error a client can provoke after a stream started: a queued stream whose
        # server is told to stop fails with 503 shutting_down, sent inside the stream
        # (data: {"error": ...} then data: [DONE]). The stream in flight runs to its end.
        server = LilyServer(LILY, checkpoint_dir(), *self.SERVER_ARGS).start()
        try:
            running_conn, _, running = self.open_stream(self.long_body(300, stream=True), server)
            self.assertIn("role", json.loads(running.next_event())["choices"][0]["delta"])
            self.assertIn("content", json.loads(running.next_event())["choices"][0]["delta"])
            queued_conn, _, queued = self.open_stream(body_of("Queued", 4, stream=True), server)
            # The role chunk of a queued stream goes out at once, before it runs.
            role = json.loads(queued.next_event())
            self.assertEqual(role["choices"][0]["delta"], {"role": "assistant", "content": ""})
            start = server.mark()
            server.signal(signal.SIGTERM)
            server.wait_line("^received SIGTERM", timeout=30)
            rest = queued.read_all()
            self.assertEqual(rest[-1], b"[DONE]")
            self.assertEqual([json.loads(e) for e in rest[:-1]], [{"error": {
                "message": "server is shutting down", "type": "server_error", "param": None,
                "code": "shutting_down"}}])
            self.assertEqual(queued_conn.wait_closed(30), b"")
            queued_conn.close()
            server.wait_line(f"^POST {re.escape(CHAT_PATH)} 503 \\d+ms "
                             f"error=\"server is shutting down\"$", start)
            # The stream in flight completes normally; the server closes the connection after
            # it (stopping: no keep-alive).
            tail = running.read_all()
            self.assertEqual(tail[-1], b"[DONE]")
            final = json.loads(tail[-2])["choices"][0]
            self.assertEqual((final["delta"], final["finish_reason"]), ({}, "length"))
            self.assertEqual(running_conn.wait_closed(30), b"")
            running_conn.close()
            self.assertEqual(server.wait_exit(60), 0, server.log_text())
            lines = server.lines_since(0)
            self.assertTrue(any(re.match(f"^POST {re.escape(CHAT_PATH)} 200 \\d+ms prompt=\\d+ "
                                         f"cached=\\d+ completion=300 ", l) for l in lines), lines)
        finally:
            server.stop()

    _slow_reader: dict | None = None

    def slow_reader_run(self) -> dict:
        """Runs the slow-reader scenario once (for the two tests below) and returns what it saw.

        A client that never reads, with a small receive buffer, against a server with a 4 KiB
        stream buffer. The kernel's socket buffers take the first megabytes (loopback
        autotunes the send buffer to tcp_wmem's maximum, 4 MiB by default), so the answer is
        made big: 20 top logprobs per token, about 1.7 KB per chunk, 5 MB for the whole
        answer. Once the kernel takes no more, the stream buffer fills at once, the stream
        fails and the engine drops the request. A short completion sent right behind the long
        one shows when the engine is free again."""
        if CancelTests._slow_reader is not None:
            return CancelTests._slow_reader
        run: dict = {"health": []}
        server = LilyServer(LILY, checkpoint_dir(), *self.SERVER_ARGS, "--stream-buffer",
                            "4096").start()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
            sock.settimeout(30)
            sock.connect(("127.0.0.1", server.port))
            start = server.mark()
            run["sent"] = time.monotonic()
            sock.sendall(request_bytes("POST", CHAT_PATH, self.long_body(
                stream=True, logprobs=True, top_logprobs=20)))
            time.sleep(0.3)  # the long request is taken first
            short: dict = {}

            def post_short():
                try:
                    short["response"] = server.exchange(
                        request_bytes("POST", CHAT_PATH, body_of("Behind the slow one", 2)),
                        timeout=3 * self.long_seconds() + 120)
                except Exception as e:  # noqa: BLE001 (reported by the test)
                    short["error"] = e
                short["done"] = time.monotonic()

            thread = threading.Thread(target=post_short, daemon=True)
            thread.start()
            deadline = run["sent"] + 3 * self.long_seconds() + 60
            while "done" not in short and time.monotonic() < deadline:
                # Meanwhile the server answers others at once.
                t0 = time.monotonic()
                health = server.exchange(request_bytes("GET", "/health"), timeout=10)
                models = server.exchange(request_bytes("GET", "/v1/models"), timeout=10)
                run["health"].append((health.status, models.status, time.monotonic() - t0))
                time.sleep(0.5)
            thread.join(10)
            run["short"] = short
            # the slow request's line: cancelled (499), or run to its end
            pattern = re.compile(f"^POST {re.escape(CHAT_PATH)} (499 .* error=\"client |"
                                 f"200 .* completion={self.LONG_TOKENS} )")
            try:  # the slow request's own line (after the write timeout of 30 s at worst)
                run["line"] = server.wait_line(pattern, start, timeout=60).string
                run["logged"] = time.monotonic()
            except AssertionError:
                run["line"] = None
            run["log"] = server.lines_since(start)
        finally:
            sock.close()
            run["exit"] = server.stop()
        CancelTests._slow_reader = run
        sys.stderr.write(f"[slow reader] engine free after "
                         f"{run['short'].get('done', float('nan')) - run['sent']:.1f}s, "
                         f"logged after {run.get('logged', float('nan')) - run['sent']:.1f}s: "
                         f"{run['line']}\n")
        return run

    def test_slow_reader_is_cancelled_and_others_are_served(self):
        run = self.slow_reader_run()
        self.assertEqual(run["exit"], 0)
        short = run["short"]
        self.assertNotIn("error", short)
        self.assertIn("response", short, "the request behind the slow reader never finished")
        self.assertEqual(short["response"].status, 200)
        freed = short["done"] - run["sent"]
        # Uncancelled, the long request would have run all its LONG_TOKENS tokens first.
        with open("/proc/sys/net/ipv4/tcp_wmem", encoding="ascii") as f:
            wmem = f.read().split()
        self.assertLess(freed, 0.75 * self.long_seconds(),
                        f"the engine was busy {freed:.1f}s; the whole long request takes about "
                        f"{self.long_seconds():.1f}s (tcp_wmem here: {wmem}; a maximum far above "
                        f"4 MiB lets the kernel take the whole answer)")
        self.assertGreater(len(run["health"]), 0)
        for health, models, seconds in run["health"]:
            self.assertEqual((health, models), (200, 200))
            self.assertLess(seconds, 5)
        line = run["line"]
        self.assertIsNotNone(line, "no log line for the slow reader's request:\n" +
                             "\n".join(run["log"]))
        self.assertRegex(line, r'^POST \S+ 499 \d+ms prompt=\d+ cached=0 completion=\d+ '
                               r'tok/s=\d+\.\d error="client too slow: (\d+ bytes unsent|'
                               r'nothing written for \d+ ms)"$')
        completion = int(re.search(r"completion=(\d+)", line).group(1))
        self.assertLess(completion, self.LONG_TOKENS)

    # FOUND SERVER BUG (fixed): when a slow reader's stream fails ("client too slow: N bytes unsent"),
    # the engine drops the request at once, but the connection is closed, and the request
    # logged, only when the socket write in flight ends: after the 30 s write timeout for a
    # client that never reads. HttpServer::Connection::advance_stream returns early while a
    # write is in flight (stream_writing_), so the failed stream is not closed until
    # on_stream_written runs. http_server.h says a failed stream has its connection closed.
    # Meanwhile the connection and its kernel buffers stay allocated, and the log line comes
    # 30 s late (its ms then disagree with its tok/s, which is computed at the engine's end).
    def test_slow_reader_connection_is_closed_when_cancelled(self):
        run = self.slow_reader_run()
        self.assertIn("done", run["short"])
        self.assertIsNotNone(run["line"], "\n".join(run["log"]))
        late = run["logged"] - run["short"]["done"]
        self.assertLess(late, 10, f"the slow reader's stream was logged (and closed) {late:.1f}s "
                                  f"after the engine had dropped it: {run['line']}")

    # FOUND SERVER BUG (fixed): with --stream-buffer smaller than one chunk (the flag accepts 1024 and
    # up; a chunk with 20 top logprobs is about 1.6-2.5 KB), the very first content chunk
    # failed the stream as "client too slow: N bytes unsent" although nothing was queued: the
    # limit was checked against the frame's size, not against a backlog. End to end, with
    # frames larger than the bound, whether a backlog forms depends on whether the connection's
    # strand ran between two tokens, which a loaded machine does not promise; the rule is tested
    # deterministically in tests/unit/server/http_stream_test.cpp
    # (HttpStream.FramesLargerThanTheBoundReachAReaderThatKeepsUp).

    # FOUND SERVER BUG (fixed): a client that reads a stream to its very end (the last chunk, after
    # data: [DONE]) and then closes at once is sometimes logged 499 error="client disconnected"
    # instead of 200: about 1 stream in 40 here. The disconnect watch sees the close before
    # the strand has run the completion of the write that carried the last chunk, and fails
    # a stream that was delivered whole. Only the log line (and the 499 count) is wrong; the
    # client got everything.
    def test_a_stream_read_to_its_end_is_logged_200(self):
        start = self.server.mark()
        rounds = 150
        for i in range(rounds):
            with self.server.connect(timeout=60) as conn:
                conn.send(request_bytes("POST", CHAT_PATH, body_of(f"Close {i % 3}", 1, stream=True)))
                events = EventStream(conn, conn.read_head())
                self.assertEqual(events.read_all()[-1], b"[DONE]")
        # A stream's log line is written when the write of its last chunk completes on the
        # server, which can be just after the client has read that chunk: wait for all of them.
        statuses = [line.split()[2]
                    for line in self.server.wait_lines(f"POST {CHAT_PATH} ", rounds, start)]
        self.assertEqual(len(statuses), rounds)
        wrong = [line for line in self.server.lines_since(start)
                 if line.startswith(f"POST {CHAT_PATH} ") and " 200 " not in line]
        self.assertEqual(wrong, [], f"{len(wrong)} of {rounds} streams read to their end "
                                    f"were logged as not delivered")


GROUPS = {
    "stream": StreamTests,
    "text": TextTests,
    "fields": FieldTests,
    "cancel": CancelTests,
}


def main() -> int:
    global LILY
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lily", required=True, help="path of the lily binary")
    parser.add_argument("--group", default="all", choices=["all", *GROUPS])
    args, rest = parser.parse_known_args()
    LILY = os.path.abspath(args.lily)
    if args.group != "all":
        for name, cls in GROUPS.items():
            if name != args.group:
                globals().pop(cls.__name__, None)
    globals().pop("SseTest", None)
    unittest.main(argv=[sys.argv[0], *rest], verbosity=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
