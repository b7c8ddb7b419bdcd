# Renders chat-template test cases with Python Jinja2 as transformers does (JSON lines in, JSON lines out).
#
# stdin: one JSON object per line, {"messages": [...]} (already history-rewritten by the caller).
# stdout: one JSON object per line, {"prompt": "..."} or {"raised": "<exception text>"}.
# Context as Lily renders it: tools = [], add_generation_prompt = True, enable_thinking = False.
# Environment as transformers' apply_chat_template builds it: sandboxed, trim_blocks and
# lstrip_blocks on, raise_exception() a global. Exit code 77 when jinja2 is not importable.
import argparse
import json
import sys


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--template", required=True)
    args = parser.parse_args()
    try:
        import jinja2
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError as error:
        print(f"SKIPPED: Python jinja2 is not importable ({error})", file=sys.stderr)
        return 77

    class Raised(Exception):
        pass

    def raise_exception(message):
        raise Raised(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    with open(args.template, encoding="utf-8") as f:
        template = env.from_string(f.read())
    print(json.dumps({"engine": f"jinja2 {jinja2.__version__}"}), flush=False)
    for line in sys.stdin:
        case = json.loads(line)
        try:
            prompt = template.render(messages=case["messages"], tools=[],
                                     add_generation_prompt=True, enable_thinking=False)
            print(json.dumps({"prompt": prompt}))
        except Raised as error:
            print(json.dumps({"raised": str(error)}))
        except Exception as error:  # any other engine error is reported, not hidden
            print(json.dumps({"raised": f"{type(error).__name__}: {error}"}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
