#!/usr/bin/env bash
# The one-call device check (docs/gpu.md): bench/gpu_check.py under the machine's own python3.
#   bash bench/gpu_check.sh prep       # where PyPI is reachable: .whl/ (use the project's venv: DeepSpeed builds with torch)
#   bash bench/gpu_check.sh run        # on the GPU machine, .whl carried; figures as JSON under $OUT
#   bash bench/gpu_check.sh dry-run    # on any CPU: the same steps, tiny
set -euo pipefail
cd "$(dirname "$0")/.."
mode="${1:-dry-run}"
shift || true
py=python3
if [ "$mode" != run ] && [ -x .venv/bin/python ]; then py=.venv/bin/python; fi
exec "$py" bench/gpu_check.py "$mode" "$@"
