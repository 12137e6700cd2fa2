# Sourced by a script run on the device machine (`run(command="bash my.sh", carry=[".whl"])`):
#
#     source benchmarks/device/bounded.sh          # installs the carried .whl, sets PYTHONPATH
#     bounded suite 420 python3 -m pytest tests/gpu -n 14 -p no:benchmark --timeout 240 ...
#     bounded step 200 python3 benchmarks/train_throughput.py ... --out $OUT/step.json
#
# `bounded NAME SECONDS CMD...` runs CMD in a process group of its own with its output in $OUT/NAME.log (a step
# killed at its limit still returns its log), kills the whole group after SECONDS, then prints the exit status
# and the log's last $TAILN lines. Why the group: `timeout` kills only pytest's main process, and its xdist
# workers, holding the output pipe, then keep the call alive until the call's own limit, with nothing returned
# (docs/perf.md, 2026-12-06, sixth session).
: "${OUT:?OUT: the folder whose files come back from the device machine}"

if [ -d .whl ] && [ -z "${BOUNDED_NO_INSTALL:-}" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl 2>&1 | tail -2
  export PYTHONPATH=/tmp/site:$PWD
fi
export RAY_AUTH_MODE=disabled PYTHONUNBUFFERED=1

bounded() {
  local name=$1 secs=$2 pid rc i
  shift 2
  setsid "$@" > "$OUT/$name.log" 2>&1 &
  pid=$!
  for ((i = 0; i < secs * 5; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
  if kill -0 "$pid" 2>/dev/null; then
    echo "$name: killed after $secs s" | tee -a "$OUT/$name.log"
    kill -9 -- "-$pid" 2>/dev/null
  fi
  wait "$pid" 2>/dev/null
  rc=$?
  echo "== $name: exit $rc"
  tail -n "${TAILN:-12}" "$OUT/$name.log"
  return $rc
}
