#!/bin/bash
# cluster_latency.sh — the time-to-durable cost of --cluster: N mounts over one
# backend directory each write a 16 MiB shard of a step, then (a 0.2 s
# barrier) node 1 writes `latest`; measured: from `latest`'s close to its
# appearance in the backend (polled every 2 ms), and from the step's first
# close to `latest` in the backend. Configurations: one mount without
# --cluster (the baseline), --cluster with 1 node, with 3 nodes.
# Run: bash tests/bench/cluster_latency.sh [STEPS] (after make all).
# docs/benchmarks.md, "Cross-node ordering".
set -e
B=${CKPTFS:-$(cd "$(dirname "$0")/../.." && pwd)/build/ckptfs}
STEPS=${1:-8}
for conf in plain cluster1 cluster3; do
  T=$(mktemp -d /tmp/clbench.XXXX); mkdir -p $T/be
  n=1; extra=(); case $conf in cluster1) extra=(--cluster bench) ;; cluster3) n=3; extra=(--cluster bench) ;; esac
  for i in $(seq $n); do
    mkdir -p $T/m$i
    $B mount $T/m$i --backend $T/be --state-dir $T/st$i --tier-dir /dev/shm/clbench-$$-$i --cache-size 1G \
      "${extra[@]}" ${extra:+--node n$i} >/dev/null
  done
  /usr/bin/python3 - $T $n $STEPS <<'PY' > $T/out
import os, sys, time, statistics
T, n, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
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
    while True:
        try:
            if open(f"{T}/be/latest").read() == f"global_step{s}": break
        except OSError: pass
        time.sleep(0.002)
    t2 = time.time()
    lat.append(t2 - t1); total.append(t2 - t0 - 0.2)
print(f"latest close -> in backend: median {statistics.median(lat):.3f} s, max {max(lat):.3f} s; "
      f"step (shards + latest, barrier excluded) -> latest in backend: median {statistics.median(total):.3f} s")
PY
  echo "$conf ($n node$([ $n = 1 ] || echo s), $STEPS steps): $(cat $T/out)"
  for i in $(seq $n); do $B umount $T/m$i >/dev/null 2>&1 || true; done
  rm -rf /dev/shm/clbench-$$-* $T
done
