#!/usr/bin/env bash
# Builds the virtual environment in .venv from scratch: shardbench with its test tools, CPU torch.
# `make` calls this whenever pyproject.toml, constraints.txt or this file change.
set -euo pipefail
cd "$(dirname "$0")"
started=$SECONDS
step() { echo "setup [$((SECONDS - started)) s] $*"; }
step "building .venv from scratch (once, and again when the dependencies change): about 5-6 minutes on a 2-core machine"
rm -rf .venv
python3 -m venv .venv
# torch first and pinned, so that nothing later can pull the CUDA build.
step "1/3 torch 2.13.0, CPU build (about 1 minute)"
.venv/bin/pip install --quiet -c constraints.txt "torch==2.13.0"
step "2/3 shardbench and its dependencies: numpy, scipy, ortools, HiGHS, fbgemm-gpu-cpu, ray, ... (about 4 minutes)"
.venv/bin/pip install --quiet -c constraints.txt -e ".[test]"
# TorchRec without its dependencies (they are in pyproject.toml): its own would pull CUDA fbgemm-gpu.
step "3/3 torchrec 1.8.0 (seconds)"
.venv/bin/pip install --quiet --no-deps "torchrec==1.8.0"
step "ready: .venv"
