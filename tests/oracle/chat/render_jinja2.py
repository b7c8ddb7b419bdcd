# Renders chat-template test cases with Python Jinja2 as transformers does (JSON lines in, JSON lines out).
#
# stdin: one JSON object per line, {"messages": [...], "tools": [...], "kwargs": {...}} in the
# template's shapes (the caller has already applied Lily's history rewrite where it applies);
# "tools" defaults to [] and "kwargs" to {"enable_thinking": false}, Lily's context.
# stdout: a first line {"engine": "<versions>"}, then one JSON object per case,
# {"prompt": "..."} or {"raised": "<exception text>"}.
# Environment as transformers' apply_chat_template builds it (transformers/utils/chat_template_utils.py,
# _compile_jinja_template): ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
# extensions=[AI21ChatTemplateExtension, jinja2.ext.loopcontrols]), `tojson` replaced by
# json.dumps(x, ensure_ascii=False, indent=indent, separators=separators, sort_keys=sort_keys),
# raise_exception() a global; render(messages=..., tools=..., add_generation_prompt=True,
# **kwargs). (The AI21 extension only adds a {% generation %} tag this template does not use.)
# JSON numbers are read by json.loads, so 1.0 stays a float and big integers stay exact.
# Exit code 77 when jinja2 is not importable.
import argparse
import json
import platform
import sys


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--template", required=True)
    args = parser.parse_args()
    try:
        import jinja2
        from jinja2.ext import loopcontrols
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError as error:
        print(f"SKIPPED: Python jinja2 is not importable ({error})", file=sys.stderr)
        return 77

    class Raised(Exception):
        pass

    def raise_exception(message):
        raise Raised(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        # transformers' override: no HTML escaping, non-ASCII kept, key order kept.
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    with open(args.template, encoding="utf-8") as f:
        template = env.from_string(f.read())
    print(json.dumps({"engine": f"Python Jinja2 {jinja2.__version__} "
                                f"(Python {platform.python_version()}, {sys.executable})"}))
    for line in sys.stdin:
        case = json.loads(line)
        kwargs = case.get("kwargs", {"enable_thinking": False})
        try:
            prompt = template.render(messages=case["messages"], tools=case.get("tools", []),
                                     add_generation_prompt=True, **kwargs)
            print(json.dumps({"prompt": prompt}))
        except Raised as error:
            print(json.dumps({"raised": str(error)}))
        except Exception as error:  # any other engine error is reported, not hidden
            print(json.dumps({"raised": f"{type(error).__name__}: {error}"}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
