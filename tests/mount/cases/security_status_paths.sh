#!/usr/bin/env bash
# The status lists name only what the asker could learn itself. On a root
# mount (allow_other), uid 65534 reads the root's status xattrs: the paths
# of checkpoints and of lost files inside another user's 0700 directory
# are left out of `ckptfs ls`, `ckptfs lost` and `ckptfs status --json`
# (they named them, where `ls` of that directory fails with EACCES), while
# the counts stay whole and root still sees every path. A public
# checkpoint and a public lost file stay listed for everyone.
set -euo pipefail
source "$(dirname "$0")/../lib/common.sh"
require_root
command -v setpriv > /dev/null || skip "no setpriv"

CKPTFS_DRAIN_DELAY_MS=600000 mount_fs
mkdir -m 0700 "$MNT/private"
mkdir "$MNT/private/global_step7" "$MNT/global_step8"
echo s > "$MNT/private/global_step7/shard"
echo p > "$MNT/global_step8/shard"
echo x > "$MNT/private/secret-name-lost"
echo y > "$MNT/public-lost"
sync
# A node reboot before the drain: the four files are lost.
for p in $(_our_daemons); do kill -9 "$p"; done
for _ in $(seq 600); do [ -z "$(_our_daemons)" ] && break; sleep 0.1; done
[ -z "$(_our_daemons)" ] || fail "the killed daemon did not exit"
"$CKPTFS" umount "$MNT" --no-drain > /dev/null 2>&1 || true
rm_tier "$TIER"
mount_fs
mkdir "$MNT/private/global_step9"  # a checkpoint in the private directory now
echo t > "$MNT/private/global_step9/shard"
echo q > "$MNT/global_step8/shard2"
as_nobody ls "$MNT/private" > /dev/null 2>&1 && fail "nobody could list the 0700 directory"

# root sees every path.
"$CKPTFS" ls "$MNT" > "$T/ls.root" || fail "ckptfs ls as root"
grep -q "private/global_step9" "$T/ls.root" || fail "root's ls lacks private/global_step9: $(cat "$T/ls.root")"
"$CKPTFS" lost "$MNT" > "$T/lost.root" || fail "ckptfs lost as root"
grep -q "secret-name-lost" "$T/lost.root" || fail "root's lost list lacks the private file: $(cat "$T/lost.root")"

# uid 65534 sees the public ones only, and the counts.
as_nobody "$CKPTFS" ls "$MNT" > "$T/ls.nobody" 2>&1 || fail "ckptfs ls as nobody: $(cat "$T/ls.nobody")"
grep -q "global_step8" "$T/ls.nobody" || fail "nobody's ls lacks the public checkpoint: $(cat "$T/ls.nobody")"
! grep -q "private" "$T/ls.nobody" || fail "nobody's ls names a checkpoint in a 0700 directory: $(cat "$T/ls.nobody")"
as_nobody "$CKPTFS" lost "$MNT" > "$T/lost.nobody" 2>&1 || fail "ckptfs lost as nobody: $(cat "$T/lost.nobody")"
grep -q "public-lost" "$T/lost.nobody" || fail "nobody's lost list lacks the public file: $(cat "$T/lost.nobody")"
! grep -q "private\|secret" "$T/lost.nobody" || fail "nobody's lost list names a file of a 0700 directory: $(cat "$T/lost.nobody")"
as_nobody "$CKPTFS" status "$MNT" --json > "$T/status.nobody" || fail "ckptfs status --json as nobody"
! grep -q "secret-name-lost\|private/" "$T/status.nobody" || fail "nobody's status names a private path"
$PY -c 'import json, sys
s = json.load(open(sys.argv[1]))
assert s["lost_count"] == 4, s["lost_count"]
assert any("public-lost" in p for p in s["lost"]), s["lost"]' "$T/status.nobody" || fail "nobody's status: $(head -c 600 "$T/status.nobody")"
as_nobody "$CKPTFS" status "$MNT" > /dev/null || fail "ckptfs status as nobody"
"$CKPTFS" lost "$MNT" --clear > /dev/null || fail "ckptfs lost --clear"
umount_fs
check_log --allow-errors "lost" --allow-warnings "lost|not persisted"
echo "PASS: $CASE"
