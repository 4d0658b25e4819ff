#!/usr/bin/env bash
# A truncate(2) of an evicted (remote) file to a size other than 0 fetches the
# file first: on a fetcher thread, never on a FUSE worker, as an open does
# (remote_open_waits.sh). With a slow backend (0.4 s per fetch), 64
# truncates of remote files at once (more than the 16 workers) leave stat,
# ls and `ckptfs status` answering at once; every file then has the size
# asked and its first bytes.
# serial: asserts that stat/ls/status answer within 1.5 s while fetches wait (timing)
set -euo pipefail
source "$(dirname "$0")/../lib/common.sh"

mount_fs --cache-size 256M
head -c 256K /dev/urandom > "$T/ref"
for i in $(seq 1 64); do cp "$T/ref" "$MNT/f$i"; done
umount_fs
rm_tier "$TIER"  # a node reboot: the files come back remote
CKPTFS_FETCH_DELAY_MS=400 mount_fs --cache-size 256M  # 64 fetches on 4 fetchers: 6.4 s
[ "$(state_of "$MNT/f1")" = remote ] || fail "f1 should be remote, is $(state_of "$MNT/f1")"
# truncate(2) by path: a SETATTR with no open before it (truncate(1) opens
# the file first, and the open fetches it). One process, a thread a file:
# 64 processes took seconds to start here.
python3 - "$MNT" "$T" <<'PY' &
import os, sys, threading
mnt, t = sys.argv[1], sys.argv[2]
def one(i):
    try:
        os.truncate(f"{mnt}/f{i}", 102400)
        open(f"{t}/t{i}.done", "w").write("ok")
    except OSError as e:
        open(f"{t}/t{i}.done", "w").write(str(e))
threads = [threading.Thread(target=one, args=(i,)) for i in range(1, 65)]
for th in threads: th.start()
for th in threads: th.join()
PY
pid=$!
sleep 1
# Counted before the checks, which may take seconds on a busy machine.
waiting=0
for i in $(seq 1 64); do [ -e "$T/t$i.done" ] || waiting=$((waiting + 1)); done
[ "$waiting" -gt 16 ] || fail "only $waiting truncates still waited after 1 s: the check proves nothing"
note "$waiting truncates waiting for their fetch"
expect_answers 1.5 "truncates wait for fetches"
wait "$pid" || fail "the truncating process failed"
for i in $(seq 1 64); do expect_eq ok "$(cat "$T/t$i.done")" "truncate of f$i"; done
head -c 100K "$T/ref" > "$T/ref100"
for i in 1 32 64; do
  expect_eq 102400 "$(stat -c %s "$MNT/f$i")" "size of f$i"
  same_bytes "$T/ref100" "$MNT/f$i"
done
umount_fs
check_log
