#!/usr/bin/env python3
"""Fault injection against a live `lily serve --test-fault SITE:KIND[:SKIP]` (docs/server.md,
"Failures"): an ordinary error in a decode op fails only its request, and the server answers
the next one exactly as a server without the fault does; a lost device fails the request in
flight and the queued ones with a generic 500, turns new ones away with 503, answers /health
503 {"status":"failed"} and exits with status 3, so that a supervisor restarts it.

    python3 tests/server/test_faults.py --lily BUILD/lily [--device cpu|cuda]

On the CPU every decode step is eager, so only the `step` site exists there; the `capture`
and `replay` sites (a CUDA graph being recorded, a recorded graph launched) run with
--device cuda on the GPU machine and are reported SKIPPED otherwise.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
import unittest

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from lily_server_harness import (  # noqa: E402
    Checkpoint,
    EventStream,
    LilyServer,
    chat_body,
    request_bytes,
    CHAT_PATH,
)

LILY = ""
DEVICE = "cpu"
EXIT_DEVICE_FAILED = 3
# The long request of the queue checks: the fault fires after SKIP of its decode steps, long
# after the two requests sent behind it are queued (the test checks they were).
LONG_TOKENS = 3000
LONG_SKIP = 2000
_checkpoint: Checkpoint | None = None
_reference: dict[str, str] = {}


def checkpoint_dir() -> str:
    global _checkpoint
    if _checkpoint is None:
        _checkpoint = Checkpoint(LILY)
    return _checkpoint.path


def tearDownModule():  # noqa: N802 (unittest's name)
    if _checkpoint is not None:
        _checkpoint.cleanup()


def device_args() -> tuple[str, ...]:
    return ("--device", "cuda") if DEVICE == "cuda" else ("--device", "cpu", "--threads", "1")


def stop_token_bias() -> dict:
    """logit_bias banning the stop tokens, so that a request runs to max_tokens."""
    with open(os.path.join(checkpoint_dir(), "tokenizer.json"), encoding="utf-8") as f:
        added = {t["content"]: t["id"] for t in json.load(f)["added_tokens"]}
    return {str(added["<|endoftext|>"]): -100, str(added["<|im_end|>"]): -100}


PROMPTS = ["Name three rivers.", "Count to five.", "Describe a cat."]


def reference_answers() -> dict[str, str]:
    """Each prompt's answer from a server without a fault (greedy, so deterministic)."""
    if not _reference:
        server = LilyServer(LILY, checkpoint_dir(), *device_args()).start()
        try:
            for prompt in PROMPTS:
                response = server.chat(chat_body(prompt, max_tokens=24))
                assert response.status == 200, (response.status, response.body)
                _reference[prompt] = response.json()["choices"][0]["message"]["content"]
        finally:
            server.stop()
    return _reference


def health(server: LilyServer) -> tuple[int, bytes]:
    response = server.exchange(request_bytes("GET", "/health"))
    return response.status, response.body


def queue_depth(server: LilyServer) -> float:
    body = server.exchange(request_bytes("GET", "/metrics"),
                           content_type="text/plain; version=0.0.4; charset=utf-8").body.decode()
    for line in body.splitlines():
        if line.startswith("lily_queue_depth "):
            return float(line.split()[1])
    raise AssertionError("no lily_queue_depth in /metrics:\n" + body)


def assert_generic_500(test: unittest.TestCase, response) -> None:
    """A 500 whose message hides the cause (the log has it)."""
    test.assertEqual(response.status, 500, response.body)
    error = response.json()["error"]
    test.assertEqual(error["message"], "internal server error")
    test.assertNotIn("injected", response.body.decode())
    test.assertNotIn("CUDA", response.body.decode())


class FaultTest(unittest.TestCase):
    def start(self, spec: str) -> LilyServer:
        server = LilyServer(LILY, checkpoint_dir(), *device_args(), "--test-fault", spec).start()
        self.addCleanup(server.stop)
        server.wait_line(r"^TEST FAULT ARMED: a decode op fails at ")
        return server

    def needs_cuda(self):
        if DEVICE != "cuda":
            print(f"SKIPPED {self.id()}: needs --device cuda (graph capture)", file=sys.stderr)
            self.skipTest("needs --device cuda (graph capture)")

    # --- an ordinary error: the request fails, the server goes on unchanged
    def check_recoverable(self, spec: str):
        reference = reference_answers()
        server = self.start(spec)
        first = server.chat(chat_body(PROMPTS[0], max_tokens=24))
        assert_generic_500(self, first)
        server.wait_line(r"request failed: .*injected error \(--test-fault\) at ")
        # Every later request is answered as by a server that never had the fault: the
        # failed step left nothing behind (on CUDA: no stream still capturing).
        for prompt in PROMPTS:
            response = server.chat(chat_body(prompt, max_tokens=24))
            self.assertEqual(response.status, 200, response.body)
            self.assertEqual(response.json()["choices"][0]["message"]["content"], reference[prompt])
        self.assertEqual(health(server), (200, b'{"status":"ok"}'))
        self.assertIsNone(server.proc.poll(), "the server must keep running")

    def test_step_error_fails_only_its_request(self):
        self.check_recoverable("step:error")

    def test_capture_error_ends_the_capture(self):
        self.needs_cuda()
        self.check_recoverable("capture:error")

    def test_replay_error_fails_only_its_request(self):
        self.needs_cuda()
        self.check_recoverable("replay:error:3")

    # --- a lost device: everything held fails, the server says so and exits non-zero
    def check_failed_server(self, server: LilyServer, mark: int):
        server.wait_line(r"fatal: the device failed \(", start=mark)
        status, body = health(server)
        self.assertEqual((status, json.loads(body)), (503, {"status": "failed"}))
        refused = server.chat(chat_body(PROMPTS[1], max_tokens=4))
        self.assertEqual(refused.status, 503, refused.body)
        self.assertEqual(refused.json()["error"]["code"], "device_failed")
        self.assertEqual(server.wait_exit(timeout=60), EXIT_DEVICE_FAILED, server.log_text())
        self.assertIn("stopped: the device failed", server.log_text())

    def check_device_lost(self, spec: str):
        server = self.start(spec)
        mark = server.mark()
        response = server.chat(chat_body(PROMPTS[0], max_tokens=24))
        assert_generic_500(self, response)
        self.check_failed_server(server, mark)

    def test_step_device_fault(self):
        self.check_device_lost("step:device")

    def test_capture_device_fault_poisons_at_replay(self):
        self.needs_cuda()
        self.check_device_lost("capture:device")

    def test_replay_device_fault(self):
        self.needs_cuda()
        self.check_device_lost("replay:device")

    def test_device_fault_fails_the_queued_requests(self):
        """A long streamed request in flight, a plain and a streamed one queued behind it: all
        three get the generic failure when the device is lost under the first."""
        site = "replay" if DEVICE == "cuda" else "step"
        server = self.start(f"{site}:device:{LONG_SKIP}")
        mark = server.mark()
        bias = stop_token_bias()
        long_conn = server.connect(timeout=300)
        self.addCleanup(long_conn.close)
        long_conn.send(request_bytes("POST", CHAT_PATH, chat_body(
            PROMPTS[0], max_tokens=LONG_TOKENS, stream=True, temperature=0, logit_bias=bias)))
        long_stream = EventStream(long_conn, long_conn.read_head())
        long_stream.next_event()  # the role chunk
        long_stream.next_event()  # a first token: the request is decoding
        results: dict[str, object] = {}

        def plain():
            results["plain"] = server.chat(chat_body(PROMPTS[1], max_tokens=8), timeout=300)

        plain_thread = threading.Thread(target=plain, daemon=True)
        plain_thread.start()
        queued_conn = server.connect(timeout=300)
        self.addCleanup(queued_conn.close)
        queued_conn.send(request_bytes("POST", CHAT_PATH,
                                       chat_body(PROMPTS[2], max_tokens=8, stream=True)))
        queued_stream = EventStream(queued_conn, queued_conn.read_head())
        deadline = time.monotonic() + 30
        while queue_depth(server) < 2:
            self.assertLess(time.monotonic(), deadline, "the two requests were never queued")
            self.assertIsNone(server.proc.poll(), "the fault fired before the queue filled")
            time.sleep(0.01)
        # Queued while the first still decodes (its fault is LONG_SKIP steps in).
        self.assertNotIn("fatal: the device failed", "\n".join(server.lines_since(mark)))

        for name, stream in (("in flight", long_stream), ("queued", queued_stream)):
            events = stream.read_all()
            self.assertEqual(events[-1], b"[DONE]", (name, events[-3:]))
            error = json.loads(events[-2])["error"]
            self.assertEqual(error["message"], "internal server error", name)
        plain_thread.join(timeout=300)
        assert_generic_500(self, results["plain"])
        # Each failure is logged before its response is written, but this process reads
        # the server's stderr on a thread that may lag (a loaded 2-core CI box did).
        failed = server.wait_lines("request failed: device failed: ", 3, start=mark,
                                   timeout=30, sync=False)
        self.assertEqual(len(failed), 3, server.log_text())
        self.check_failed_server(server, mark)


class FaultOptionTest(unittest.TestCase):
    def serve_error(self, *args: str) -> str:
        import subprocess
        done = subprocess.run([LILY, "serve", "--model", checkpoint_dir(), "--bind", "127.0.0.1:0",
                               *args], capture_output=True, text=True, timeout=120)
        self.assertEqual(done.returncode, 2, done.stderr)
        return done.stderr

    def test_a_bad_spec_is_refused_naming_what_is_expected(self):
        err = self.serve_error("--test-fault", "decode:error")
        self.assertIn('--test-fault "decode:error": unknown SITE "decode"', err)
        self.assertIn("expected SITE:KIND[:SKIP]", err)
        err = self.serve_error("--test-fault", "step:device:x")
        self.assertIn('SKIP "x" is not a count', err)

    def test_graph_sites_need_a_capturing_backend(self):
        err = self.serve_error("--device", "cpu", "--test-fault", "capture:error")
        self.assertIn("--test-fault capture needs a backend with graph capture", err)


def main() -> int:
    global LILY, DEVICE
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lily", required=True)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    args, rest = parser.parse_known_args()
    LILY = os.path.abspath(args.lily)
    DEVICE = args.device
    program = unittest.main(argv=[sys.argv[0], "-v", *rest], exit=False)
    return 0 if program.result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
