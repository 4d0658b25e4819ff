#!/bin/bash
# policy_bytes.sh — bytes sent to the backend by a 9-step torch.save trainer (3 files/step, 48 MiB/step), with and without --persist-every 3.
# Run: bash tests/bench/policy_bytes.sh (after make all). docs/benchmarks.md, "Checkpoint policies".
set -e
B=${CKPTFS:-$(cd "$(dirname "$0")/../.." && pwd)/build/ckptfs}
for mode in off every3; do
  T=$(mktemp -d /tmp/pol.XXXX); mkdir -p $T/mnt $T/be
  extra=(); [ $mode = every3 ] && extra=(--persist-every 3)
  $B mount $T/mnt --backend $T/be --state-dir $T/st --tier-dir /dev/shm/pol-$mode-$$ --cache-size 2G "${extra[@]}" >/dev/null
  t0=$(date +%s.%N)
  /usr/bin/python3 - $T/mnt <<'PY'
import os, sys, torch
m = sys.argv[1]
for step in range(1, 10):
    d = f"{m}/step_{step}"; os.makedirs(d)
    torch.save({"w": torch.randn(8 << 20)}, f"{d}/model.pt")      # 32 MiB
    torch.save({"m": torch.randn(4 << 20)}, f"{d}/optim.pt")      # 16 MiB
    torch.save({"step": step}, f"{d}/trainer_state.pt")
    open(f"{m}/latest", "w").write(f"step_{step}")
PY
  t1=$(date +%s.%N)
  $B drain $T/mnt >/dev/null
  t2=$(date +%s.%N)
  bytes=$($B status $T/mnt --json | /usr/bin/python3 -c 'import json,sys; j=json.load(sys.stdin); print(j["drain"]["bytes_persisted"], j["drain"]["files_persisted"], j["memory_only"]["bytes"])')
  echo "$mode: saves $(awk -v a=$t0 -v b=$t1 'BEGIN{printf "%.2f", b-a}') s, drain after last save $(awk -v a=$t1 -v b=$t2 'BEGIN{printf "%.2f", b-a}') s, persisted bytes/files/memory-only bytes: $bytes, backend du: $(du -sb $T/be | cut -f1)"
  $B umount $T/mnt >/dev/null 2>&1 || true
  rm -rf /dev/shm/pol-$mode-$$ $T
done
