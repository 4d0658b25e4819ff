#!/usr/bin/env bash
# stat with nanosecond timestamps (touch -d, stat -c %y, os.utime ns),
# utimensat with UTIME_NOW / UTIME_OMIT (touch -a, touch -m), mtime/ctime
# moving on write and chmod, chmod (incl. setuid/sticky bits), chown and
# chgrp as root; all of it survives dropping caches and a remount.
set -euo pipefail
source "$(dirname "$0")/../lib/common.sh"

mount_fs
echo data > "$MNT/f"
mkdir "$MNT/d"

touch -d '2021-03-04 05:06:07.123456789' "$MNT/f"
expect_eq '2021-03-04 05:06:07.123456789 +0000' "$(stat -c %y "$MNT/f")" "mtime with ns"
expect_eq '2021-03-04 05:06:07.123456789 +0000' "$(stat -c %x "$MNT/f")" "atime with ns"
touch -d '1999-12-31 23:59:59.000000001' "$MNT/d"
expect_eq '1999-12-31 23:59:59.000000001 +0000' "$(stat -c %y "$MNT/d")" "dir mtime with ns"

# UTIME_OMIT for mtime, explicit atime (touch -a -d).
touch -a -d '2022-01-01 00:00:00.5' "$MNT/f"
expect_eq '2022-01-01 00:00:00.500000000 +0000' "$(stat -c %x "$MNT/f")" "atime after touch -a"
expect_eq '2021-03-04 05:06:07.123456789 +0000' "$(stat -c %y "$MNT/f")" "mtime kept by touch -a (UTIME_OMIT)"
touch -m -d '2023-06-07 08:09:10.987654321' "$MNT/f"
expect_eq '2023-06-07 08:09:10.987654321 +0000' "$(stat -c %y "$MNT/f")" "mtime after touch -m"
expect_eq '2022-01-01 00:00:00.500000000 +0000' "$(stat -c %x "$MNT/f")" "atime kept by touch -m (UTIME_OMIT)"

# UTIME_NOW for one, UTIME_OMIT for the other, through utimensat directly.
now=$(date +%s)
expect_ok utime "$MNT/f" now omit
[ $(($(stat -c %X "$MNT/f") - now)) -ge -1 ] && [ $(($(stat -c %X "$MNT/f") - now)) -le 5 ] \
  || fail "atime after UTIME_NOW is $(stat -c %x "$MNT/f"), now is $now"
expect_eq '2023-06-07 08:09:10.987654321 +0000' "$(stat -c %y "$MNT/f")" "mtime kept by UTIME_OMIT"
expect_ok utime "$MNT/f" omit now
[ $(($(stat -c %Y "$MNT/f") - now)) -ge -1 ] && [ $(($(stat -c %Y "$MNT/f") - now)) -le 5 ] \
  || fail "mtime after UTIME_NOW is $(stat -c %y "$MNT/f")"

# Exact ns through os.utime, including a time before 1970.
$PY - "$MNT/f" <<'PY'
import os, sys
p = sys.argv[1]
for a, m in [(1_600_000_000_123_456_789, 1_700_000_000_987_654_321), (-1_000_000_001, 0), (5, 2**33 * 10**9 + 7)]:
    os.utime(p, ns=(a, m))
    st = os.stat(p)
    assert (st.st_atime_ns, st.st_mtime_ns) == (a, m), ((a, m), (st.st_atime_ns, st.st_mtime_ns))
os.utime(p, ns=(1_600_000_000_123_456_789, 1_700_000_000_987_654_321))
PY

# A write moves mtime and ctime to now; chmod moves ctime.
echo more >> "$MNT/d/g"
touch -d '2001-01-01' "$MNT/d/g"
sleep 0.05
now=$(date +%s)
echo again >> "$MNT/d/g"
[ "$(stat -c %Y "$MNT/d/g")" -ge "$now" ] || fail "mtime did not move on write: $(stat -c %y "$MNT/d/g")"
[ "$(stat -c %Z "$MNT/d/g")" -ge "$now" ] || fail "ctime did not move on write: $(stat -c %z "$MNT/d/g")"
# Creating an entry moves the directory's mtime.
touch -d '2001-01-01' "$MNT/d"
touch "$MNT/d/h"
[ "$(stat -c %Y "$MNT/d")" -ge "$now" ] || fail "dir mtime did not move on create: $(stat -c %y "$MNT/d")"

chmod 0640 "$MNT/f"
expect_eq 640 "$(stat -c %a "$MNT/f")" "chmod 0640"
[ "$(stat -c %Z "$MNT/f")" -ge "$now" ] || fail "ctime did not move on chmod"
chmod 4755 "$MNT/d/g"; expect_eq 4755 "$(stat -c %a "$MNT/d/g")" "chmod 4755"
chmod 1777 "$MNT/d"; expect_eq 1777 "$(stat -c %a "$MNT/d")" "chmod 1777 on a dir"
chmod 0 "$MNT/d/h"; expect_eq 0 "$(stat -c %a "$MNT/d/h")" "chmod 0"
chmod u+rw "$MNT/d/h"

chown 1234:5678 "$MNT/d/h"
expect_eq 1234:5678 "$(stat -c %u:%g "$MNT/d/h")" "chown"
chgrp 42 "$MNT/d/h"
expect_eq 1234:42 "$(stat -c %u:%g "$MNT/d/h")" "chgrp"
chown -h 77:88 "$MNT/d"
expect_eq 77:88 "$(stat -c %u:%g "$MNT/d")" "chown of a dir"
# chown by root clears setuid on a file.
chown 0:0 "$MNT/d/g"
case $(stat -c %a "$MNT/d/g") in 755) ;; *) fail "setuid not cleared by chown: $(stat -c %a "$MNT/d/g")" ;; esac

stat -c '%n %a %u %g %s %x %y' "$MNT/f" "$MNT/d" "$MNT/d/g" "$MNT/d/h" > "$T/attrs"
drop_caches
stat -c '%n %a %u %g %s %x %y' "$MNT/f" "$MNT/d" "$MNT/d/g" "$MNT/d/h" | diff "$T/attrs" - || fail "attributes differ after dropping caches"
remount_fs
stat -c '%n %a %u %g %s %x %y' "$MNT/f" "$MNT/d" "$MNT/d/g" "$MNT/d/h" | diff "$T/attrs" - || fail "attributes differ after remount"
check_backend
umount_fs
check_log
