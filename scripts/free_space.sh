# Sourced by setup_env.sh and run_tests.sh: refuse to start when a folder's file system has too
# little room, instead of failing minutes later with "No space left on device".
#   require_free_gb WHO DIR GB WHAT
require_free_gb() {
  local who=$1 dir=$2 need=$3 what=$4 free_kb
  free_kb=$(df -Pk "$dir" 2>/dev/null | awk 'NR == 2 {print $4}')
  [[ -z "$free_kb" ]] && return 0  # df could not say: let the job try
  if (( free_kb < need * 1024 * 1024 )); then
    echo "$who: $(( free_kb / 1024 )) MB free on the file system of $dir; $what needs about $need GB." >&2
    echo "$who: free some space there (old clones, .venv folders, leftover $dir/tfhash-tests-* folders) or point TMPDIR elsewhere." >&2
    return 1
  fi
}
