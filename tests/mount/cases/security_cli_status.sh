#!/usr/bin/env bash
# The status channel survives hostile names and long lists. A mount point
# whose name has a ' and a byte that is not UTF-8, and files whose names are
# not UTF-8: `ckptfs status --json` is JSON that python parses, and `ckptfs
# status`, `drain` and `umount` work. 701 files lost at a node reboot (long
# names of control bytes: the full list is far past 64 KiB): the status
# lists at most the first 100 and lost_count 701, `ckptfs lost` prints all
# 701 (exact bytes, escaped), `lost --json` too, uid 65534 cannot clear it,
# `lost --clear` empties it. Each name holds 120 bytes 0x01, 6 bytes each
# once escaped as \u0001: a list capped by raw bytes (100 names, 12 KiB)
# came to ~72 KiB of JSON and the status xattr failed with ERANGE; capped by
# escaped bytes, the status stays under 60 KiB and parses.
# `ckptfs umount` of a mount whose status cannot be read (a dead daemon)
# fails loudly and unmounts nothing; --no-drain detaches it. `ckptfs umount`
# of a tmpfs is refused.
set -euo pipefail
source "$(dirname "$0")/../lib/common.sh"
require_root

MNT=$T/$'mnt\xff\'x'
mkdir "$MNT"
chmod 755 "$MNT"

json_get() {  # EXPR: evaluates EXPR on the status document `s`
  "$CKPTFS" status "$MNT" --json > "$T/status.json" || fail "ckptfs status --json failed"
  $PY -c 'import json,sys; s=json.load(open(sys.argv[1],"rb")); print(eval(sys.argv[2]))' "$T/status.json" "$1" \
    || fail "status --json is not JSON python can parse: $(head -c 300 "$T/status.json")"
}

# 1. Hostile names, a healthy mount.
mount_fs
echo a > "$MNT/"$'bad\xfe\xffname'
echo b > "$MNT/"$'ctl\x1b[31mred\x07'
expect_eq 2 "$(json_get 's["namespace"]["files"]')" "files in the namespace"
for k in lost lost_count failed read_only max_file_size; do
  expect_eq True "$(json_get "'$k' in s")" "status has $k"
done
expect_eq True "$(json_get '"orphans" in s["tier"]')" "status has tier.orphans"
expect_eq 0 "$(json_get 's["failed"]["count"]')" "failed count"
"$CKPTFS" status "$MNT" > "$T/status.txt" || fail "ckptfs status failed"
"$CKPTFS" drain "$MNT" --timeout 60 > /dev/null 2>&1 || fail "ckptfs drain failed"
umount_fs

# 2. 701 files lost: written while the drain is held back, daemon killed,
# tier gone (a node reboot).
rm -rf "$BACKEND"/* "$STATE"
rm_tier "$TIER"
mkdir -p "$BACKEND"
CKPTFS_DRAIN_DELAY_MS=600000 mount_fs
long=$(printf '\x01%.0s' $(seq 120))
for i in $(seq 1 700); do echo "$i" > "$MNT/f$i-$long"; done
echo z > "$MNT/"$'lost\xff\nname'
sync
for p in $(_our_daemons); do kill -9 "$p"; done
for _ in $(seq 50); do [ -z "$(_our_daemons)" ] && break; sleep 0.1; done

rc=0; "$CKPTFS" umount "$MNT" > "$T/out" 2> "$T/err" || rc=$?
[ "$rc" != 0 ] || fail "ckptfs umount of a mount whose status cannot be read exited 0"
expect_eq 1 "$(wc -l < "$T/err")" "lines on stderr of the refused umount ($(cat "$T/err"))"
grep -q -- "--no-drain" "$T/err" || fail "the refusal does not name --no-drain: $(cat "$T/err")"
is_mounted || fail "the refused umount unmounted"
note "ok: $(cat "$T/err")"
"$CKPTFS" umount "$MNT" --no-drain > "$T/out" 2>&1 || fail "umount --no-drain of a dead mount: $(cat "$T/out")"
! is_mounted || fail "still mounted after umount --no-drain"

rm_tier "$TIER"
mount_fs
expect_eq 701 "$(json_get 's["lost_count"]')" "lost_count"
n=$(json_get 'len(s["lost"])')
[ "$n" -ge 10 ] && [ "$n" -le 100 ] || fail "$n entries in the status lost list"
size=$(getfattr --absolute-names --only-values -n user.ckptfs.status "$MNT" | wc -c)
note "the status lists $n lost names in $size bytes"
[ "$size" -le $((60 * 1024)) ] || fail "status of $size bytes, over 60 KiB"
"$CKPTFS" status "$MNT" > "$T/status.txt" || fail "ckptfs status failed"
grep -q "701" "$T/status.txt" || fail "status does not show 701 lost: $(cat "$T/status.txt")"
! grep -q $'\x1b' "$T/status.txt" || fail "status printed a raw escape byte"
"$CKPTFS" lost "$MNT" > "$T/lost.txt" || fail "ckptfs lost failed"
expect_eq 701 "$(wc -l < "$T/lost.txt")" "lines of ckptfs lost"
grep -qF 'lost\xff\nname' "$T/lost.txt" || fail "the non-UTF-8 name is not escaped: $(grep lost "$T/lost.txt")"
"$CKPTFS" lost "$MNT" --json > "$T/lost.json" || fail "ckptfs lost --json failed"
expect_eq 701 "$($PY -c 'import json,sys; print(len(json.load(open(sys.argv[1],"rb"))["lost"]))' "$T/lost.json")" \
  "entries of lost --json"
if as_nobody "$CKPTFS" lost --clear "$MNT" > "$T/out" 2>&1; then fail "uid 65534 cleared the lost list"; fi
# Even with write permission on the root (the kernel lets the setxattr
# through), the daemon refuses anyone but root and the mount's owner.
chmod 0777 "$MNT"
if as_nobody setfattr -n user.ckptfs.lost.clear -v 1 "$MNT" 2> "$T/err"; then fail "uid 65534 cleared the lost list"; fi
grep -q "Operation not permitted" "$T/err" || fail "want EPERM from the daemon: $(cat "$T/err")"
chmod 0755 "$MNT"
expect_eq 701 "$(json_get 's["lost_count"]')" "lost_count after a refused clear"
"$CKPTFS" lost --clear "$MNT" > "$T/out" 2>&1 || fail "ckptfs lost --clear: $(cat "$T/out")"
expect_eq 0 "$(json_get 's["lost_count"]')" "lost_count after clear"
"$CKPTFS" lost "$MNT" > "$T/lost.txt" || fail "ckptfs lost failed"
expect_eq 0 "$(wc -l < "$T/lost.txt")" "lines of ckptfs lost after clear"
remount_fs
expect_eq 0 "$(json_get 's["lost_count"]')" "lost_count after clear and remount"
umount_fs

# 3. Not a ckptfs mount.
mkdir "$T/tmpfs"
mount -t tmpfs -o size=1M tmpfs "$T/tmpfs"
at_exit 'umount "$T/tmpfs" 2>/dev/null'
rc=0; "$CKPTFS" umount "$T/tmpfs" > "$T/out" 2> "$T/err" || rc=$?
[ "$rc" != 0 ] || fail "ckptfs umount of a tmpfs exited 0"
expect_eq 1 "$(wc -l < "$T/err")" "lines on stderr ($(cat "$T/err"))"
is_mounted "$T/tmpfs" || fail "ckptfs umount unmounted a tmpfs"
rc=0; "$CKPTFS" lost --clear "$T/tmpfs" > "$T/out" 2> "$T/err" || rc=$?
[ "$rc" != 0 ] || fail "ckptfs lost --clear of a tmpfs exited 0"

check_log --allow-errors "lost|not persisted"
