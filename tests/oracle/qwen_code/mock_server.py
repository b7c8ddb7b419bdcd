#!/usr/bin/env python3
# A stdlib stand-in for `lily serve --test-script RULES`, to develop and check the agent harness without lily.
#
# It speaks the same contract as lily's test-only flag (see README.md): RULES is a JSON array
# of {"last_role"?, "contains"?, "output"}; the first rule matching the last message gives the
# "model's" raw text, which is then converted the way lily converts it: text before
# "</think>" is reasoning_content, Qwen3-Coder XML <tool_call> blocks become OpenAI
# tool_calls (parameter values converted by the tool's JSON schema), finish_reason is
# "tool_calls" when there is a call, else "stop". It answers streaming (SSE, OpenAI's chunk
# format, usage chunk with stream_options.include_usage) and non-streaming requests.
#
# Every request (method, path, headers, JSON body) is appended as one JSON line to --request-log,
# which is how the README's facts about what Qwen Code sends were learned. Its stderr mimics
# lily's: a "serving Qwen3.6-35B-A3B on http://127.0.0.1:PORT (mock, openai API, ...)" line
# once ready and one "POST /v1/chat/completions 200 ... finish=..." line per request.
#
#   python3 mock_server.py --test-script RULES.json --request-log REQUESTS.jsonl [--bind 127.0.0.1:0]
import argparse
import json
import re
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MODEL_ID = "Qwen3.6-35B-A3B"

TOOL_CALL_RE = re.compile(r"<tool_call>\s*<function=([^>\s<]+)>(.*?)</function>\s*</tool_call>", re.S)
PARAM_RE = re.compile(r"<parameter=([^>\s<]+)>(.*?)</parameter>", re.S)


def message_text(message):
    """The text of a message's content: a string, or the text parts of an array."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    return ""


def pick_rule(rules, messages):
    if not messages:
        return None
    last = messages[-1]
    text = message_text(last)
    for rule in rules:
        if "last_role" in rule and rule["last_role"] != last.get("role"):
            continue
        if "contains" in rule and rule["contains"] not in text:
            continue
        return rule
    return None


def schema_types(schema):
    if not isinstance(schema, dict):
        return []
    t = schema.get("type")
    if isinstance(t, list):
        return t
    if isinstance(t, str):
        return [t]
    out = []
    for key in ("anyOf", "oneOf"):
        for sub in schema.get(key, []):
            out += schema_types(sub)
    return out


def convert_value(raw, schema):
    """Qwen3-Coder's rule: strings raw, everything else JSON (kept as a string if it is not JSON)."""
    if raw.startswith("\n"):
        raw = raw[1:]
    if raw.endswith("\n"):
        raw = raw[:-1]
    types = schema_types(schema)
    if not types or "string" in types:
        return raw
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def parse_output(text, tools):
    """Splits raw model text into (reasoning, content, [(name, arguments_json)])."""
    reasoning = None
    if "</think>" in text:
        reasoning, text = text.split("</think>", 1)
        reasoning = reasoning.removeprefix("<think>").strip("\n")
        text = text.lstrip("\n")
    schemas = {}
    for tool in tools or []:
        fn = tool.get("function", {}) if isinstance(tool, dict) else {}
        schemas[fn.get("name")] = (fn.get("parameters") or {}).get("properties", {})
    calls = []
    for m in TOOL_CALL_RE.finditer(text):
        name = m.group(1)
        props = schemas.get(name, {})
        args = {k: convert_value(v, props.get(k)) for k, v in PARAM_RE.findall(m.group(2))}
        calls.append((name, json.dumps(args, ensure_ascii=False)))
    first = text.find("<tool_call>")
    content = (text if first < 0 else text[:first]).rstrip("\n")
    return reasoning, content, calls


class Mock:
    def __init__(self, rules, request_log):
        self.rules = rules
        self.request_log = request_log
        self.lock = threading.Lock()
        self.counter = 0

    def log_request(self, entry):
        with self.lock:
            with open(self.request_log, "a", encoding="utf-8") as f:
                f.write(json.dumps(entry, ensure_ascii=False) + "\n")

    def next_id(self):
        with self.lock:
            self.counter += 1
            return self.counter


def make_handler(mock):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt, *args):  # the one-line-per-request log below replaces it
            pass

        def send_json(self, status, obj):
            body = json.dumps(obj).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            mock.log_request({"method": "GET", "path": self.path, "headers": dict(self.headers)})
            if self.path == "/health":
                self.send_json(200, {"status": "ok"})
            elif self.path == "/v1/models":
                self.send_json(200, {"object": "list", "data": [
                    {"id": MODEL_ID, "object": "model", "created": 0, "owned_by": "lily"}]})
            else:
                self.send_json(404, {"error": {"message": f"no such path {self.path}", "type": "invalid_request_error"}})
            print(f"GET {self.path}", file=sys.stderr, flush=True)

        def do_POST(self):
            t0 = time.monotonic()
            length = int(self.headers.get("Content-Length", "0"))
            raw = self.rfile.read(length)
            try:
                body = json.loads(raw)
            except ValueError:
                mock.log_request({"method": "POST", "path": self.path, "headers": dict(self.headers),
                                  "raw": raw.decode("utf-8", "replace")})
                self.send_json(400, {"error": {"message": "body is not JSON", "type": "invalid_request_error"}})
                return
            mock.log_request({"method": "POST", "path": self.path, "headers": dict(self.headers), "body": body})
            if self.path != "/v1/chat/completions":
                self.send_json(404, {"error": {"message": f"no such path {self.path}", "type": "invalid_request_error"}})
                print(f"POST {self.path} 404", file=sys.stderr, flush=True)
                return
            if body.get("model") != MODEL_ID:
                self.send_json(400, {"error": {"message": f"unknown model {body.get('model')!r}",
                                               "type": "invalid_request_error", "param": "model",
                                               "code": "model_not_found"}})
                print(f"POST {self.path} 400 unknown model", file=sys.stderr, flush=True)
                return
            messages = body.get("messages") or []
            rule = pick_rule(mock.rules, messages)
            text = rule["output"] if rule else "mock: no rule matched"
            reasoning, content, calls = parse_output(text, body.get("tools"))
            finish = "tool_calls" if calls else "stop"
            n = mock.next_id()
            created = int(time.time())
            cid = f"chatcmpl-{created}-{n}"
            call_ids = [f"call_{n}_{i}" for i in range(len(calls))]
            usage = {"prompt_tokens": len(json.dumps(messages)) // 4, "completion_tokens": len(text) // 4 + 1}
            usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
            if body.get("stream"):
                self.stream(body, cid, created, reasoning, content, calls, call_ids, finish, usage)
            else:
                message = {"role": "assistant", "content": content if content or not calls else None}
                if reasoning is not None:
                    message["reasoning_content"] = reasoning
                if calls:
                    message["tool_calls"] = [{"id": call_ids[i], "type": "function",
                                              "function": {"name": name, "arguments": args}}
                                             for i, (name, args) in enumerate(calls)]
                self.send_json(200, {"id": cid, "object": "chat.completion", "created": created, "model": MODEL_ID,
                                     "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                                     "usage": usage})
            ms = int((time.monotonic() - t0) * 1000)
            rule_no = mock.rules.index(rule) if rule else -1
            print(f"POST /v1/chat/completions 200 {ms}ms stream={bool(body.get('stream'))} "
                  f"last_role={messages[-1].get('role') if messages else None} rule={rule_no} finish={finish}",
                  file=sys.stderr, flush=True)

        def stream(self, body, cid, created, reasoning, content, calls, call_ids, finish, usage):
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Connection", "close")
            self.end_headers()

            def chunk(delta, finish_reason=None):
                obj = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": MODEL_ID,
                       "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}]}
                if include_usage:
                    obj["usage"] = None
                self.wfile.write(b"data: " + json.dumps(obj, ensure_ascii=False).encode() + b"\n\n")
                self.wfile.flush()

            chunk({"role": "assistant", "content": ""})
            if reasoning:
                chunk({"reasoning_content": reasoning})
            if content:
                half = len(content) // 2
                chunk({"content": content[:half]})
                chunk({"content": content[half:]})
            for i, (name, args) in enumerate(calls):
                # The header alone, then the arguments in two pieces, so that the accumulated
                # text never parses as complete JSON before the call ends.
                chunk({"tool_calls": [{"index": i, "id": call_ids[i], "type": "function",
                                       "function": {"name": name, "arguments": ""}}]})
                cut = max(1, len(args) - 2)
                chunk({"tool_calls": [{"index": i, "function": {"arguments": args[:cut]}}]})
                chunk({"tool_calls": [{"index": i, "function": {"arguments": args[cut:]}}]})
            chunk({}, finish)
            if include_usage:
                obj = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": MODEL_ID,
                       "choices": [], "usage": usage}
                self.wfile.write(b"data: " + json.dumps(obj).encode() + b"\n\n")
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()
            self.close_connection = True

    return Handler


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--test-script", required=True, help="JSON array of rules")
    ap.add_argument("--request-log", required=True, help="JSONL file every request is appended to")
    ap.add_argument("--bind", default="127.0.0.1:0")
    args = ap.parse_args()
    with open(args.test_script, encoding="utf-8") as f:
        rules = json.load(f)
    if not isinstance(rules, list) or not all(isinstance(r, dict) and isinstance(r.get("output"), str) for r in rules):
        sys.exit("error: --test-script must be a JSON array of objects with a string \"output\"")
    host, port = args.bind.rsplit(":", 1)
    server = ThreadingHTTPServer((host, int(port)), make_handler(Mock(rules, args.request_log)))
    server.daemon_threads = True
    port = server.server_address[1]
    print(f"serving {MODEL_ID} on http://{host}:{port} (mock, openai API, {len(rules)} test-script rules)",
          file=sys.stderr, flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
