# Sourced by the scripts that drive a broker of their own.
#
# start_broker LOG_PREFIX [magnetar standalone flags...]
#   Starts `$M standalone --listen 127.0.0.1:0 FLAGS` in the background
#   (stdout to LOG_PREFIX.out, stderr to LOG_PREFIX.err), waits for its
#   "listening on" line (up to BROKER_WAIT_S seconds, default 20: give
#   recovery more), and sets BROKER_PID, BROKER_ADDR and BROKER_HTTP (the
#   HTTP server's address). A broker that does
#   not come up: its stderr is printed, it is killed, and this returns 1.
# stop_broker [SIGNAL]
#   Signals BROKER_PID (default TERM) and waits for it; no-op without one.
start_broker() {
  local log=$1; shift
  # An earlier broker's "listening on" must not be read for this one's.
  rm -f "$log.out"
  "$M" standalone --listen 127.0.0.1:0 --http-listen 127.0.0.1:0 "$@" >"$log.out" 2>"$log.err" &
  BROKER_PID=$!
  local i
  for i in $(seq $(( ${BROKER_WAIT_S:-20} * 10 ))); do
    grep -q "listening on" "$log.out" 2>/dev/null && break
    kill -0 "$BROKER_PID" 2>/dev/null || break
    sleep 0.1
  done
  BROKER_ADDR=$(sed -n 's/.*listening on //p' "$log.out")
  BROKER_HTTP=$(sed -n 's/.*standalone http on //p' "$log.out")
  if [ -z "$BROKER_ADDR" ]; then
    echo "broker did not start:" >&2; cat "$log.err" >&2
    stop_broker KILL
    return 1
  fi
}
stop_broker() {
  [ -n "${BROKER_PID:-}" ] || return 0
  kill -"${1:-TERM}" "$BROKER_PID" 2>/dev/null || true
  wait "$BROKER_PID" 2>/dev/null || true
  BROKER_PID=
}
