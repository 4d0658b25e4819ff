#!/bin/bash
# s3rver.sh — runs a private S3-compatible server (s3rver, with strict SigV4
# checks from s3rver_strict.js) on 127.0.0.1 for the S3 backend tests.
#
#   s3rver.sh start DATA_DIR [PORT [BUCKET[,BUCKET...]]]   prints the port; PORT 0 or none picks a free one
#   s3rver.sh stop DATA_DIR
#
# Credentials: access key S3RVER, secret S3RVER; the bucket (default
# ckptfs-test) is created at start. Everything lives under DATA_DIR:
# data/, s3rver.pid, s3rver.port, s3rver.log. Exits 77 (skip) when node or
# s3rver is not installed (npm install --prefix tests/s3/node s3rver@3).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cmd=${1:-}; dir=${2:-}
[[ -n $cmd && -n $dir ]] || { echo "usage: $0 start|stop DATA_DIR [PORT [BUCKET]]" >&2; exit 2; }

case $cmd in
start)
  port=${3:-0}; bucket=${4:-ckptfs-test}
  command -v node >/dev/null || { echo "s3rver.sh: node not found" >&2; exit 77; }
  [[ -d $here/node/node_modules/s3rver ]] || { echo "s3rver.sh: s3rver not installed (npm install --prefix $here/node s3rver@3)" >&2; exit 77; }
  mkdir -p "$dir/data"
  : > "$dir/s3rver.log"
  # --openssl-legacy-provider: s3rver encrypts continuation tokens with DES,
  # which OpenSSL 3 (node >= 17) only offers in its legacy provider.
  node --openssl-legacy-provider "$here/s3rver_strict.js" "$dir/data" "$port" "$bucket" > "$dir/s3rver.out" 2>> "$dir/s3rver.log" &
  echo $! > "$dir/s3rver.pid"
  for _ in $(seq 1 200); do
    if p=$(sed -n 's/^listening \([0-9]*\)$/\1/p' "$dir/s3rver.out" 2>/dev/null) && [[ -n $p ]]; then
      echo "$p" > "$dir/s3rver.port"
      echo "$p"
      exit 0
    fi
    kill -0 "$(cat "$dir/s3rver.pid")" 2>/dev/null || break
    sleep 0.05
  done
  echo "s3rver.sh: server did not start; log:" >&2
  cat "$dir/s3rver.log" >&2
  exit 1
  ;;
stop)
  [[ -f $dir/s3rver.pid ]] || exit 0
  pid=$(cat "$dir/s3rver.pid")
  kill "$pid" 2>/dev/null || true
  for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.05; done
  kill -9 "$pid" 2>/dev/null || true
  rm -f "$dir/s3rver.pid"
  ;;
*) echo "usage: $0 start|stop DATA_DIR [PORT [BUCKET]]" >&2; exit 2 ;;
esac
