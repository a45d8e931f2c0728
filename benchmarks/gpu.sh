#!/usr/bin/env bash
# The benchmarks on a CUDA machine that has torch but not scalertune's other dependencies.
#
#   benchmarks/gpu.sh fetch   # where pip can reach the package index: wheels into .whl/
#   benchmarks/gpu.sh run     # on the CUDA machine, with .whl/ copied beside the checkout
#
# `fetch` downloads scalertune's dependencies except torch (the CUDA machine keeps its own
# build) as wheels for CPython 3.12 on x86-64 Linux; `run` installs them into a private folder
# and runs benchmarks/run.py --device cuda, which prints the search's cost, the harness's
# overhead with host syncs per step, and float16 and bfloat16 step time against float32.
set -euo pipefail
cd "$(dirname "$0")/.."
WHEELS=.whl
PYTHON_VERSION=${PYTHON_VERSION:-3.12}

case "${1:-}" in
fetch)
    mkdir -p "$WHEELS"
    python3 -m pip download --only-binary=:all: --python-version "$PYTHON_VERSION" \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 -d "$WHEELS" \
        "optuna>=5.0" "pyyaml>=6.0" "tqdm>=4.64" sqlalchemy alembic colorlog packaging \
        mako markupsafe typing-extensions greenlet numpy
    # the dependencies' own torch pin is not wanted: the CUDA machine has torch already
    rm -f "$WHEELS"/torch-*.whl "$WHEELS"/nvidia_*.whl "$WHEELS"/triton-*.whl
    ;;
run)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/scalertune-site "$WHEELS"/*.whl
    export PYTHONPATH="/tmp/scalertune-site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
    python3 -c "import torch; assert torch.cuda.is_available(), 'no CUDA device here'"
    PYTHONUNBUFFERED=1 python3 benchmarks/run.py --device cuda \
        --only cost overhead steps "${@:2}"
    ;;
*)
    echo "usage: benchmarks/gpu.sh fetch | run" >&2
    exit 2
    ;;
esac
