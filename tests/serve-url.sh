# Sourced by tests/serve.sh, tests/serve-hostile.sh and bench/serve.sh:
# serve_url OUT PID TRIES — waits (0.1 s a try) for the URL a psm-run serve
# whose standard output goes to OUT prints on starting, and sets $url to
# it; non-zero when it did not come or the process PID ended first.
serve_url () {
  url=""
  for _ in $(seq 1 "$3"); do
    url=$(sed -n 's|^psm-run serve: \(http://[^ ]*/\) .*|\1|p' "$1")
    [ -n "$url" ] && return 0
    kill -0 "$2" 2> /dev/null || return 1
    sleep 0.1
  done
  return 1
}
