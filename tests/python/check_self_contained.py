# Fails, listing file:line, when a tracked file cites a document that is not in the repository.
"""Check that the repository is self-contained: no tracked file cites a document outside it.

    check_self_contained.py --repo DIR [--patterns FILE]   check DIR's tracked files
    check_self_contained.py --self-test [--patterns FILE]  check that the check can fail

The patterns (one regular expression per line) live in a file of their own,
self_contained_patterns.txt next to this script, which is the one tracked file not read, so
that neither the patterns nor this script trip the check. Files are those `git ls-files`
lists, read from the working tree; binary files (a NUL byte) are skipped.

Exit codes: 0 clean; 1 citations found (each as `path:line: text` on stdout) or the self test
failed; 2 bad arguments, an unreadable pattern file or a failing git; 77 (ctest SKIP) when DIR
is not a git checkout, since only then is there no list of tracked files.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_PATTERNS = os.path.join(HERE, "self_contained_patterns.txt")
# Where the pattern file sits inside the repository: the file the check does not read.
PATTERNS_REPO_PATH = "tests/python/self_contained_patterns.txt"
SKIP = 77


class Usage(Exception):
    """Bad input: reported on stderr with exit 2."""


def read_patterns(path: str) -> tuple[list[re.Pattern[str]], list[str]]:
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError as e:
        raise Usage(f"cannot read the pattern file {path}: {e.strerror}") from e
    patterns: list[re.Pattern[str]] = []
    examples: list[str] = []
    for number, line in enumerate(lines, 1):
        if not line.strip() or line.startswith("#"):
            continue
        if line.startswith("example: "):
            examples.append(line[len("example: "):])
            continue
        try:
            patterns.append(re.compile(line, re.IGNORECASE))
        except re.error as e:
            raise Usage(f"{path}:{number}: not a regular expression ({e}): {line}") from e
    if not patterns:
        raise Usage(f"{path} holds no pattern; expected one regular expression per line")
    return patterns, examples


def tracked_files(repo: str) -> list[str]:
    # safe.directory: CI may run as another user than the checkout's owner, and git then
    # refuses to read the repository at all.
    result = subprocess.run(
        ["git", "-c", f"safe.directory={repo}", "-C", repo, "ls-files", "-z"],
        capture_output=True, check=False)
    if result.returncode != 0:
        raise Usage(f"git ls-files failed in {repo}: "
                    f"{result.stderr.decode('utf-8', 'replace').strip()}")
    return [p for p in result.stdout.decode("utf-8", "surrogateescape").split("\0") if p]


def find_citations(repo: str, patterns: list[re.Pattern[str]]) -> tuple[list[str], int]:
    """Returns the `path:line: text` hits and the number of files read."""
    hits: list[str] = []
    read = 0
    for path in sorted(tracked_files(repo)):
        if path == PATTERNS_REPO_PATH:
            continue
        full = os.path.join(repo, path)
        if not os.path.isfile(full):  # deleted in the working tree, or a submodule
            continue
        with open(full, "rb") as f:
            data = f.read()
        if b"\0" in data:
            continue
        read += 1
        for number, line in enumerate(data.decode("utf-8", "replace").splitlines(), 1):
            if any(p.search(line) for p in patterns):
                hits.append(f"{path}:{number}: {line.strip()}")
    return hits, read


def check_repo(repo: str, patterns_path: str) -> int:
    if not os.path.isdir(repo):
        raise Usage(f"--repo {repo} is not a directory")
    if not os.path.exists(os.path.join(repo, ".git")):
        print(f"SKIPPED: {repo} is not a git checkout, so there is no list of tracked files")
        return SKIP
    patterns, _ = read_patterns(patterns_path)
    hits, read = find_citations(repo, patterns)
    if hits:
        print(f"{len(hits)} line(s) cite documents that are not in the repository "
              f"(patterns: {PATTERNS_REPO_PATH}); cite the docs/ page that states the rule, "
              "or state it where it is used:")
        for hit in hits:
            print(hit)
        return 1
    print(f"{read} tracked text files read: none cites a document outside the repository")
    return 0


def self_test(patterns_path: str) -> int:
    """A scratch repository with every example must fail, listing each; a clean one must pass."""
    patterns, examples = read_patterns(patterns_path)
    failures: list[str] = []
    if not examples:
        failures.append(f"{patterns_path} has no `example: ` lines to test with")
    for p in patterns:
        if not any(p.search(e) for e in examples):
            failures.append(f"no example is caught by the pattern {p.pattern!r}")
    with tempfile.TemporaryDirectory() as repo:
        subprocess.run(["git", "init", "-q", repo], check=True)
        os.makedirs(os.path.join(repo, os.path.dirname(PATTERNS_REPO_PATH)))
        with open(os.path.join(repo, PATTERNS_REPO_PATH), "w", encoding="utf-8") as f:
            f.write("\n".join(examples) + "\n")  # the pattern file itself is not read
        with open(os.path.join(repo, "clean.md"), "w", encoding="utf-8") as f:
            f.write("See docs/api.md and tests/reference/x.txt.\n")
        with open(os.path.join(repo, "untracked.md"), "w", encoding="utf-8") as f:
            f.write(examples[0] + "\n" if examples else "")
        with open(os.path.join(repo, "binary.bin"), "wb") as f:
            f.write(b"\0" + (examples[0].encode() if examples else b""))
        subprocess.run(["git", "-C", repo, "add", "clean.md", "binary.bin",
                        PATTERNS_REPO_PATH], check=True)
        hits, _ = find_citations(repo, patterns)
        if hits:
            failures.append(f"a clean repository reported {hits}")
        with open(os.path.join(repo, "cites.md"), "w", encoding="utf-8") as f:
            f.write("a clean first line\n" + "\n".join(examples) + "\n")
        subprocess.run(["git", "-C", repo, "add", "cites.md"], check=True)
        hits, _ = find_citations(repo, patterns)
        expected = [f"cites.md:{i + 2}: {e.strip()}" for i, e in enumerate(examples)]
        if hits != expected:
            failures.append(f"expected exactly {expected}, got {hits}")
    if failures:
        print("self test FAILED:")
        for failure in failures:
            print("  " + failure)
        return 1
    print(f"self test ok: {len(patterns)} patterns, {len(examples)} examples, each reported "
          "as path:line; a clean repository, untracked and binary files pass")
    return 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", help="the git checkout to check")
    parser.add_argument("--patterns", default=DEFAULT_PATTERNS, help="the pattern file")
    parser.add_argument("--self-test", action="store_true",
                        help="check on a scratch repository that citations are reported")
    args = parser.parse_args(argv)
    try:
        if args.self_test == (args.repo is not None):
            raise Usage("give exactly one of --repo DIR and --self-test")
        if args.self_test:
            return self_test(args.patterns)
        return check_repo(os.path.abspath(args.repo), args.patterns)
    except Usage as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
