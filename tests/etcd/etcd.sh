#!/bin/bash
# etcd.sh — runs a private etcd (Debian's etcd-server 3.4) on 127.0.0.1 for
# the tests of --cluster-store: one member or three.
#
#   etcd.sh start DIR [MEMBERS]   prints the store's endpoints: HOST:PORT[,HOST:PORT...]
#   etcd.sh stop DIR              stops every member
#   etcd.sh kill DIR I            kill -9 of member I (0-based); its data stays
#   etcd.sh restart DIR I         starts member I again, on its old ports
#
# Ports are picked free at start. Data lives under DIR/mI (tmpfs when DIR
# is); auto-compaction keeps the last 1000 revisions (docs/operations.md says
# what to set in production). Exits 77 (skip) when etcd is not installed.
set -euo pipefail
cmd=${1:-}; dir=${2:-}
[[ -n $cmd && -n $dir ]] || { echo "usage: $0 start|stop|kill|restart DIR [N]" >&2; exit 2; }
command -v etcd >/dev/null || { echo "etcd.sh: etcd not found (apt-get install etcd-server)" >&2; exit 77; }

free_ports() {  # N free TCP ports on 127.0.0.1
  /usr/bin/python3 - "$1" <<'PY'
import socket, sys
socks = []
for _ in range(int(sys.argv[1])):
    s = socket.socket(); s.bind(("127.0.0.1", 0)); socks.append(s)
print(" ".join(str(s.getsockname()[1]) for s in socks))
PY
}

launch() {  # member index
  local i=$1
  read -r cport pport < "$dir/m$i.ports"
  ETCD_UNSUPPORTED_ARCH= etcd --name "m$i" --data-dir "$dir/m$i" \
    --listen-client-urls "http://127.0.0.1:$cport" --advertise-client-urls "http://127.0.0.1:$cport" \
    --listen-peer-urls "http://127.0.0.1:$pport" --initial-advertise-peer-urls "http://127.0.0.1:$pport" \
    --initial-cluster "$(cat "$dir/initial-cluster")" --initial-cluster-token "$(basename "$dir")" \
    --heartbeat-interval 50 --election-timeout 500 \
    --auto-compaction-mode revision --auto-compaction-retention 1000 \
    --log-level warn > "$dir/m$i.log" 2>&1 &
  echo $! > "$dir/m$i.pid"
}

healthy() {  # member index
  local cport; read -r cport _ < "$dir/m$1.ports"
  curl -sf -m 1 "http://127.0.0.1:$cport/health" 2>/dev/null | grep -q '"health":"true"'
}

case $cmd in
start)
  n=${3:-1}
  mkdir -p "$dir"
  read -r -a ports <<< "$(free_ports $((2 * n)))"
  ic=""; eps=""
  for ((i = 0; i < n; i++)); do
    echo "${ports[$((2 * i))]} ${ports[$((2 * i + 1))]}" > "$dir/m$i.ports"
    ic+="${ic:+,}m$i=http://127.0.0.1:${ports[$((2 * i + 1))]}"
    eps+="${eps:+,}127.0.0.1:${ports[$((2 * i))]}"
  done
  echo "$ic" > "$dir/initial-cluster"; echo "$n" > "$dir/members"; echo "$eps" > "$dir/endpoints"
  for ((i = 0; i < n; i++)); do launch "$i"; done
  for _ in $(seq 1 200); do
    ok=1
    for ((i = 0; i < n; i++)); do healthy "$i" || ok=0; done
    if ((ok)); then echo "$eps"; exit 0; fi
    sleep 0.05
  done
  echo "etcd.sh: etcd did not become healthy; logs:" >&2
  tail -n 20 "$dir"/m*.log >&2
  "$0" stop "$dir"
  exit 1
  ;;
stop)
  [[ -f $dir/members ]] || exit 0
  for ((i = 0; i < $(cat "$dir/members"); i++)); do
    [[ -f $dir/m$i.pid ]] || continue
    pid=$(cat "$dir/m$i.pid")
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.05; done
    kill -9 "$pid" 2>/dev/null || true
    rm -f "$dir/m$i.pid"
  done
  ;;
kill)
  i=${3:?member}
  pid=$(cat "$dir/m$i.pid"); kill -9 "$pid" 2>/dev/null || true
  for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.05; done
  rm -f "$dir/m$i.pid"
  ;;
restart)
  i=${3:?member}
  launch "$i"
  for _ in $(seq 1 200); do healthy "$i" && exit 0; sleep 0.05; done
  echo "etcd.sh: member $i did not become healthy" >&2; exit 1
  ;;
*) echo "usage: $0 start|stop|kill|restart DIR [N]" >&2; exit 2 ;;
esac
