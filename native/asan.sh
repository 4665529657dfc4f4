#!/usr/bin/env bash
# Run the kernel tests against an AddressSanitizer build of native/statebackend_native.c.
# Needs gcc with libasan. Usage: bash native/asan.sh [extra pytest args]
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cp -r "$here/statebackend" "$here/tests" "$work/"
rm -f "$work"/statebackend/_native*.so
gcc -shared -fPIC -O1 -g -fsanitize=address -fno-omit-frame-pointer -std=c99 \
    $(python3-config --includes) "$here/native/statebackend_native.c" \
    -o "$work/statebackend/_native$(python3-config --extension-suffix)"
cd "$work"
export ASAN_OPTIONS=detect_leaks=0 LD_PRELOAD="$(gcc -print-file-name=libasan.so)" PYTHONPATH="$work"
python -c "import statebackend.keys.kernels as k; assert k.BACKEND == 'native' and k.native.__file__.startswith('$work'), k.native"
python -m pytest -p no:cacheprovider -q tests/test_native.py tests/state/test_value_blocks.py \
    tests/state/test_value_batch.py tests/test_keycodec.py tests/test_rocksdb_multi_get.py "$@"
