#!/usr/bin/env bash
# Permission checks (default_permissions, allow_other as root) for another
# uid (nobody, 65534): EACCES on a 0600 root file and into a 0700 dir, read
# through the group bits, EPERM for chmod/chown of someone else's file and
# for deleting it from a sticky dir; files and dirs created by that uid are
# owned by its uid/gid, with the umask applied.
set -euo pipefail
source "$(dirname "$0")/../lib/common.sh"
require_root
command -v setpriv >/dev/null || skip "no setpriv"
NB=65534:65534

mount_fs
expect_eq 0:0 "$(stat -c %u:%g "$MNT")" "root dir owner"
echo secret > "$MNT/secret"
chmod 0600 "$MNT/secret"
expect_errno EACCES --as $NB open "$MNT/secret" r
expect_errno EACCES --as $NB open "$MNT/secret" w
expect_errno EACCES --as $NB truncate "$MNT/secret" 0
expect_ok --as $NB stat "$MNT/secret"
as_nobody cat "$MNT/secret" > /dev/null 2>&1 && fail "nobody could cat a 0600 root file"
expect_eq secret "$(cat "$MNT/secret")" "root still reads it"

mkdir "$MNT/closed"; echo x > "$MNT/closed/inner"; chmod 0700 "$MNT/closed"
expect_errno EACCES --as $NB listdir "$MNT/closed"
expect_errno EACCES --as $NB stat "$MNT/closed/inner"
expect_errno EACCES --as $NB open "$MNT/newfile" w,creat   # root dir is 0755 root
expect_errno EACCES --as $NB mkdir "$MNT/newdir"

echo shared > "$MNT/group"
chown 0:65534 "$MNT/group"; chmod 0640 "$MNT/group"
expect_ok --as $NB read "$MNT/group"
expect_errno EACCES --as $NB open "$MNT/group" w
chmod 0604 "$MNT/secret"
expect_ok --as $NB read "$MNT/secret"

expect_errno EPERM --as $NB chmod "$MNT/secret" 777
expect_errno EPERM --as $NB chown "$MNT/secret" 65534 65534
expect_errno EPERM --as $NB utime "$MNT/secret" 0 0

# A shared sticky dir: nobody creates there, owns what it creates.
mkdir "$MNT/pub"; chmod 1777 "$MNT/pub"
echo root-owned > "$MNT/pub/rootfile"
as_nobody sh -c "umask 022; echo mine > '$MNT/pub/nbfile'; mkdir '$MNT/pub/nbdir'; ln -s nbfile '$MNT/pub/nblink'"
expect_eq 65534:65534 "$(stat -c %u:%g "$MNT/pub/nbfile")" "owner of a file made by nobody"
expect_eq 65534:65534 "$(stat -c %u:%g "$MNT/pub/nbdir")" "owner of a dir made by nobody"
expect_eq 65534:65534 "$(stat -c %u:%g "$MNT/pub/nblink")" "owner of a symlink made by nobody"
expect_eq 644 "$(stat -c %a "$MNT/pub/nbfile")" "mode of nobody's file (umask 022)"
expect_eq 755 "$(stat -c %a "$MNT/pub/nbdir")" "mode of nobody's dir (umask 022)"
expect_eq mine "$(cat "$MNT/pub/nbfile")" "nobody's file read by root"
expect_ok --as $NB chmod "$MNT/pub/nbfile" 600
expect_eq 600 "$(stat -c %a "$MNT/pub/nbfile")" "nobody chmods its own file"
expect_ok --as $NB utime "$MNT/pub/nbfile" 1000000000 2000000000
expect_errno EPERM --as $NB unlink "$MNT/pub/rootfile"
expect_errno EPERM --as $NB rename "$MNT/pub/rootfile" "$MNT/pub/stolen"
expect_ok --as $NB rename "$MNT/pub/nbfile" "$MNT/pub/nbfile2"
expect_ok --as $NB unlink "$MNT/pub/nbfile2"
# A group-writable dir of nobody's group: nobody may write a root file there
# only if the file's own bits allow.
echo ro > "$MNT/pub/rootro"; chmod 0644 "$MNT/pub/rootro"
expect_errno EACCES --as $NB open "$MNT/pub/rootro" w

stat -c '%n %u %g %a' "$MNT/pub"/* > "$T/owners"
remount_fs
stat -c '%n %u %g %a' "$MNT/pub"/* | diff "$T/owners" - || fail "owners differ after remount"
expect_errno EACCES --as $NB stat "$MNT/closed/inner"
check_backend
umount_fs
check_log
