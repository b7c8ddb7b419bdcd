#!/usr/bin/env bash
# Installs the chat oracle's npm packages (exact versions from package-lock.json) into tests/oracle/chat/node_modules.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
npm ci --no-audit --no-fund
