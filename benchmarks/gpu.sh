#!/usr/bin/env bash
# The benchmarks on a CUDA machine that has torch but not scalertune's other dependencies.
#
#   benchmarks/gpu.sh fetch   # where pip can reach the package index: wheels into .whl/
#   benchmarks/gpu.sh run     # on the CUDA machine, with .whl/ copied beside the checkout
#   benchmarks/gpu.sh float8  # the float8 rows alone (an H100 or H200: CUDA capability 8.9+)
#
# `fetch` downloads scalertune's dependencies except torch (the CUDA machine keeps its own
# build) as wheels for CPython 3.12 on x86-64 Linux, torchao for float8 among them; `run`
# installs them into a private folder and runs benchmarks/run.py --device cuda, which prints
# the search's cost, the harness's overhead with host syncs per step, and float16 and bfloat16
# step time against float32; then the float8 rows, where the GPU has float8 matmuls: a
# `--space float8` search of the massive-activation regression (tests/float8_workloads.py),
# whose summary times real float8 steps, and benchmarks/float8.py --device cuda (the search's
# answer, torchao's default recipe and float32 trained to the horizon).
set -euo pipefail
cd "$(dirname "$0")/.."
WHEELS=.whl
PYTHON_VERSION=${PYTHON_VERSION:-3.12}

install() {
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/scalertune-site "$WHEELS"/*.whl
    export PYTHONPATH="/tmp/scalertune-site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
    python3 -c "import torch; assert torch.cuda.is_available(), 'no CUDA device here'"
}

float8() {
    if ! python3 -c "import sys, torch; sys.exit(torch.cuda.get_device_capability() < (8, 9))"; then
        echo "float8 rows skipped: this GPU has no float8 matmuls (CUDA capability below 8.9)"
        return 0
    fi
    local folder
    folder=$(mktemp -d)
    # the search times real float8 steps here: its answer may be float8 itself
    SCALERTUNE_FLOAT8_STEPS=200 PYTHONUNBUFFERED=1 python3 -m scalertune search \
        tests/float8_workloads.py:make_model --space float8 --device cuda \
        --storage "$folder/f8.db" -o "$folder/f8.yaml"
    PYTHONUNBUFFERED=1 python3 benchmarks/float8.py --device cuda "$@"
}

case "${1:-}" in
fetch)
    mkdir -p "$WHEELS"
    python3 -m pip download --only-binary=:all: --python-version "$PYTHON_VERSION" \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 -d "$WHEELS" \
        "optuna>=5.0" "pyyaml>=6.0" "tqdm>=4.64" sqlalchemy alembic colorlog packaging \
        mako markupsafe typing-extensions greenlet numpy "torchao>=0.13,<0.19"
    # the dependencies' own torch pin is not wanted: the CUDA machine has torch already
    rm -f "$WHEELS"/torch-*.whl "$WHEELS"/nvidia_*.whl "$WHEELS"/triton-*.whl
    ;;
run)
    install
    PYTHONUNBUFFERED=1 python3 benchmarks/run.py --device cuda \
        --only cost overhead steps "${@:2}"
    float8 --quick
    ;;
float8)
    install
    float8 "${@:2}"
    ;;
*)
    echo "usage: benchmarks/gpu.sh fetch | run | float8 [benchmarks/float8.py's flags]" >&2
    exit 2
    ;;
esac
