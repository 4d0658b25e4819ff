#!/usr/bin/env bash
# statfs/df: size is the --cache-size budget for each accepted size
# spelling (512M, 1.5GiB, plain bytes, 25% of RAM); used grows by what is
# written and shrinks when it is deleted; the name limit is 255.
set -euo pipefail
source "$(dirname "$0")/../lib/common.sh"

check_size() {  # SPEC WANT_BYTES TOLERANCE_BYTES
  mount_fs --cache-size "$1"
  local got
  got=$(df_size_bytes)
  [ $((got - $2)) -le "$3" ] && [ $(($2 - got)) -le "$3" ] \
    || fail "--cache-size $1: df size $got, want $2"
  umount_fs
}
check_size 512M $((512 << 20)) 0
check_size 1.5GiB $((3 << 29)) 0
check_size 300000000 300000000 4096
mem=$(($(awk '/^MemTotal:/ { print $2 }' /proc/meminfo) * 1024))
check_size 25% $((mem / 4)) $((mem / 100))

mount_fs --cache-size 1G
expect_eq $((1 << 30)) "$(df_size_bytes)" "df size"
expect_eq 255 "$(stat -f -c %l "$MNT")" "name limit (statfs f_namelen)"
used0=$(used_bytes)
head -c 100M /dev/zero | tr '\0' 'a' > "$MNT/f"
used1=$(used_bytes)
[ $((used1 - used0)) -ge $((100 << 20)) ] && [ $((used1 - used0)) -le $((110 << 20)) ] \
  || fail "df used grew by $((used1 - used0)) after a 100 MiB write"
avail=$(df -B1 --output=avail "$MNT" | tail -n 1 | tr -d ' ')
[ $((avail + used1)) -le $((1 << 30)) ] || fail "used $used1 + avail $avail exceed the budget"
rm "$MNT/f"
sleep 1
used2=$(used_bytes)
[ $((used2 - used0)) -lt $((4 << 20)) ] || fail "df used still $used2 (was $used0) after deleting the file"
umount_fs
check_log
