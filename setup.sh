#!/usr/bin/env bash
# Builds the virtual environment in .venv from scratch: shardbench with its test tools, CPU torch.
# `make` calls this whenever pyproject.toml, constraints.txt or this file change.
set -euo pipefail
cd "$(dirname "$0")"
rm -rf .venv
python3 -m venv .venv
# torch first and pinned, so that nothing later can pull the CUDA build.
.venv/bin/pip install --quiet -c constraints.txt "torch==2.13.0"
.venv/bin/pip install --quiet -c constraints.txt -e ".[test]"
# TorchRec without its dependencies (they are in pyproject.toml): its own would pull CUDA fbgemm-gpu.
.venv/bin/pip install --quiet --no-deps "torchrec==1.8.0"
echo "ready: .venv"
