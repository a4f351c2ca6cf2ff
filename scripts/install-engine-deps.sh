#!/usr/bin/env bash
# The engines' own code for client/python/tests/engines: a virtual environment .venv-engines
# with PyPI's torch (it runs on CPU), sglang, lmcache and vllm installed with --no-deps (their
# declared dependencies pin CUDA-only packages and other torch versions) plus what their
# Mooncake modules import, and Yutu's package, built from ./client/python. No Mooncake: the
# engines' `import mooncake.store` resolves to Yutu's through the package's opt-in hook
# (YUTU_MOONCAKE=1). About 7 GB; the first run downloads about 4 GB. Idempotent and quick
# when done (the package is rebuilt by scripts/test.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
dir=.venv-engines
reqs=client/python/tests/engines/requirements.txt
nodeps=client/python/tests/engines/requirements-nodeps.txt
stamp="$dir/.requirements"
if [ -x "$dir/bin/python" ] && cat "$reqs" "$nodeps" | cmp -s - "$stamp"; then
    exit 0
fi
python3 -m venv "$dir"
# No pip cache: the wheels (about 4 GB, mostly torch and its CUDA libraries) would stay on
# disk beside the installed copies.
"$dir/bin/pip" install -q --no-cache-dir --upgrade pip
"$dir/bin/pip" install -q --no-cache-dir -r "$reqs" maturin
"$dir/bin/pip" install -q --no-cache-dir --no-deps -r "$nodeps"
if "$dir/bin/python" -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec("mooncake") is None)'; then
    echo "install-engine-deps: $dir has a real mooncake package; the engine tests need it absent" >&2
    exit 1
fi
cat "$reqs" "$nodeps" > "$stamp"
echo "install-engine-deps: $dir ready ($("$dir/bin/python" -c 'import torch, sglang, lmcache, vllm; print("torch", torch.__version__, "sglang", sglang.__version__, "lmcache", lmcache.__version__, "vllm", vllm.__version__)' 2>/dev/null | tail -1))"
