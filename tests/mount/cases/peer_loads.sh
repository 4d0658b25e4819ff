#!/usr/bin/env bash
# Loads from peers (issue #30, fs/cluster/peer_loads.h): four mounts a, b,
# c, d of one job over one backend and a 1-member etcd, each with a replica
# link and the same --cluster-secret (no --replicas: loads need only the
# link).
#  1. A file saved and persisted on a is opened on b, c and d at once:
#     every reader gets its bytes, and the backend is read at most once for
#     the three (the file's home serves the others: from its RAM, or after
#     its own one fetch); without loads from peers it was read three times.
#     With --peer-fanout 1 the home serves one of them and sends the next to
#     one that has it or is loading it (the tree): two members or more serve.
#  2. A member e with another secret reads the same file: the home refuses
#     it, e reads the backend instead and gets the right bytes.
#  3. A second file whose home is a reader: after the home's daemon is
#     killed, a reader whose load from it fails reads the backend.
# serial: five daemons with replica links and an etcd
# tsan: the link's serving threads beside the fetcher and the FUSE workers
# asan: pieces land in a mapping of the tier file; the home reads for askers into buffers the transport frees
source "$(dirname "$0")/../lib/common.sh"
require_root

start_etcd 1
STORE="etcd://$ETCD_EPS"
SECRET=$T/secret
make_secret "$SECRET"
COMMON=(--cluster job --member-timeout 2 --cluster-store "$STORE" --replica-listen 127.0.0.1:0 --peer-fanout 1)
for n in a b c d; do mount_node $n -- "${COMMON[@]}" --node $n --cluster-secret "$SECRET"; done
A=$(node_mnt a)
loads_of() {  # loads_of MOUNT PYTHON: j is status.cluster.replicas.loads
  "$CKPTFS" status "$1" --json | $PY -c "import json,sys; j=json.load(sys.stdin)['cluster']['replicas']['loads']; $2"
}
sees_peers() { "$CKPTFS" status "$1" --json | $PY -c "import json,sys; assert json.load(sys.stdin)['cluster']['replicas']['peers'] == $2"; }
for n in a b c d; do wait_for 20 "$n does not see the other links" sees_peers "$(node_mnt $n)" 3; done
# Loads a member left to the backend, summed over the members.
to_backend() {
  local sum=0 v
  for n in "$@"; do v=$(loads_of "$(node_mnt $n)" 'print(j["to_backend"])'); sum=$((sum + v)); done
  echo $sum
}

# ---- 1. one file, three readers at once ----
mkdir -p "$A/global_step1"
head -c $((24 << 20)) /dev/urandom > "$T/model"
cp "$T/model" "$A/global_step1/model.pt"
"$CKPTFS" drain "$A" > /dev/null
cmp -s "$T/model" "$BACKEND/global_step1/model.pt" || fail "the file did not reach the backend"
before=$(to_backend a b c d)
pids=()
for n in b c d; do (cmp "$T/model" "$(node_mnt $n)/global_step1/model.pt" || echo "$n differs" > "$T/bad") & pids+=($!); done
for p in "${pids[@]}"; do wait "$p"; done
[ ! -e "$T/bad" ] || fail "$(cat "$T/bad")"
reads=$(($(to_backend a b c d) - before))
served=0
for n in a b c d; do served=$((served + $(loads_of "$(node_mnt $n)" 'print(int(j["served"] > 0))'))); done
from_peers=0 relays=0 sent=0
for n in b c d; do
  from_peers=$((from_peers + $(loads_of "$(node_mnt $n)" 'print(j["from_peers"])')))
  relays=$((relays + $(loads_of "$(node_mnt $n)" 'print(j["from_relays"])')))
done
for n in a b c d; do sent=$((sent + $(loads_of "$(node_mnt $n)" 'print(j["sent_elsewhere"])'))); done
note "3 readers: $reads backend read(s), $from_peers load(s) from a peer, $relays from one the home sent them to, $served members served"
[ "$reads" -le 1 ] || fail "the backend was read $reads times for three readers of one file"
[ "$from_peers" -ge 2 ] || fail "only $from_peers of the readers loaded from a peer"
# The home serves one asker itself (--peer-fanout 1); the next is sent on.
[ "$served" -ge 2 ] || fail "$served member(s) served loads: the home served more than one asker itself"
[ "$sent" -ge 1 ] && [ "$relays" -ge 1 ] || fail "no asker was sent to another member ($sent) or served there ($relays)"

# ---- 2. a member without the secret reads the backend ----
make_secret "$T/other-secret"
mount_node e -- "${COMMON[@]}" --node e --cluster-secret "$T/other-secret"
E=$(node_mnt e)
wait_for 20 "e does not see the other links" sees_peers "$E" 4
cmp "$T/model" "$E/global_step1/model.pt" || fail "e read other bytes"
# e asked the home unless e is the home itself: either way the backend served it.
expect_eq 1 "$(to_backend e)" "e's loads left to the backend"
expect_eq 0 "$(loads_of "$E" 'print(j["from_peers"])')" "e's loads from peers"
umount_node e

# ---- 3. the home of a file is killed: its readers read the backend ----
# A file whose home is c or d (the members' rendezvous order, found by
# trying): b's read of it comes from a peer, and that peer fetched it for b.
mkdir -p "$A/global_step2"
head -c $((5 << 20)) /dev/urandom > "$T/opt"
fetched() { loads_of "$(node_mnt $1)" 'print(j["served_after_fetch"])'; }
home="" path=""
for i in $(seq 40); do
  cp "$T/opt" "$A/global_step2/opt_$i.pt"
  "$CKPTFS" drain "$A" > /dev/null
  c0=$(fetched c) d0=$(fetched d)
  cmp "$T/opt" "$(node_mnt b)/global_step2/opt_$i.pt" || fail "b read other bytes of opt_$i.pt"
  if [ "$(fetched c)" -gt "$c0" ]; then home=c; elif [ "$(fetched d)" -gt "$d0" ]; then home=d; else continue; fi
  path=global_step2/opt_$i.pt
  break
done
[ -n "$home" ] || fail "no file of 40 had c or d as its home"
reader=c; [ "$home" = c ] && reader=d
note "home of $path: $home; read on $reader after $home is killed"
kill_node "$home"
b0=$(to_backend $reader) p0=$(loads_of "$(node_mnt $reader)" 'print(j["from_peers"])')
cmp "$T/opt" "$(node_mnt $reader)/$path" || fail "$reader read other bytes after the home died"
# Within the dead home's lease (2 s) the load fails over to the backend; on
# a machine slow enough that the lease ran out first, the next home (a live
# member) serves it. Either way one load, never a failure seen by the reader.
b1=$(to_backend $reader) p1=$(loads_of "$(node_mnt $reader)" 'print(j["from_peers"])')
expect_eq 1 $((b1 - b0 + p1 - p0)) "$reader's loads after the home died (backend + live peers)"
note "after $home died: $((b1 - b0)) from the backend, $((p1 - p0)) from a live peer"

for n in a b "$reader"; do umount_node "$n"; done
check_log --allow-errors "replica link: refused|failed the handshake" --allow-warnings "replicas:|replica link|etcd|lease|loads:"
echo "PASS: $CASE"
