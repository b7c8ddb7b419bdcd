#!/usr/bin/env python3
# `cmake --install` into a temporary prefix: the files it lays out, the installed lily runs, the unit names the prefix's paths (and passes systemd-analyze verify).
"""Run by CTest:

    python3 tests/deploy/test_install.py --cmake CMAKE --build BUILD_DIR            (deploy_install)
    python3 tests/deploy/test_install.py --cmake CMAKE --build BUILD_DIR --verify   (deploy_unit_verify)

--verify runs `systemd-analyze verify` on the installed unit (and on a broken copy, which it
must reject); without systemd-analyze it exits 77, which CTest reports as SKIPPED.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile

EXPECTED = {  # installed path -> must be executable
    "bin/lily": True,
    "libexec/lily/lily-wait-ready": True,
    "lib/systemd/system/lily.service": False,
    "share/lily/lily.env.example": False,
    "share/lily/haproxy.cfg": False,
    "share/doc/lily/deploy.md": False,
}
SKIPPED = 77


def fail(message: str) -> int:
    print(f"FAIL: {message}", file=sys.stderr)
    return 1


def install(cmake: str, build: str, prefix: str) -> subprocess.CompletedProcess:
    return subprocess.run([cmake, "--install", build, "--prefix", prefix],
                          capture_output=True, text=True, timeout=300)


def check_layout(prefix: str, source: str) -> str | None:
    for path, executable in EXPECTED.items():
        full = os.path.join(prefix, path)
        if not os.path.isfile(full):
            return f"{path} not installed"
        if executable and not os.stat(full).st_mode & stat.S_IXUSR:
            return f"{path} installed without its execute bit"
    for installed, original in (("share/lily/haproxy.cfg", "packaging/haproxy.cfg"),
                                ("libexec/lily/lily-wait-ready", "packaging/lily-wait-ready")):
        with open(os.path.join(prefix, installed), "rb") as a, \
                open(os.path.join(source, original), "rb") as b:
            if a.read() != b.read():
                return f"{installed} differs from {original}"
    return None


def check_unit(prefix: str) -> str | None:
    with open(os.path.join(prefix, "lib/systemd/system/lily.service"), encoding="utf-8") as f:
        unit = f.read()
    if re.search(r"@[A-Z_]+@", unit):
        return f"the installed unit still has an unsubstituted @VAR@:\n{unit}"
    want = {
        "ExecStart": f"{prefix}/bin/lily serve --bind ${{LILY_BIND}} $LILY_OPTIONS",
        "ExecStartPost": f"{prefix}/libexec/lily/lily-wait-ready ${{LILY_BIND}} "
                         "${LILY_READY_TIMEOUT} $MAINPID",
        "Documentation": f"file://{prefix}/share/doc/lily/deploy.md",
        "Restart": "on-failure",
        "EnvironmentFile": "/etc/lily/lily.env",
    }
    for key, value in want.items():
        lines = re.findall(rf"^{key}=(.*)$", unit, flags=re.M)
        if lines != [value]:
            return f"the installed unit's {key}= is {lines}, expected [{value!r}]"
    return None


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cmake", required=True)
    parser.add_argument("--build", required=True)
    parser.add_argument("--source", required=True)
    parser.add_argument("--verify", action="store_true")
    args = parser.parse_args()

    analyze = None
    if args.verify:
        analyze = shutil.which("systemd-analyze")
        if analyze is None:
            print("SKIPPED: systemd-analyze not found (Debian's systemd package); the unit was "
                  "not verified")
            return SKIPPED

    with tempfile.TemporaryDirectory(prefix="lily-install-") as tmp:
        prefix = os.path.join(tmp, "usr")
        result = install(args.cmake, args.build, prefix)
        if result.returncode != 0:
            return fail(f"cmake --install failed ({result.returncode}):\n{result.stdout}{result.stderr}")
        problem = check_layout(prefix, args.source) or check_unit(prefix)
        if problem:
            return fail(problem)
        version = subprocess.run([os.path.join(prefix, "bin/lily"), "--version"],
                                 capture_output=True, text=True, timeout=60)
        if version.returncode != 0 or not re.match(r"^lily \d+\.\d+\.\d+ \(commit [0-9a-f]{40}",
                                                   version.stdout):
            return fail(f"the installed lily --version: exit {version.returncode}, "
                        f"{version.stdout!r} {version.stderr!r}")
        print(f"installed into {prefix}: {version.stdout.strip()}")

        if analyze:
            unit = os.path.join(prefix, "lib/systemd/system/lily.service")
            result = subprocess.run([analyze, "verify", unit], capture_output=True, text=True,
                                    timeout=120)
            if result.returncode != 0 or result.stderr.strip():
                return fail(f"systemd-analyze verify {unit}: exit {result.returncode}\n"
                            f"{result.stdout}{result.stderr}")
            # The check itself must be able to fail: a typo and a missing program are caught.
            broken = os.path.join(tmp, "lily.service")
            with open(unit, encoding="utf-8") as f:
                text = f.read()
            with open(broken, "w", encoding="utf-8") as f:
                f.write(text.replace("Restart=on-failure", "Restart=on-failur")
                        .replace(f"{prefix}/libexec/lily/lily-wait-ready", "/nonexistent/wait"))
            result = subprocess.run([analyze, "verify", broken], capture_output=True, text=True,
                                    timeout=120)
            if "on-failur" not in result.stderr or "/nonexistent/wait" not in result.stderr:
                return fail(f"systemd-analyze verify did not catch a broken unit:\n{result.stderr}")
            print(f"systemd-analyze verify: {unit} is clean, a broken copy is rejected")
    return 0


if __name__ == "__main__":
    sys.exit(main())
