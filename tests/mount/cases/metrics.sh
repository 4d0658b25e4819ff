#!/usr/bin/env bash
# Prometheus metrics (issue #13): `--metrics 127.0.0.1:PORT` serves
# /metrics in the text exposition format (HELP and TYPE for every family),
# scraped with curl before and after a save and its drain: dirty bytes go
# up, then persisted files and the drain counters; the newest persisted
# checkpoint's times appear. `--metrics-textfile` writes the same text for
# node_exporter. Bad addresses are refused in one line; other paths are 404.
set -euo pipefail
source "$(dirname "$0")/../lib/common.sh"
command -v curl > /dev/null || skip "no curl"

PORT=$($PY -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
scrape() { curl -sf "http://127.0.0.1:$PORT/metrics"; }
value() {  # value SERIES FILE: the sample's value (the series as printed, labels included)
  awk -v s="$1" '$1 == s {print $2}' "$2"
}

for bad in "nohost:9105" "127.0.0.1:0" "127.0.0.1:99999" "9105"; do
  expect_mount_refused "--metrics: " "$MNT" --backend "$BACKEND" --state-dir "$STATE" --tier-dir "$TIER" --metrics "$bad"
done

touch "$T/pause"
CKPTFS_DRAIN_PAUSE_FILE=$T/pause mount_fs --cache-size 256M --metrics "127.0.0.1:$PORT" --metrics-textfile "$T/ckptfs.prom"
scrape > "$T/m0" || fail "no /metrics on 127.0.0.1:$PORT"
# The format: every sample's family has HELP and TYPE lines before it.
$PY - "$T/m0" <<'PY' || fail "exposition format"
import re, sys
helped, typed = set(), set()
for line in open(sys.argv[1]):
    line = line.rstrip("\n")
    if line.startswith("# HELP "):
        helped.add(line.split()[2])
    elif line.startswith("# TYPE "):
        name, kind = line.split()[2:4]
        assert kind in ("gauge", "counter"), line
        typed.add(name)
    else:
        m = re.match(r'^([a-z_]+)(\{[a-z_]+="[^"]*"\})? (-?[0-9.e+-]+)$', line)
        assert m, "not a sample: " + line
        assert m.group(1) in helped and m.group(1) in typed, "no HELP/TYPE before " + line
PY
expect_eq 0 "$(value 'ckptfs_files{state="dirty"}' "$T/m0")" "dirty files before the save"
expect_eq "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$PORT/other")" 404 "another path"

mkdir "$MNT/global_step1"
for r in 0 1; do head -c 3M /dev/urandom > "$MNT/global_step1/rank$r.pt"; done
scrape > "$T/m1"
expect_eq 2 "$(value 'ckptfs_files{state="dirty"}' "$T/m1")" "dirty files after the save"
expect_eq $((6 << 20)) "$(value 'ckptfs_bytes{state="dirty"}' "$T/m1")" "dirty bytes after the save"
expect_eq 1 "$(value ckptfs_checkpoints "$T/m1")" "checkpoints"
rm "$T/pause"
"$CKPTFS" drain "$MNT" --timeout 60 > /dev/null 2>&1 || fail "drain"
scrape > "$T/m2"
expect_eq 0 "$(value 'ckptfs_files{state="dirty"}' "$T/m2")" "dirty files after the drain"
expect_eq 2 "$(value 'ckptfs_files{state="persisted"}' "$T/m2")" "persisted files after the drain"
[ "$(value ckptfs_drain_persisted_bytes_total "$T/m2")" -ge $((6 << 20)) ] || fail "drain bytes: $(grep drain_persisted "$T/m2")"
expect_eq $((6 << 20)) "$(value ckptfs_last_checkpoint_bytes "$T/m2")" "last checkpoint bytes"
grep -q "^ckptfs_last_checkpoint_time_to_durable_seconds [0-9]" "$T/m2" || fail "no time to durable: $(grep last_ "$T/m2")"
expect_eq 1 "$(value ckptfs_backend_up "$T/m2")" "backend up"
expect_eq 0 "$(value ckptfs_drain_held "$T/m2")" "drain not held"

# The textfile: written within 5 s, readable by node_exporter (0644).
for _ in $(seq 70); do grep -q '^ckptfs_files{state="persisted"} 2$' "$T/ckptfs.prom" 2> /dev/null && break; sleep 0.1; done
grep -q '^ckptfs_files{state="persisted"} 2$' "$T/ckptfs.prom" || fail "textfile: $(cat "$T/ckptfs.prom" 2>&1 | head -20)"
expect_eq 644 "$(stat -c %a "$T/ckptfs.prom")" "textfile mode"
umount_fs
! curl -sf "http://127.0.0.1:$PORT/metrics" > /dev/null 2>&1 || fail "/metrics still answers after the umount"
check_log
