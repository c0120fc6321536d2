#!/usr/bin/env bash
# The GPU check on the lent machine as it is (docs/scaling.md): no registry there, so the wheels its image lacks
# travel in .gpu-bundle/ (`make gpu-bundle`, requirements-gpu-bundle.txt). One command, no network:
#
#   1. a virtual environment over the image's interpreter ($PYTHON, default python3: torch and transformers),
#      --system-site-packages plus a .pth line for that interpreter's own site-packages (it is itself a venv on
#      the device: /opt/torch/.venv), then the bundle into it with --no-index --no-deps, and oar from src/;
#   2. the stack (versions, unmet requirements of the bundle, the GPU: gpu_stack.py) into $OUT/stack.txt;
#   3. checks/gpu_check.py under `timeout` (GPU_RUN_TIMEOUT_S, default 480 s; the check's own --deadline-s
#      420 skips trainer steps that would end later), writing $OUT/gpu_check.json and .md.
#
#   bash checks/gpu_run.sh [gpu_check.py arguments]        # on the device: run(..., carry=[".gpu-bundle"])
#   OUT=runs/x PYTHON=... bash checks/gpu_run.sh --smoke   # the CPU rehearsal (make gpu-rehearsal)
#
# Everything printed also goes to $OUT/gpu_run.log. Exit status: gpu_check.py's (124: the timeout).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
BUNDLE=${BUNDLE:-.gpu-bundle}
OUT=${OUT:-runs/gpu_run}
VENV=${VENV:-${TMPDIR:-/tmp}/oar-gpu-venv}
LIMIT=${GPU_RUN_TIMEOUT_S:-480}

shopt -s nullglob
wheels=("$BUNDLE"/*.whl)
if [ ${#wheels[@]} -eq 0 ]; then
    echo "gpu_run: no wheels in BUNDLE=$BUNDLE (run 'make gpu-bundle' here and carry .gpu-bundle)" >&2
    exit 2
fi
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
# pip reads no configuration (no index, no find-links) and asks no registry
export PIP_CONFIG_FILE=/dev/null PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1
unset PIP_FIND_LINKS PIP_INDEX_URL PIP_EXTRA_INDEX_URL PIP_CONSTRAINT

run() {
    local t0=$SECONDS
    echo "gpu_run: $("$PYTHON" -c 'import sys; print(sys.executable, sys.version.split()[0])'), bundle $BUNDLE" \
        "(${#wheels[@]} wheels, $(du -sh "$BUNDLE" | cut -f1)), venv $VENV, out $OUT"
    rm -rf "$VENV"
    local site py
    if "$PYTHON" -m venv --without-pip --system-site-packages "$VENV"; then
        py=$VENV/bin/python
        site=$("$py" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
        # oar from this tree, then the image interpreter's own site-packages (after the venv's: the bundle wins)
        "$PYTHON" -c "import site; print('$PWD/src'); print('\n'.join(site.getsitepackages()))" \
            > "$site/zz_oar_gpu_image.pth"
    else  # no venv module: the bundle in a folder of its own, first on PYTHONPATH
        echo "gpu_run: '$PYTHON -m venv' failed; the bundle goes to $VENV/site on PYTHONPATH instead"
        py=$PYTHON site=$VENV/site
        mkdir -p "$site"
        export PYTHONPATH=$site:$PWD/src${PYTHONPATH:+:$PYTHONPATH}
    fi
    # the image's pip installs into that site-packages: the venv needs no pip of its own
    PIP_ROOT_USER_ACTION=ignore "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --target "$site" \
        "${wheels[@]}"
    {
        "$py" checks/gpu_stack.py "$BUNDLE"
        if command -v nvidia-smi >/dev/null; then
            nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
        fi
    } 2>&1 | tee "$OUT/stack.txt"
    echo "gpu_run: environment ready in $((SECONDS - t0)) s; gpu_check.py with a ${LIMIT} s timeout"
    local rc=0
    timeout -k 10 "$LIMIT" "$py" checks/gpu_check.py --out "$OUT/gpu_check" --deadline-s 420 "$@" || rc=$?
    echo "gpu_run: gpu_check.py exited $rc after $((SECONDS - t0)) s"
    return $rc
}

run "$@" 2>&1 | tee "$OUT/gpu_run.log"
