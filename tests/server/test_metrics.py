#!/usr/bin/env python3
"""GET /metrics against a live `lily serve`: the Prometheus text read by the official Python
client's parser (Debian's python3-prometheus-client), its counters against the requests sent
and the usage each answer reported, and its auth.

Run by CTest with Debian's /usr/bin/python3 (where the apt package lives):
    python3 tests/server/test_metrics.py --lily BUILD/lily
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from lily_server_harness import (  # noqa: E402
    CHAT_PATH,
    SERVED_MODEL,
    Checkpoint,
    EventStream,
    LilyServer,
    chat_body,
    request_bytes,
)

try:
    from prometheus_client.parser import text_string_to_metric_families
except ImportError as error:  # a missing package fails the test, with the command to fix it
    print(f"FAIL: the Prometheus parser is not importable ({error}); install the Debian package "
          "python3-prometheus-client (tools/dev.sh does)", file=sys.stderr)
    sys.exit(1)

LILY = ""
KEY = "metrics-test-key"
AUTH = [("Authorization", f"Bearer {KEY}")]


def parse(text: str) -> dict:
    """{family name: family} from the official parser (which raises on malformed text)."""
    return {family.name: family for family in text_string_to_metric_families(text)}


def sample(families: dict, family: str, name: str, **labels) -> float:
    matches = [s.value for s in families[family].samples
               if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]
    if len(matches) != 1:
        raise AssertionError(f"{len(matches)} samples {name} {labels} in {family}")
    return matches[0]


class MetricsTests(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.checkpoint = Checkpoint(LILY)
        cls.server = LilyServer(LILY, cls.checkpoint.path, "--threads", "1", "--api-key",
                                KEY).start()

    @classmethod
    def tearDownClass(cls):
        code = cls.server.stop()
        cls.checkpoint.cleanup()
        if code != 0:
            raise AssertionError(f"server exited {code}")

    PROMETHEUS = "text/plain; version=0.0.4; charset=utf-8"

    def scrape(self, headers=AUTH, refused: bool = False):
        """GET /metrics: Prometheus text, or (refused) the JSON error envelope."""
        data = request_bytes("GET", "/metrics", headers=headers, content_type=None)
        return self.server.exchange(data,
                                    content_type="application/json" if refused else self.PROMETHEUS)

    def complete(self, body: bytes) -> dict:
        response = self.server.chat(body, headers=AUTH)
        self.assertEqual(response.status, 200, response.body)
        return response.json()["usage"]

    def test_counters_match_the_requests_served(self):
        body = chat_body("Count me.", 6)
        usages = [self.complete(body), self.complete(body)]  # the second reuses a snapshot
        with self.server.connect() as conn:
            conn.send(request_bytes("POST", CHAT_PATH,
                                    chat_body("Count me.", 6, stream=True,
                                              stream_options={"include_usage": True}),
                                    headers=AUTH))
            events = EventStream(conn, conn.read_head())
            raw = events.read_all()
        usages.append(json.loads(raw[-2])["usage"])
        bad = self.server.chat(chat_body("x", 2, model="gpt-4o"), headers=AUTH)
        self.assertEqual(bad.status, 400)
        missing = self.server.exchange(request_bytes("GET", "/nowhere", headers=AUTH,
                                                     content_type=None))
        self.assertEqual(missing.status, 404)

        # A stream is counted when its last write completes, which can be just after the
        # client read it: scrape until the count settles.
        deadline = time.monotonic() + 10
        while True:
            response = self.scrape()
            self.assertEqual(response.status, 200, response.body)
            families = parse(response.body.decode("utf-8"))
            served = sample(families, "lily_requests", "lily_requests_total",
                            endpoint=CHAT_PATH, status="200")
            if served == 3 or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        self.assertEqual(served, 3)
        self.assertEqual(sample(families, "lily_requests", "lily_requests_total",
                                endpoint=CHAT_PATH, status="400"), 1)
        self.assertEqual(sample(families, "lily_requests", "lily_requests_total",
                                endpoint="other", status="404"), 1)
        total = lambda key: sum(key(u) for u in usages)  # noqa: E731
        self.assertEqual(sample(families, "lily_completions", "lily_completions_total"), 3)
        self.assertEqual(sample(families, "lily_prompt_tokens", "lily_prompt_tokens_total"),
                         total(lambda u: u["prompt_tokens"]))
        self.assertEqual(sample(families, "lily_generation_tokens",
                                "lily_generation_tokens_total"),
                         total(lambda u: u["completion_tokens"]))
        cached = [u["prompt_tokens_details"]["cached_tokens"] for u in usages]
        self.assertEqual(sample(families, "lily_cached_tokens", "lily_cached_tokens_total"),
                         sum(cached))
        self.assertEqual(sample(families, "lily_cache_hits", "lily_cache_hits_total"),
                         sum(1 for c in cached if c > 0))
        self.assertGreaterEqual(sum(1 for c in cached if c > 0), 2)
        # Histograms: one time-to-first-token per completion, one gap per later token, one
        # duration per answered chat request (the 400 too).
        ttft = "lily_time_to_first_token_seconds"
        self.assertEqual(families[ttft].type, "histogram")
        self.assertEqual(sample(families, ttft, ttft + "_count"), 3)
        self.assertEqual(sample(families, ttft, ttft + "_bucket", le="+Inf"), 3)
        self.assertGreater(sample(families, ttft, ttft + "_sum"), 0)
        itl = "lily_inter_token_latency_seconds"
        self.assertEqual(sample(families, itl, itl + "_count"),
                         total(lambda u: u["completion_tokens"] - 1))
        duration = "lily_request_duration_seconds"
        self.assertEqual(sample(families, duration, duration + "_count", endpoint=CHAT_PATH), 4)
        buckets = [s for s in families[duration].samples
                   if s.name == duration + "_bucket" and s.labels["endpoint"] == CHAT_PATH]
        counts = [s.value for s in buckets]
        self.assertEqual(counts, sorted(counts), "cumulative buckets")
        self.assertEqual(sample(families, "lily_queue_depth", "lily_queue_depth"), 0)
        self.assertGreaterEqual(sample(families, "lily_requests_in_flight",
                                       "lily_requests_in_flight"), 1)  # the scrape itself
        self.assertGreater(sample(families, "lily_device_memory_bytes",
                                  "lily_device_memory_bytes"), 1e6)
        self.assertGreater(sample(families, "lily_model_load_seconds", "lily_model_load_seconds"), 0)
        self.assertGreater(sample(families, "lily_decode_tokens_per_second",
                                  "lily_decode_tokens_per_second"), 0)
        self.assertEqual(families["lily_requests"].type, "counter")
        self.assertEqual(families["lily_queue_depth"].type, "gauge")

    def test_behind_the_api_key(self):
        self.assertEqual(self.scrape(headers=[], refused=True).status, 401)
        self.assertEqual(self.scrape(headers=[("Authorization", "Bearer wrong")],
                                     refused=True).status, 401)
        families = parse(self.scrape().body.decode("utf-8"))
        self.assertEqual(sample(families, "lily_requests", "lily_requests_total",
                                endpoint="/metrics", status="401"), 2)
        post = self.server.exchange(request_bytes("POST", "/metrics", "{}", headers=AUTH))
        self.assertEqual(post.status, 405)
        self.assertEqual(post.header("Allow"), "GET")
        # /health stays open.
        health = self.server.exchange(request_bytes("GET", "/health", content_type=None))
        self.assertEqual(health.status, 200)


def main() -> int:
    global LILY
    parser = argparse.ArgumentParser()
    parser.add_argument("--lily", required=True)
    args, rest = parser.parse_known_args()
    LILY = args.lily
    suite = unittest.TestLoader().loadTestsFromTestCase(MetricsTests)
    result = unittest.TextTestRunner(verbosity=2).run(suite)
    return 0 if result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
