# Sourced by scripts/build-cuda.sh and scripts/hf-venv.sh: a Python venv cached outside the repo
# with pinned requirements from PyPI, set up once.
#
#   pinned_venv TAG VENV PYTHON STAMP VENV_ARGS REQUIREMENT...
#
# Creates VENV with `PYTHON -m venv VENV_ARGS` unless a complete one is there, then installs the
# REQUIREMENTs (no pip cache: the venv is the cache) unless the stamp file VENV/STAMP records
# exactly them. Messages start with TAG. Takes the lock VENV.lock on file descriptor 9 and keeps
# it (one set-up at a time): the caller closes it (exec 9>&-) when done, or exits.
pinned_venv() {
  local tag="$1" venv="$2" py="$3" stamp="$2/$4" venv_args="$5" want start
  shift 5
  want="$(printf '%s\n' "$@")"
  mkdir -p "$(dirname "$venv")"
  exec 9>"$venv.lock"
  flock 9
  if [ ! -x "$venv/bin/pip" ]; then  # pip is the last thing venv installs: none, or a cut-off one
    if [ -e "$venv" ] && [ ! -f "$venv/pyvenv.cfg" ]; then
      echo "$tag: $venv exists and is not a venv" >&2
      exit 1
    fi
    rm -rf "$venv"
    echo "$tag: creating the venv $venv" >&2
    # shellcheck disable=SC2086  # VENV_ARGS: zero or more words
    "$py" -m venv $venv_args "$venv" || {
      echo "$tag: '$py -m venv' failed (Debian: apt-get install python3-venv)" >&2
      rm -rf "$venv"
      exit 1
    }
  fi
  if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    echo "$tag: installing $* from PyPI" >&2
    start=$SECONDS
    rm -f "$stamp"
    "$venv/bin/python" -m pip install --no-cache-dir --disable-pip-version-check \
      --progress-bar off -q "$@"
    printf '%s\n' "$want" >"$stamp"
    echo "$tag: installed in $((SECONDS - start)) s" >&2
  fi
}
