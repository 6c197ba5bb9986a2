#!/bin/sh
# SPDX-License-Identifier: GPL-3.0-or-later
# Run tools/gpu_reality_check.py on a bare machine with a real NVIDIA GPU (READ-ONLY), from a checkout.
#
#   sh tools/gpu_reality_check.sh OUTDIR [CARRY [gpu_reality_check.py options]]
#
# CARRY (default .devcarry) may hold what a bare machine lacks, prepared on a build machine by
# `sh tools/gpu_reality_check.sh --prepare CARRY`:
#   wheels/ansible_core-*.whl, wheels/nvidia_ml_py-*.whl
#                                                     installed (to a temp dir) only when python3 lacks them
#   cache/realcomponents/nvidia-device-plugin-<v>/    the real plugin and dp-listwatch of both pinned releases,
#                                                     gzipped (make real-device-plugin builds them)
# and build/nvml/ (the NVML double) is used when present, else built with gcc.
# Everything it runs only reads GPU state: nvidia-smi queries, NVML getters, the plugin's discovery.
set -eu

if [ "${1:-}" = "--prepare" ]; then
    carry=${2:?carry dir}
    repo=$(cd "$(dirname "$0")/.." && pwd)
    cache=${GPUHARDEN_CACHE:-$HOME/.cache/gpuharden}
    mkdir -p "$carry/wheels"
    for dist in ansible-core nvidia-ml-py; do
        "$repo/.venv/bin/python" -m pip download -q --no-deps --only-binary=:all: -d "$carry/wheels" \
            "$dist==$("$repo/.venv/bin/python" -c 'import sys; from importlib.metadata import version; print(version(sys.argv[1]))' $dist)"
    done
    for key in NVIDIA_DEVICE_PLUGIN_VERSION NVIDIA_DEVICE_PLUGIN_OLD_VERSION; do
        version=$(sed -n "s/^$key=//p" "$repo/lab/realcomponents/versions.env")
        mkdir -p "$carry/cache/realcomponents/nvidia-device-plugin-$version"
        for bin in nvidia-device-plugin dp-listwatch; do
            gzip -c "$cache/realcomponents/nvidia-device-plugin-$version/$bin" \
                >"$carry/cache/realcomponents/nvidia-device-plugin-$version/$bin.gz"
        done
    done
    echo "prepared $carry"
    exit 0
fi

out=${1:?output dir}
carry=${2:-.devcarry}
shift $(( $# < 2 ? $# : 2 ))
mkdir -p "$out"
site=/tmp/gpuharden-site
for pair in ansible.module_utils.basic:ansible_core pynvml:nvidia_ml_py; do
    if ! python3 -c "import ${pair%%:*}" 2>/dev/null; then
        python3 -m pip install -q --upgrade --no-index --no-deps --no-compile --no-cache-dir --target "$site" \
            "$carry"/wheels/"${pair#*:}"-*.whl
        case ":${PYTHONPATH:-}:" in *":$site:"*) ;; *) PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH}; export PYTHONPATH ;; esac
    fi
done
if ! ldconfig -p | grep -q 'libnvidia-ml.so.1 '; then
    for d in /usr/local/nvidia/lib64 /usr/local/nvidia/lib /usr/lib/x86_64-linux-gnu /usr/lib64; do
        if [ -e "$d/libnvidia-ml.so.1" ]; then
            LD_LIBRARY_PATH=$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
            export LD_LIBRARY_PATH
            break
        fi
    done
fi
if [ -d "$carry/cache" ]; then  # the carried binaries, unpacked outside the checkout
    GPUHARDEN_CACHE=/tmp/gpuharden-cache
    export GPUHARDEN_CACHE
    for packed in "$carry"/cache/realcomponents/*/*.gz; do
        [ -e "$packed" ] || continue
        dir=$GPUHARDEN_CACHE/realcomponents/$(basename "$(dirname "$packed")")
        mkdir -p "$dir"
        gunzip -c "$packed" >"$dir/$(basename "$packed" .gz)"
        chmod 755 "$dir/$(basename "$packed" .gz)"
    done
fi

{
    echo "== machine"
    uname -r
    echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
    ldconfig -p | grep libnvidia-ml || echo "libnvidia-ml not in ld.so.cache"
    nvidia-smi -L || true
    nvidia-smi --query-gpu=name,driver_version,pci.bus_id,memory.total,mig.mode.current,ecc.mode.current,persistence_mode --format=csv || true
    ls -l /dev/nvidia* /dev/nvidia-caps 2>&1 || true
    ls -R /proc/driver/nvidia/gpus 2>&1 | head -20 || true
    cat /proc/driver/nvidia/version 2>&1 || true
    cat /proc/driver/nvidia-caps/mig-minors 2>&1 | head -5 || true
    ls /sys/bus/pci/devices/ 2>&1 | head -40 || true
    echo "== /proc/devices"
    cat /proc/devices 2>&1 || true
    echo "== /proc/driver/nvidia/capabilities"
    find /proc/driver/nvidia/capabilities -type f 2>/dev/null | sort | while read -r f; do
        echo "-- $f"
        cat "$f" 2>&1 || true
    done
    echo "== /dev/char (nvidia links)"
    ls -l /dev/char 2>&1 | grep -i nvidia || echo "none"
} >"$out/machine.txt" 2>&1
cat "$out/machine.txt"
nvidia-smi -q >"$out/nvidia-smi-q.txt" 2>&1 || true

status=0
PYTHONUNBUFFERED=1 timeout 300 python3 tools/gpu_reality_check.py --json "$out/report.json" "$@" || status=$?
echo "gpu_reality_check.py exit $status"
if [ "$status" = 0 ]; then  # the older pinned plugin release too (v0.15 is the oldest the collection supports)
    PYTHONUNBUFFERED=1 timeout 200 python3 tools/gpu_reality_check.py --json "$out/report-old-plugin.json" \
        --plugin-version old "$@" || status=$?
    echo "gpu_reality_check.py --plugin-version old exit $status"
fi
exit $status
