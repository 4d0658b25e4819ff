#!/usr/bin/env bash
# A record from the future (--cluster): one record whose heartbeat lies ten
# years ahead, with a file pending since long ago, written into
# .ckptfs-cluster/NAME/ by anyone who can write there (a bucket writer on
# S3). It never aged into "dead" and came first in every comparison, so it
# held every member's drain for ever. It is refused: the drain goes on, the
# log says so once, status lists it (JSON cluster.refused, text "refused"),
# and the node names it in its own record (a real member with a clock that
# far ahead learns it is refused).
source "$(dirname "$0")/../lib/common.sh"

mount_fs --cluster job --node a --member-timeout 5
REC=$BACKEND/.ckptfs-cluster/job
[ -d "$REC" ] || fail "no records' area after the mount"
$PY - "$REC/zz" <<'EOF'
import json, sys, time
now_us = int(time.time() * 1e6)
ahead = now_us + 10 * 365 * 24 * 3600 * 10**6
rec = {"version": 2, "cluster": "job", "node": "zz", "state": "live",
       "heartbeat_us": ahead, "watermark_us": 0, "oldest_gate_us": 1000,
       "heartbeat_ms": ahead // 1000, "watermark_ms": 0, "oldest_gate_ms": 1,
       "unpersisted": 1, "paths": ["forged"]}
open(sys.argv[1], "w").write(json.dumps(rec))
EOF
mkdir "$MNT/global_step1"
echo x > "$MNT/global_step1/shard"
echo global_step1 > "$MNT/latest"
"$CKPTFS" drain "$MNT" --timeout 20 > /dev/null || fail "a record from the future holds the drain"
expect_eq global_step1 "$(cat "$BACKEND/latest")" "latest"
"$CKPTFS" status "$MNT" --json | $PY -c '
import json, sys
c = json.load(sys.stdin)["cluster"]
assert [m["node"] for m in c["members"]] == ["a"], c["members"]
assert c["refused_count"] == 1 and c["refused"][0]["node"] == "zz", c
assert "future" in c["refused"][0]["reason"], c
assert c["publish_blocked_reason"] == "", c
' || fail "status does not report the refused record"
"$CKPTFS" status "$MNT" | grep -q "^  refused  record zz: " || fail "status text: no refused line"
$PY -c 'import json,sys; r=json.load(open(sys.argv[1])); assert [x["node"] for x in r["refused"]] == ["zz"], r' "$REC/a" \
  || fail "a's record does not name the refused record"
umount_fs
n=$(grep -c "the record of zz is refused" "$STATE/ckptfs.log" || true)
expect_eq 1 "$n" "log lines for the refused record"
check_log --allow-errors "the record of zz is refused"
