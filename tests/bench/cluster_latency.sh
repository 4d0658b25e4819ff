#!/bin/bash
# cluster_latency.sh — the time-to-durable cost of --cluster: N mounts over one
# backend directory each write a 16 MiB shard of a step, then (a 0.2 s
# barrier) node 1 writes `latest`; measured: from `latest`'s close to its
# appearance in the backend (polled every 2 ms), and from the step's first
# close to `latest` in the backend. Configurations: 1 and 3 mounts without
# --cluster (the baselines: 3 mounts move 3 shards a step, and `latest` does
# not wait for the other two), --cluster with 1 node, with 3 nodes.
# Run: bash tests/bench/cluster_latency.sh [STEPS] (after make all);
# BACKEND=s3 for a bucket of s3rver on loopback (tests/s3/s3rver.sh; `latest`
# polled with GETs of tests/mount/lib/s3c.py).
# docs/benchmarks.md, "Cross-node ordering".
set -e
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
B=${CKPTFS:-$ROOT/build/ckptfs}
STEPS=${1:-8}
BE_ARGS=()
if [ "${BACKEND:-posix}" = s3 ]; then
  S3DIR=$(mktemp -d /tmp/clbench-s3.XXXX)
  port=$("$ROOT/tests/s3/s3rver.sh" start "$S3DIR" 0 clbench)
  trap '"$ROOT/tests/s3/s3rver.sh" stop "$S3DIR"; rm -rf "$S3DIR"' EXIT
  export S3_ENDPOINT=http://127.0.0.1:$port S3_BUCKET=clbench AWS_ACCESS_KEY_ID=S3RVER AWS_SECRET_ACCESS_KEY=S3RVER \
    AWS_REGION=us-east-1
fi
for conf in plain plain3 cluster1 cluster3; do
  T=$(mktemp -d /tmp/clbench.XXXX); mkdir -p $T/be
  n=1; extra=()
  case $conf in plain3) n=3 ;; cluster1) extra=(--cluster bench) ;; cluster3) n=3; extra=(--cluster bench) ;; esac
  [ "${BACKEND:-posix}" = s3 ] && BE_ARGS=(--backend "s3://clbench/$conf" --s3-endpoint "$S3_ENDPOINT") \
    || BE_ARGS=(--backend $T/be)
  for i in $(seq $n); do
    mkdir -p $T/m$i
    $B mount $T/m$i "${BE_ARGS[@]}" --state-dir $T/st$i --tier-dir /dev/shm/clbench-$$-$i --cache-size 1G \
      "${extra[@]}" ${extra:+--node n$i} >/dev/null
  done
  CONF=$conf ROOT=$ROOT /usr/bin/python3 - $T $n $STEPS <<'PY' > $T/out
import os, sys, time, statistics
T, n, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
if os.environ.get("BACKEND") == "s3":
    sys.path.insert(0, os.environ["ROOT"] + "/tests/mount/lib")
    import s3c
    def read_latest():
        st, body = s3c.request("GET", os.environ["CONF"] + "/latest")
        return body.decode() if st == 200 else ""
else:
    def read_latest():
        try:
            return open(f"{T}/be/latest").read()
        except OSError:
            return ""
data = os.urandom(16 << 20)
lat, total = [], []
for s in range(1, steps + 1):
    t0 = time.time()
    for i in range(1, n + 1):
        d = f"{T}/m{i}/global_step{s}"; os.makedirs(d)
        with open(f"{d}/shard_{i}", "wb") as f: f.write(data)
    time.sleep(0.2)  # the barrier
    with open(f"{T}/m1/latest", "w") as f: f.write(f"global_step{s}")
    t1 = time.time()
    while read_latest() != f"global_step{s}":
        time.sleep(0.002)
    t2 = time.time()
    lat.append(t2 - t1); total.append(t2 - t0 - 0.2)
print(f"latest close -> in backend: median {statistics.median(lat):.3f} s, max {max(lat):.3f} s; "
      f"step (shards + latest, barrier excluded) -> latest in backend: median {statistics.median(total):.3f} s")
PY
  echo "${BACKEND:-posix} $conf ($n node$([ $n = 1 ] || echo s), $STEPS steps): $(cat $T/out)"
  for i in $(seq $n); do $B umount $T/m$i >/dev/null 2>&1 || true; done
  rm -rf /dev/shm/clbench-$$-* $T
done
