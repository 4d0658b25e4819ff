#!/usr/bin/env bash
# torch.save of a model (~50 MB of parameters) and its Adam optimizer after
# one step into the mount; a new process torch.loads it and every tensor
# equals a reference saved outside the mount. Then the mmap paths a
# restore uses: torch.load(mmap=True) where this torch has it; otherwise
# (torch < 2.1) numpy.memmap of the checkpoint file and np.load(mmap_mode=
# 'r') of a .npy saved into the mount.
set -euo pipefail
source "$(dirname "$0")/../lib/common.sh"
$PY -c 'import torch, numpy' 2>/dev/null || skip "$PY has no torch/numpy"

mount_fs
mkdir "$T/ref"   # same base name as on the mount: torch.save records it in the zip
cat > "$T/save.py" <<'PY'
import sys, torch
torch.manual_seed(0)
model = torch.nn.Sequential(
    torch.nn.Linear(2048, 2048), torch.nn.ReLU(),
    torch.nn.Linear(2048, 2048), torch.nn.ReLU(),
    torch.nn.Linear(2048, 2048), torch.nn.LayerNorm(2048))
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
loss = model(torch.randn(16, 2048)).pow(2).mean()
loss.backward()
opt.step()
ckpt = {"model": model.state_dict(), "optim": opt.state_dict(), "step": 1,
        "extra": {"half": torch.randn(1000).half(), "ints": torch.arange(12345), "empty": torch.empty(0)}}
for path in sys.argv[1:]:
    torch.save(ckpt, path)
n = sum(p.numel() for p in model.parameters())
print(f"saved {n * 4 / 1e6:.1f} MB of parameters")
PY
cat > "$T/load.py" <<'PY'
import sys, torch
def walk(a, b, path="ckpt"):
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape, path
        assert torch.equal(a, b), f"{path}: tensors differ"
        return 1
    if isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), f"{path}: keys differ"
        return sum(walk(a[k], b[k], f"{path}.{k}") for k in a)
    if isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        return sum(walk(x, y, f"{path}[{i}]") for i, (x, y) in enumerate(zip(a, b)))
    assert a == b, f"{path}: {a!r} != {b!r}"
    return 0
ref = torch.load(sys.argv[1], map_location="cpu")
got = torch.load(sys.argv[2], map_location="cpu")
n = walk(ref, got)
assert n > 20, n
assert len(got["optim"]["state"]) == 8 and got["optim"]["state"][0]["step"] is not None
print(f"{n} tensors equal")
PY
$PY "$T/save.py" "$T/ref/ckpt.pt" "$MNT/ckpt.pt"
same_bytes "$T/ref/ckpt.pt" "$MNT/ckpt.pt"
size=$(size_of "$MNT/ckpt.pt")
[ "$size" -gt $((100 << 20)) ] || fail "checkpoint only $size bytes"
drop_caches
$PY "$T/load.py" "$T/ref/ckpt.pt" "$MNT/ckpt.pt"

if $PY -c 'import inspect, sys, torch; sys.exit(0 if "mmap" in inspect.signature(torch.load).parameters else 1)'; then
  $PY - "$T/ref/ckpt.pt" "$MNT/ckpt.pt" <<'PY'
import sys, torch
ref = torch.load(sys.argv[1], map_location="cpu")
got = torch.load(sys.argv[2], map_location="cpu", mmap=True, weights_only=False)
for k, v in ref["model"].items():
    assert torch.equal(v, got["model"][k]), k
print("torch.load(mmap=True): model tensors equal")
PY
else
  note "torch $($PY -c 'import torch; print(torch.__version__)') has no torch.load(mmap=True): checking numpy mmap reads instead"
  $PY - "$T/ref/ckpt.pt" "$MNT/ckpt.pt" "$MNT/arr.npy" <<'PY'
import sys, numpy as np
ref = np.fromfile(sys.argv[1], dtype=np.uint8)
mm = np.memmap(sys.argv[2], dtype=np.uint8, mode="r")
assert mm.shape == ref.shape and np.array_equal(mm, ref), "np.memmap of the checkpoint differs"
rng = np.random.default_rng(3)
for off in rng.integers(0, len(ref) - 4096, 500):
    assert np.array_equal(mm[off:off + 4096], ref[off:off + 4096]), off
arr = rng.standard_normal((1024, 4096), dtype=np.float32)
np.save(sys.argv[3], arr)
back = np.load(sys.argv[3], mmap_mode="r")
assert isinstance(back, np.memmap) and back.dtype == arr.dtype and back.shape == arr.shape
assert np.array_equal(back, arr), "np.load(mmap_mode='r') differs"
print("numpy memmap reads equal")
PY
  drop_caches
  $PY -c 'import sys, numpy as np; a = np.load(sys.argv[1], mmap_mode="r"); assert a.shape == (1024, 4096) and np.isfinite(a).all()' "$MNT/arr.npy"
fi

# Overwrite in place with the next step's checkpoint (the common pattern).
mkdir "$T/ref2"
$PY - "$MNT/ckpt.pt" "$T/ref2/ckpt.pt" <<'PY'
import sys, torch
sd = {"w": torch.randn(4096, 1024)}
for p in sys.argv[1:]:
    torch.save(sd, p)
PY
same_bytes "$T/ref2/ckpt.pt" "$MNT/ckpt.pt"
remount_fs
$PY -c 'import sys, torch; a, b = torch.load(sys.argv[1]), torch.load(sys.argv[2]); assert torch.equal(a["w"], b["w"])' "$T/ref2/ckpt.pt" "$MNT/ckpt.pt"
umount_fs
check_log
