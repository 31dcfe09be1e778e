#!/usr/bin/env bash
# A cached Python venv under the build directory, made or remade only when what it was made from
# changes:
#
#   scripts/python-venv.sh VENV STAMP PIP-INSTALL-ARGUMENTS...
#
# VENV is made with $SANDMESH_PYTHON (default python3) and the arguments installed into it with
# pip, unless its stamp file already holds STAMP (a digest of what the caller installs from).
# One installer at a time, under an advisory lock the kernel lets go of when its holder dies (as
# the Rust tests' venvs, test_support::python_venv). A venv counts as ready only by its stamp,
# written after a complete install; an install that died halfway (a killed `venv` or `pip`: its
# marker is still there) starts over from an empty venv instead of building on what it left,
# so a killed CI run cannot leave a cache that fails every later one.
set -euo pipefail
venv=$1 stamp=$2
shift 2
python=${SANDMESH_PYTHON:-python3}
mkdir -p "$(dirname "$venv")"
if command -v flock >/dev/null; then
  exec 9>"$venv.flock"
  flock 9
fi
if [ "$(cat "$venv/.sandmesh-installed" 2>/dev/null)" = "$stamp" ]; then
  exit 0
fi
if [ -e "$venv/.sandmesh-installing" ]; then
  echo "python-venv: an install into $venv did not finish: starting over" >&2
  rm -rf "$venv"
elif [ -e "$venv" ]; then
  echo "python-venv: $venv was made from something else: remaking it" >&2
  rm -rf "$venv"
fi
mkdir -p "$venv"
: >"$venv/.sandmesh-installing"
echo "python-venv: creating $venv and installing into it (pip, from the machine's package index)" >&2
"$python" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$@"
echo "$stamp" >"$venv/.sandmesh-installed"
rm "$venv/.sandmesh-installing"
