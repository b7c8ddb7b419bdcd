#!/bin/sh
# Installs the tokenizer oracle's pinned npm packages into tests/oracle/tokenizer/node_modules.
set -eu
cd "$(dirname "$0")"
npm ci --no-audit --no-fund
