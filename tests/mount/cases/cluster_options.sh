#!/usr/bin/env bash
# --cluster and its options: bad values refused in one line (exit 2),
# options that need --cluster refused without it, --cluster refused with a
# checkpoint policy; the -o forms; the default node id (hostname and a hash
# of the state dir, so two mounts on one machine differ); no cluster thread
# or record without --cluster.
source "$(dirname "$0")/../lib/common.sh"

refused2() {  # PATTERN ARGS...: refused in one line with exit status 2
  local pat=$1 rc=0
  shift
  "$CKPTFS" mount "$MNT" --backend "$BACKEND" --state-dir "$STATE" --tier-dir "$TIER" "$@" \
    > "$T/out" 2> "$T/err" < /dev/null || rc=$?
  [ "$rc" = 2 ] || fail "mount $*: exit $rc, want 2 ($(cat "$T/err"))"
  [ "$(wc -l < "$T/err")" = 1 ] || fail "mount $*: want one line: $(cat "$T/err")"
  grep -Eq -- "$pat" "$T/err" || fail "mount $*: stderr does not name /$pat/: $(cat "$T/err")"
  ! is_mounted || fail "mount $*: left $MNT mounted"
  note "ok: $(cat "$T/err")"
}
for bad in "" ".hidden" "-x" "a/b" "a b" "$(printf 'x%.0s' {1..65})" ".." "é"; do
  refused2 "--cluster: want 1 to 64" --cluster "$bad"
  refused2 "--node: want 1 to 64" --cluster job --node "$bad"
done
refused2 "--member-timeout: want a whole number" --cluster job --member-timeout 0
refused2 "--member-timeout: want a whole number" --cluster job --member-timeout 1.5
refused2 "--max-clock-skew: want milliseconds" --cluster job --max-clock-skew 60001
refused2 "--max-clock-skew: want milliseconds" --cluster job --max-clock-skew -1
refused2 "-o max_clock_skew=x: want milliseconds" --cluster job -o max_clock_skew=x
refused2 "need --cluster NAME" --node a
refused2 "need --cluster NAME" --member-timeout 5
refused2 "need --cluster NAME" -o max_clock_skew=5
refused2 "cannot go with --persist-every" --cluster job --persist-every 2
refused2 "cannot go with --persist-every" -o cluster=job,persist_interval=60

# Without --cluster: no records, no cluster in the status.
mount_fs
echo x > "$MNT/f"
"$CKPTFS" drain "$MNT" --timeout 30 > /dev/null
[ ! -e "$BACKEND/.ckptfs-cluster" ] || fail "records written without --cluster"
"$CKPTFS" status "$MNT" --json | $PY -c 'import json,sys; assert "cluster" not in json.load(sys.stdin)' \
  || fail "status has a cluster without --cluster"
umount_fs

# -o forms, and the default node id.
mount_fs -o cluster=job2,member_timeout=7,max_clock_skew=0
echo y > "$MNT/g"
"$CKPTFS" drain "$MNT" --timeout 30 > /dev/null || fail "a lone member drains"
node=$("$CKPTFS" status "$MNT" --json | $PY -c 'import json,sys; c=json.load(sys.stdin)["cluster"]; print(c["name"], c["node"])')
want="job2 $(hostname | cut -c1-55)-"
case "$node" in "$want"????????) ;; *) fail "default node id: got '$node', want '$want<8 hex>'" ;; esac
[ -f "$BACKEND/.ckptfs-cluster/job2/${node#job2 }" ] || fail "no record for ${node#job2 }"
grep -q "member timeout 7 s, max clock skew 0 ms" "$STATE/ckptfs.log" || fail "-o member_timeout/max_clock_skew not taken"
"$CKPTFS" status "$MNT" | grep -q "^cluster    job2, node ${node#job2 }" || fail "status text: no cluster line"
umount_fs
$PY -c 'import json,sys; r=json.load(open(sys.argv[1])); assert r["state"] == "left", r' \
  "$BACKEND/.ckptfs-cluster/job2/${node#job2 }" || fail "clean unmount did not leave"
check_log
