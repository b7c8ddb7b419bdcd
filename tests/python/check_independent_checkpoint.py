# Test driver: writes a checkpoint with independent_mlx_writer.py, runs `lily inspect` on it, and checks exit code and output.
"""One CTest case = one writer variant + one seed.

Accepted cases require `lily inspect --model DIR` to exit 0 and report profile tiny, and
`lily inspect --model DIR --json` to report profile "tiny", 357 language-model tensors and
the number of vision_tower tensors skipped. Refused cases (--break ...) require exit code 2
and an `error: ` message on stderr that names the problem.

Every check is printed as it is made; any failure prints the full command, exit code,
stdout and stderr and exits 1. The checkpoint directory is deleted after a pass (use
--keep to keep it) and kept after a failure for inspection.
"""

from __future__ import annotations

import argparse
import filecmp
import json
import os
import re
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
WRITER = os.path.join(HERE, "independent_mlx_writer.py")

# Expected summary values for the tiny profile, derived from the specs:
#   6 Gated DeltaNet layers x 45 + 2 full-attention layers x 40 + 7 top-level tensors.
TINY_TENSORS = 6 * 45 + 2 * 40 + 7            # 357
TINY_Q4_PROJECTIONS = 6 * 11 + 2 * 10 + 2     # 88 (embed_tokens and lm_head included)
TINY_Q8_PROJECTIONS = 8 * 2                   # router + shared_expert_gate per layer
TINY_DENSE = 6 * 6 + 2 * 4 + 1                # 45 norms / conv / A_log / dt_bias
ENDOFTEXT, IM_END = 4063, 4065

# Accepted variants: writer flags.
ACCEPT = {
    "default": [],
    "conv-hf": ["--conv-layout", "hf"],
    "a-log-bf16": ["--a-log-dtype", "bf16"],
    "a-log-f32": ["--a-log-dtype", "f32"],
    "vision-tower": ["--vision-tower"],
    "single-file": ["--single-file"],
    "eos-list": ["--eos-list"],
    "one-shard-index": ["--shards", "1"],
    "seven-shards": ["--shards", "7"],
    "all-alternatives": ["--conv-layout", "hf", "--a-log-dtype", "f32", "--vision-tower",
                         "--single-file", "--eos-list"],
    "vision-sharded-hf": ["--vision-tower", "--conv-layout", "hf", "--shards", "5"],
}
# Refused variants: writer flags.
REFUSE = {
    "router-4bit": ["--break", "router-4bit"],
    "missing-tensor": ["--break", "missing-tensor"],
    "extra-tensor": ["--break", "extra-tensor"],
    "tiny-without-marker": ["--break", "tiny-without-marker"],
}
# Fields whose tiny value differs from production (docs/checkpoint.md, "The tiny test profile").
TINY_VS_PRODUCTION_FIELDS = [
    "hidden_size", "num_hidden_layers", "layer_types", "num_attention_heads", "num_key_value_heads",
    "linear_num_key_heads", "linear_num_value_heads", "num_experts", "moe_intermediate_size",
    "shared_expert_intermediate_size", "vocab_size",
]


class Checker:
    def __init__(self) -> None:
        self.failed = 0
        self.context: list[str] = []

    def check(self, ok: bool, what: str) -> bool:
        print(("PASS: " if ok else "FAIL: ") + what, flush=True)
        if not ok:
            self.failed += 1
        return ok

    def run(self, cmd: list[str]) -> subprocess.CompletedProcess:
        print("RUN:  " + " ".join(cmd), flush=True)
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        except subprocess.TimeoutExpired as e:
            print(f"FAIL: timed out after 300 s: {e}", flush=True)
            sys.exit(1)
        self.context.append(f"$ {' '.join(cmd)}\n  exit code: {p.returncode}\n"
                            f"  stdout: {p.stdout.strip()!r}\n  stderr: {p.stderr.strip()!r}")
        return p

    def finish(self) -> int:
        if self.failed:
            print(f"\n{self.failed} check(s) FAILED. Commands run:", flush=True)
            for c in self.context:
                print(c)
            return 1
        print("all checks passed")
        return 0


def write(ck: Checker, out: str, seed: int, flags: list[str]) -> dict | None:
    if os.path.isdir(out):
        shutil.rmtree(out)
    p = ck.run([sys.executable, WRITER, "--out", out, "--seed", str(seed)] + flags)
    if not ck.check(p.returncode == 0, f"writer exits 0 (got {p.returncode})"):
        return None
    try:
        summary = json.loads(p.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError) as e:
        ck.check(False, f"writer prints a JSON summary ({e})")
        return None
    return summary


def check_accepted(ck: Checker, lily: str, out: str, summary: dict, flags: list[str]) -> None:
    vision = summary["vision_tensors"]
    n_shards = 1 if ("--single-file" in flags) else sum(
        1 for f in summary["files"] if f.endswith(".safetensors"))

    p = ck.run([lily, "inspect", "--model", out])
    ck.check(p.returncode == 0, f"`lily inspect` exits 0 (got {p.returncode}; stderr {p.stderr.strip()!r})")
    ck.check(re.search(r"\bprofile\W+tiny\b", p.stdout) is not None,
             "`lily inspect` output reports profile tiny")

    p = ck.run([lily, "inspect", "--model", out, "--json"])
    if not ck.check(p.returncode == 0, f"`lily inspect --json` exits 0 (got {p.returncode})"):
        return
    try:
        js = json.loads(p.stdout)
    except ValueError as e:
        ck.check(False, f"`lily inspect --json` prints one JSON object ({e})")
        return
    ck.check(isinstance(js, dict), "`lily inspect --json` output is a JSON object")
    ck.check(js.get("profile") == "tiny", f"json profile == 'tiny' (got {js.get('profile')!r})")
    ck.check(js.get("tensors") == TINY_TENSORS, f"json tensors == {TINY_TENSORS} (got {js.get('tensors')!r})")
    ck.check(js.get("skipped_vision_tensors") == vision,
             f"json skipped_vision_tensors == {vision} (got {js.get('skipped_vision_tensors')!r})")
    # Optional fields: checked when lily reports them.
    eos = [IM_END, ENDOFTEXT] if "--eos-list" in flags else [ENDOFTEXT]
    optional = {
        "layers": 8, "hidden_size": 256, "vocab_size": 4096, "experts": 32, "experts_per_token": 8,
        "linear_attention_layers": 6, "full_attention_layers": 2, "q4_projections": TINY_Q4_PROJECTIONS,
        "q8_projections": TINY_Q8_PROJECTIONS, "dense_tensors": TINY_DENSE, "shards": n_shards,
        "eos_token_ids": eos,
    }
    for key, want in optional.items():
        if key in js:
            ck.check(js[key] == want, f"json {key} == {want!r} (got {js[key]!r})")
        else:
            print(f"SKIP: json has no field {key!r}")


def check_refused(ck: Checker, lily: str, out: str, case: str, summary: dict) -> None:
    p = ck.run([lily, "inspect", "--model", out])
    ck.check(p.returncode == 2, f"`lily inspect` exits 2 (got {p.returncode})")
    err = p.stderr
    ck.check(err.startswith("error: "), f"stderr starts with 'error: ' (stderr {err.strip()!r})")
    if case == "router-4bit":
        name = "language_model.model.layers.0.mlp.gate"
        ck.check(name in err, f"message names the router tensor {name}")
        ck.check("4-bit" in err and "8-bit" in err, "message says found 4-bit, expected 8-bit")
    elif case == "missing-tensor":
        name = summary["dropped"]
        ck.check(name in err, f"message names the dropped tensor {name}")
    elif case == "extra-tensor":
        name = summary["extra"]
        ck.check(name in err, f"message names the extra tensor {name}")
    elif case == "tiny-without-marker":
        ck.check("config.json" in err, "message names config.json")
        named = [f for f in TINY_VS_PRODUCTION_FIELDS if f in err]
        ck.check(bool(named), f"message names a field that differs from production (named: {named})")


def check_deterministic(ck: Checker, work: str, seed: int) -> None:
    a, b, c = work + "-a", work + "-b", work + "-c"
    sa = write(ck, a, seed, ["--vision-tower"])
    sb = write(ck, b, seed, ["--vision-tower"])
    sc = write(ck, c, seed + 1, ["--vision-tower"])
    if not (sa and sb and sc):
        return
    same = all(filecmp.cmp(os.path.join(a, f), os.path.join(b, f), shallow=False) for f in sa["files"])
    ck.check(sa["files"] == sb["files"] and same, f"two runs with seed {seed} write byte-identical files")
    differ = any(not filecmp.cmp(os.path.join(a, f), os.path.join(c, f), shallow=False)
                 for f in sa["files"] if f.endswith(".safetensors"))
    ck.check(differ, f"seed {seed + 1} writes different tensor data than seed {seed}")
    if not ck.failed:
        for d in (a, b, c):
            shutil.rmtree(d, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lily", required=True, help="path to the lily binary")
    ap.add_argument("--work", required=True, help="checkpoint directory to (re)create")
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--case", required=True, choices=sorted(ACCEPT) + sorted(REFUSE) + ["deterministic"])
    ap.add_argument("--drop", default=None, help="missing-tensor: which tensor to drop (default: seeded choice)")
    ap.add_argument("--keep", action="store_true", help="keep the checkpoint directory after a pass")
    args = ap.parse_args()

    ck = Checker()
    print(f"case {args.case}, seed {args.seed}, lily {args.lily}, dir {args.work}")
    if args.case == "deterministic":
        check_deterministic(ck, args.work, args.seed)
        return ck.finish()

    flags = list(ACCEPT[args.case] if args.case in ACCEPT else REFUSE[args.case])
    if args.drop:
        flags += ["--drop", args.drop]
    summary = write(ck, args.work, args.seed, flags)
    if summary is None:
        return ck.finish()
    print(f"writer summary: {json.dumps(summary, sort_keys=True)}")
    if args.case in ACCEPT:
        check_accepted(ck, args.lily, args.work, summary, flags)
    else:
        check_refused(ck, args.lily, args.work, args.case, summary)
    rc = ck.finish()
    if rc == 0 and not args.keep:
        shutil.rmtree(args.work, ignore_errors=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
