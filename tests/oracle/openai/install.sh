#!/bin/sh
# Installs the OpenAI-client conformance tests' pinned npm packages into tests/oracle/openai/node_modules.
set -eu
cd "$(dirname "$0")"
npm ci --no-audit --no-fund
