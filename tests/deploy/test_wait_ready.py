#!/usr/bin/env python3
# packaging/lily-wait-ready (the systemd unit's readiness check) against a real lily, a server that answers 503 first, nothing, a dead process and bad arguments.
"""Run by CTest (deploy_wait_ready):

    python3 tests/deploy/test_wait_ready.py --lily BUILD/lily --script packaging/lily-wait-ready
"""
from __future__ import annotations

import argparse
import http.server
import os
import socket
import subprocess
import sys
import threading
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "server"))

from lily_server_harness import Checkpoint, LilyServer  # noqa: E402

LILY = ""
SCRIPT = ""


def run_script(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    # Run as the file itself (not `bash FILE`): its mode bit and shebang are part of the test.
    return subprocess.run([SCRIPT, *args], capture_output=True, text=True, timeout=timeout)


class HealthServer:
    """GET /health answering 503 {"status":"loading"} `loading` times, then 200 (never, with
    loading=None). Counts the probes."""

    def __init__(self, loading: int | None):
        self.probes = 0
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):  # noqa: N802 (http.server's name)
                owner.probes += 1
                ready = loading is not None and owner.probes > loading
                body = b'{"status":"ok"}' if ready else b'{"status":"loading"}'
                try:
                    self.send_response(200 if ready and self.path == "/health" else 503)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the script reads the status line only, then closes

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


class WaitReadyTest(unittest.TestCase):
    def test_ready_lily(self):
        checkpoint = Checkpoint(LILY)
        server = LilyServer(LILY, checkpoint.path, "--device", "cpu", "--threads", "1").start()
        try:
            result = run_script(f"127.0.0.1:{server.port}", "30", str(server.proc.pid))
            self.assertEqual(result.returncode, 0, result.stderr)
            self.assertEqual(result.stdout.strip(),
                             f"lily-wait-ready: http://127.0.0.1:{server.port}/health answers 200")
            # A wildcard bind is probed on loopback.
            result = run_script(f"0.0.0.0:{server.port}", "30")
            self.assertEqual(result.returncode, 0, result.stderr)
            self.assertIn(f"http://127.0.0.1:{server.port}/health answers 200", result.stdout)
        finally:
            server.stop()
            checkpoint.cleanup()

    def test_waits_through_503(self):
        health = HealthServer(loading=2)
        try:
            result = run_script(f"127.0.0.1:{health.port}", "60")
            self.assertEqual(result.returncode, 0, result.stderr)
            self.assertEqual(health.probes, 3)  # two 503s, then the 200
        finally:
            health.close()

    def test_never_ready_times_out_naming_the_last_status(self):
        health = HealthServer(loading=None)
        try:
            result = run_script(f"127.0.0.1:{health.port}", "2")
            self.assertEqual(result.returncode, 1)
            self.assertEqual(result.stderr.strip(),
                             f"lily-wait-ready: http://127.0.0.1:{health.port}/health did not "
                             "answer 200 within 2 s (last: status 503)")
            self.assertGreaterEqual(health.probes, 2)
        finally:
            health.close()

    def test_nothing_listening(self):
        with socket.socket() as s:  # a port that was free a moment ago
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        result = run_script(f"127.0.0.1:{port}", "1")
        self.assertEqual(result.returncode, 1)
        self.assertIn("did not answer 200 within 1 s (last: no answer)", result.stderr)

    def test_server_process_gone(self):
        health = HealthServer(loading=None)
        gone = subprocess.Popen(["true"])
        gone.wait()
        try:
            result = run_script(f"127.0.0.1:{health.port}", "600", str(gone.pid), timeout=60)
            self.assertEqual(result.returncode, 1)
            self.assertIn(f"the server (pid {gone.pid}) exited before", result.stderr)
        finally:
            health.close()

    def test_bad_arguments(self):
        cases = [
            ((), "expected 1 to 3 arguments, got 0"),
            (("a:1", "2", "3", "4"), "expected 1 to 3 arguments, got 4"),
            (("localhost",), "address 'localhost' is not HOST:PORT"),
            (("127.0.0.1:0",), "port '0' in '127.0.0.1:0' is not a number in 1..65535"),
            (("127.0.0.1:http",), "port 'http' in '127.0.0.1:http' is not a number in 1..65535"),
            (("127.0.0.1:8000", "soon"), "timeout 'soon' is not a whole number of seconds >= 1"),
            (("127.0.0.1:8000", "0"), "timeout '0' is not a whole number of seconds >= 1"),
            (("127.0.0.1:8000", "5", "x1"), "pid 'x1' is not a process id"),
        ]
        for args, message in cases:
            with self.subTest(args=args):
                result = run_script(*args)
                self.assertEqual(result.returncode, 2)
                self.assertEqual(result.stderr.strip(),
                                 f"lily-wait-ready: {message} (usage: lily-wait-ready HOST:PORT "
                                 "[TIMEOUT_SECONDS [PID]])")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--lily", required=True)
    parser.add_argument("--script", required=True)
    args, rest = parser.parse_known_args()
    LILY, SCRIPT = args.lily, args.script
    unittest.main(argv=[sys.argv[0], *rest], verbosity=2)
