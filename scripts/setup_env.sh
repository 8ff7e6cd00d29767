#!/usr/bin/env bash
# Create or update the project's .venv (Python 3.10, the tested set in constraints/py310.txt).
# Idempotent: when pyproject.toml, setup.py, the search proto, the constraints and the interpreter
# are unchanged it only checks and returns in about a second.
set -euo pipefail
cd "$(dirname "$0")/.."

is_python310() {
  "$1" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 10))' >/dev/null 2>&1
}

find_python310() {
  if [[ -n "${TFHASH_PYTHON:-}" ]]; then
    is_python310 "$TFHASH_PYTHON" && { echo "$TFHASH_PYTHON"; return; }
    echo "setup_env: TFHASH_PYTHON=$TFHASH_PYTHON is not a working Python 3.10" >&2
    return 1
  fi
  local root candidate
  if command -v pyenv >/dev/null 2>&1; then root=$(pyenv root); else root="${PYENV_ROOT:-$HOME/.pyenv}"; fi
  # A pyenv shim on PATH may exist without 3.10 being selected: try each candidate for real.
  for candidate in "$(command -v python3.10 || true)" "$root"/versions/3.10*/bin/python3.10; do
    if [[ -n "$candidate" && -x "$candidate" ]] && is_python310 "$candidate"; then
      echo "$candidate"
      return
    fi
  done
  return 1
}

if ! PY=$(find_python310); then
  echo "setup_env: Python 3.10 is required (TFX 1.16 supports Python <= 3.10) and none was found." >&2
  echo "setup_env: looked for \$TFHASH_PYTHON, python3.10 on PATH and \$(pyenv root)/versions/3.10*/bin/python3.10." >&2
  echo "setup_env: install it (e.g. 'pyenv install 3.10.13') or set TFHASH_PYTHON=/path/to/python3.10." >&2
  exit 1
fi

stamp_of() {
  { "$PY" -c 'import sys; print(sys.version)'; cat pyproject.toml setup.py serving/search.proto constraints/py310.txt; } | sha256sum | cut -d' ' -f1
}
want=$(stamp_of)
if [[ -x .venv/bin/python && -f .venv/.tfhash-stamp && "$(cat .venv/.tfhash-stamp)" == "$want" ]]; then
  echo "setup_env: .venv is up to date"
  exit 0
fi

if [[ ! -x .venv/bin/python ]] || ! .venv/bin/python -c 'import sys; sys.exit(sys.version_info[:2] != (3, 10))'; then
  echo "setup_env: creating .venv with $PY"
  rm -rf .venv
  "$PY" -m venv .venv
fi
# The installed .venv takes 4.0 GB; pip unpacks the wheels in the temporary folder first.
source scripts/free_space.sh
require_free_gb setup_env . 5 "installing tfhash[all] into .venv" || exit 1
require_free_gb setup_env "${TMPDIR:-/tmp}" 2 "pip's unpacking of the wheels" || exit 1
echo "setup_env: installing tfhash[all] with constraints/py310.txt (first run: several minutes)"
export PIP_DISABLE_PIP_VERSION_CHECK=1
.venv/bin/python -m pip install -q -c constraints/py310.txt -e ".[all]" 2>&1 \
  | grep -v -e "is ignored: it is neither a file nor a directory" -e "legacy 'setup.py install'" || true
# pip's own exit status is lost in the pipe above: check the result directly.
TF_CPP_MIN_LOG_LEVEL=3 .venv/bin/python -W ignore -c 'import tfhash, tensorflow, keras, faiss, scann, pymilvus, milvus_lite, tfx, tfhash.serving.search_pb2_grpc' >/dev/null 2>&1 \
  || { echo "setup_env: installation failed (see pip output above)" >&2; exit 1; }
echo "$want" > .venv/.tfhash-stamp
echo "setup_env: done"
