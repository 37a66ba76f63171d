#!/usr/bin/env bash
# One-command set-up: a virtual environment in .venv with shardbench and its test tools installed.
set -euo pipefail
cd "$(dirname "$0")"
python3 -m venv .venv
# torch first and pinned, so that nothing later can pull the CUDA build.
.venv/bin/pip install --quiet -c constraints.txt "torch==2.13.0"
.venv/bin/pip install --quiet -c constraints.txt -e ".[test]"
echo "ready: source .venv/bin/activate"
