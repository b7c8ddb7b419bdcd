#!/usr/bin/env python3
# One streamed completion at a time against a running `lily serve`: time to first byte, time to first token, stream tok/s.
"""Measures what a streaming client sees, for docs/perf/streaming.md.

For each run it sends one `stream: true` request (greedy, `stream_options.include_usage`) and
timestamps every SSE frame as it arrives:

* ttfb: request sent -> first byte of the response body (the role chunk, sent at admission);
* ttft: request sent -> first content chunk (prefill + first token);
* stream tok/s: (completion_tokens - 1) / (last content chunk - first content chunk), the decode
  rate the client receives, to compare with `lily bench`'s decode tok/s on the same checkpoint.

The prompt is `--prompt-words` copies of a word in one user message (the token count is in the
usage). Standard library only; prints one JSON object.
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import sys
import time


def one_run(host: str, port: int, body: bytes, timeout: float) -> dict:
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    start = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", body=body,
                 headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    if response.status != 200:
        raise RuntimeError(f"HTTP {response.status}: {response.read()[:300]!r}")
    first_byte = None
    content_times: list[float] = []
    usage = None
    buffer = b""
    done = False
    while not done:
        chunk = response.read1(65536)
        now = time.perf_counter()
        if not chunk:
            break
        if first_byte is None:
            first_byte = now
        buffer += chunk
        while b"\n\n" in buffer:
            frame, buffer = buffer.split(b"\n\n", 1)
            if not frame.startswith(b"data: "):
                raise RuntimeError(f"not an SSE data frame: {frame[:80]!r}")
            data = frame[6:]
            if data == b"[DONE]":
                done = True
                break
            event = json.loads(data)
            if "error" in event:
                raise RuntimeError(f"error in stream: {event['error']}")
            if event.get("usage"):
                usage = event["usage"]
            for choice in event.get("choices", []):
                if choice["delta"].get("content"):
                    content_times.append(now)
    conn.close()
    if usage is None or not content_times:
        raise RuntimeError("stream ended without usage or content")
    completion = usage["completion_tokens"]
    span = content_times[-1] - content_times[0]
    return {
        "prompt_tokens": usage["prompt_tokens"],
        "completion_tokens": completion,
        "ttfb_ms": (first_byte - start) * 1e3,
        "ttft_ms": (content_times[0] - start) * 1e3,
        "stream_tok_s": (completion - 1) / span if span > 0 else float("nan"),
        "content_chunks": len(content_times),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="127.0.0.1:8000", help="HOST:PORT of lily serve")
    parser.add_argument("--prompt-words", type=int, default=200)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--timeout", type=float, default=300)
    args = parser.parse_args()
    host, _, port = args.url.rpartition(":")
    body = json.dumps({
        "model": "Qwen3.6-35B-A3B",
        "messages": [{"role": "user", "content": " ".join(["hello"] * args.prompt_words)}],
        "max_tokens": args.max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }).encode()
    runs = [one_run(host, int(port), body, args.timeout) for _ in range(args.runs)]
    # The first run also captures the decode graph (a one-off per server), so the medians
    # leave it out.
    steady = runs[1:] if len(runs) > 1 else runs
    summary = {
        "runs": runs,
        "median_ttfb_ms": statistics.median(r["ttfb_ms"] for r in steady),
        "median_ttft_ms": statistics.median(r["ttft_ms"] for r in steady),
        "median_stream_tok_s": statistics.median(r["stream_tok_s"] for r in steady),
    }
    json.dump(summary, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
