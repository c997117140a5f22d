# Sourced by check.sh and lm_eval.sh: `start_spot_serve LOG SPOT ARGS...` starts `SPOT ARGS...`
# (a `spot serve --port 0 ...` command line) with its stderr in LOG, stops it when the calling
# script exits, and waits up to 60 s for its address: sets `url` and `pid`, or prints the log
# and exits 1.
start_spot_serve() {
    local log="$1"
    shift
    "$@" 2>"$log" &
    pid=$!
    trap 'kill $pid 2>/dev/null || true; wait $pid 2>/dev/null || true' EXIT
    url=""
    for _ in $(seq 600); do
        url=$(sed -n 's/.*listening on \(http:[^ ]*\).*/\1/p' "$log")
        [ -n "$url" ] && return 0
        if ! kill -0 "$pid" 2>/dev/null; then
            echo "spot serve exited:"; cat "$log"; exit 1
        fi
        sleep 0.1
    done
    echo "spot serve did not start within 60 s:"; cat "$log"; exit 1
}
