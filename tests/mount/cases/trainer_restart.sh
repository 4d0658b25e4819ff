#!/usr/bin/env bash
# Trainer restart: a process torch.saves a checkpoint and is killed; a new
# process torch.loads it back — from the memory tier, not the backend. To
# prove no backend read happens, the backend copy is overwritten with
# garbage first: a fetch would fail its checksum (EIO), so a correct load
# can only have come from RAM. Done twice: before the drain (dirty) and
# after it (persisted, still in the tier). The shared namespace is off
# (--shared-ttl 0): with it, a backend copy rewritten behind the mount is
# another node's newer version and is fetched on purpose (shared_namespace).
set -euo pipefail
source "$(dirname "$0")/../lib/common.sh"
$PY -c 'import torch' 2>/dev/null || skip "$PY has no torch"

mount_fs --shared-ttl 0
cat > "$T/trainer.py" <<'PY'
import os, signal, sys, torch
torch.manual_seed(int(sys.argv[2]))
model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024))
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
model(torch.randn(8, 1024)).pow(2).mean().backward()
opt.step()
ck = {"model": model.state_dict(), "optim": opt.state_dict(), "step": int(sys.argv[2])}
torch.save(ck, sys.argv[3])  # the reference, outside the mount
torch.save(ck, sys.argv[1])
print("saved", flush=True)
os.kill(os.getpid(), signal.SIGKILL)  # the trainer dies right after its save
PY
cat > "$T/restart.py" <<'PY'
import sys, torch
def same(a, b, path="ckpt"):
    if isinstance(a, torch.Tensor):
        assert torch.equal(a, b), f"{path} differs"
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), f"{path}: keys differ"
        for k in a:
            same(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            same(x, y, f"{path}[{i}]")
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"
ck = torch.load(sys.argv[1])
same(torch.load(sys.argv[3]), ck)
model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024))
model.load_state_dict(ck["model"])
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
opt.load_state_dict(ck["optim"])
assert ck["step"] == int(sys.argv[2])
print("resumed at step", ck["step"])
PY

garble_backend() {  # the backend copy, if any, no longer matches its checksum
  local f=$BACKEND/$1
  [ -f "$f" ] || return 0
  head -c "$(stat -c %s "$f")" /dev/zero > "$f.garbage" && mv "$f.garbage" "$f"
}

# 1. Killed right after the save, nothing drained yet.
rc=0; $PY "$T/trainer.py" "$MNT/ckpt_1.pt" 1 "$T/ref_1.pt" > "$T/out" 2>&1 || rc=$?
[ "$rc" = 137 ] && grep -q saved "$T/out" || fail "trainer 1: want saved + SIGKILL, got rc=$rc: $(cat "$T/out")"
$PY "$T/restart.py" "$MNT/ckpt_1.pt" 1 "$T/ref_1.pt" || fail "restart 1 could not load its checkpoint"

# 2. Drained (persisted), backend copy garbled: the load still reads RAM.
rc=0; $PY "$T/trainer.py" "$MNT/ckpt_2.pt" 2 "$T/ref_2.pt" > "$T/out" 2>&1 || rc=$?
[ "$rc" = 137 ] || fail "trainer 2: rc=$rc"
"$CKPTFS" drain "$MNT" --timeout 120 > /dev/null
[ "$(getfattr --only-values -n user.ckptfs.state "$MNT/ckpt_2.pt")" = persisted ] || fail "ckpt_2.pt not persisted"
garble_backend ckpt_2.pt
sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || true  # no help from the kernel's page cache either
$PY "$T/restart.py" "$MNT/ckpt_2.pt" 2 "$T/ref_2.pt" || fail "restart 2 could not load its checkpoint from the tier"
[ "$(getfattr --only-values -n user.ckptfs.state "$MNT/ckpt_2.pt")" = persisted ] || fail "ckpt_2.pt left the tier"
umount_fs
check_log
note "both restarts loaded from the memory tier"
