#!/usr/bin/env bash
# The GPU path's library and Python module (gpu/, docs/gpu.md) on a real
# mount, with the host-only build (libckptfs_gpuhost.so: memcpy where the
# CUDA build copies from the device): a long-lived "trainer" saves a state
# of NumPy arrays and torch tensors (several dtypes and sizes) three times,
# changing it as soon as each save returns; every file, read by an
# independent safetensors reader (json + numpy, here), holds the state as
# it was at the save, on the mount and, after the drain, in the backend.
# A new process loads it back after a clean remount and after kill -9 of
# the daemon; bad input gets an OSError naming the path; no temporary file
# is left anywhere.
set -euo pipefail
source "$(dirname "$0")/../lib/common.sh"
$PY -c 'import numpy, torch' 2>/dev/null || skip "$PY has no numpy/torch"
LIBGPU=$BUILD/libckptfs_gpuhost.so
[ -f "$LIBGPU" ] || fail "$LIBGPU not built (make all builds it)"
export CKPTFS_CUDA_LIB=$LIBGPU CKPTFS_CUDA_PINNED=2x1M PYTHONPATH=$ROOT/gpu/python

mount_fs
cat > "$T/st.py" <<'PY'
# An independent safetensors reader, and the trainer's state.
import json, struct, numpy as np, torch
NP = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "I64": np.int64, "I32": np.int32,
      "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_}
def read(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    assert n % 8 == 0, "header not padded to 8"
    head = json.loads(raw[8:8 + n])
    meta = head.pop("__metadata__", {})
    data = raw[8 + n:]
    out, end = {}, 0
    for name, t in sorted(head.items(), key=lambda kv: kv[1]["data_offsets"][0]):
        b, e = t["data_offsets"]
        assert b == end, f"{name}: gap or overlap"
        end = e
        out[name] = (t["dtype"], tuple(t["shape"]), data[b:e])
    assert end == len(data), "trailing bytes"
    return meta, out
def state(seed):
    rng = np.random.default_rng(seed)
    s = {
        "embed": rng.standard_normal((512, 1024), dtype=np.float32),        # 2 MiB: two buffers
        "layer.0.w": rng.standard_normal((333, 77)).astype(np.float16),
        "layer.0.b": rng.standard_normal(77),
        "step_ids": np.arange(12345, dtype=np.int64),
        "mask": rng.integers(0, 2, 1001).astype(np.bool_),
        "bytes": rng.integers(0, 256, (3, 5, 7), dtype=np.uint8),
        "empty": np.zeros((0, 4), dtype=np.float32),
    }
    t = {"adam.m": torch.randn(700, 300, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16),
         "adam.v": torch.full((1 << 18,), float(seed), dtype=torch.float32)}
    return s, t
def raw(x):
    return x.view(torch.int16).numpy().tobytes() if isinstance(x, torch.Tensor) and x.dtype == torch.bfloat16 \
        else (x.numpy() if isinstance(x, torch.Tensor) else x).tobytes()
def check(path, arrays, tensors, step):
    meta, got = read(path)
    assert meta == {"step": str(step), "framework": "test"}, meta
    want = {**arrays, **tensors}
    assert set(got) == set(want), (set(got), set(want))
    for k, v in want.items():
        dtype, shape, data = got[k]
        assert shape == tuple(v.shape), (k, shape, v.shape)
        assert data == raw(v), f"{path}: {k} differs"
PY

cat > "$T/trainer.py" <<'PY'
import copy, errno, glob, os, sys, numpy as np, torch
sys.path.insert(0, os.path.dirname(__file__))
import ckptfs_cuda, st
mnt = sys.argv[1]
assert ckptfs_cuda.engine() == "host", ckptfs_cuda.engine()
arrays, tensors = st.state(1)
for step in (1, 2, 3):
    os.makedirs(f"{mnt}/global_step{step}", exist_ok=True)
    path = f"{mnt}/global_step{step}/model.safetensors"
    before = (copy.deepcopy(arrays), {k: v.clone() for k, v in tensors.items()})
    h = ckptfs_cuda.save(path, {**arrays, **tensors}, metadata={"step": str(step), "framework": "test"})
    for a in arrays.values():            # the trainer goes on at once
        a[...] = np.ones_like(a) if a.dtype != np.bool_ else True
    for t in tensors.values():
        t.add_(1)
    h.wait()
    st.check(path, *before, step)
    assert ckptfs_cuda.read_header(path)["__metadata__"]["step"] == str(step)
    arrays = {k: v.copy() for k, v in before[0].items()}
    for a in arrays.values():
        if a.dtype.kind == "f":
            a += step
    tensors = {k: v + step for k, v in before[1].items()}
    np.save(f"{mnt}/../ref_{step}.npy", arrays["embed"])

# Load by name into fresh memory, and a list in file order.
arrays2, tensors2 = st.state(99)
ckptfs_cuda.load(f"{mnt}/global_step1/model.safetensors", {**arrays2, **tensors2})
st.check(f"{mnt}/global_step1/model.safetensors", arrays2, tensors2, 1)
one = np.empty((512, 1024), dtype=np.float32)
ckptfs_cuda.load(f"{mnt}/global_step1/model.safetensors", {"embed": one})
assert np.array_equal(one, arrays2["embed"])

# Bad input: an OSError with the path, nothing left behind.
for call, want in (
        (lambda: ckptfs_cuda.save(f"{mnt}/nodir/x.safetensors", arrays), errno.ENOENT),
        (lambda: ckptfs_cuda.load(f"{mnt}/global_step1/model.safetensors", {"embed": np.empty(5, np.float32)}),
         errno.EINVAL),
        (lambda: ckptfs_cuda.load(f"{mnt}/global_step1/model.safetensors", {"nope": one}), errno.ENOENT),
        (lambda: ckptfs_cuda.read_header("/etc/hostname"), errno.EINVAL)):
    try:
        call()
        raise SystemExit(f"no error (want {errno.errorcode[want]})")
    except OSError as e:
        assert e.errno == want, e
        assert "/" in str(e), e
try:
    ckptfs_cuda.save(f"{mnt}/x.safetensors", {"t": np.arange(10)[::2]})
    raise SystemExit("a strided array was accepted")
except TypeError as e:
    assert "contiguous" in str(e), e
leftover = glob.glob(f"{mnt}/**/.*ckptfs-*", recursive=True)
assert not leftover, leftover
print("trainer: 3 saves checked, loads checked")
PY
$PY "$T/trainer.py" "$MNT"

"$CKPTFS" drain "$MNT" --timeout 120 > /dev/null
for s in 1 2 3; do
  f=global_step$s/model.safetensors
  same_bytes "$MNT/$f" "$BACKEND/$f"
  expect_eq persisted "$(state_of "$MNT/$f")" "state of $f"
done
[ -z "$(find "$BACKEND" "$MNT" -name '.*ckptfs-*' -not -path '*/.ckptfs-tmp*')" ] || fail "temporary files left"

cat > "$T/restart.py" <<'PY'
import os, sys, numpy as np
sys.path.insert(0, os.path.dirname(__file__))
import ckptfs_cuda, st
mnt, step = sys.argv[1], int(sys.argv[2])
ref = np.load(f"{mnt}/../ref_{step - 1}.npy") if step > 1 else st.state(1)[0]["embed"]
got = np.empty_like(ref)
ckptfs_cuda.load(f"{mnt}/global_step{step}/model.safetensors", {"embed": got})
assert np.array_equal(got, ref), "restart: embed differs"
print(f"restart: step {step} loaded")
PY
remount_fs
$PY "$T/restart.py" "$MNT" 3

# kill -9 after a save's wait(): the closed file is recovered from the tier.
cat > "$T/one.py" <<'PY'
import os, sys, numpy as np
sys.path.insert(0, os.path.dirname(__file__))
import ckptfs_cuda, st
os.makedirs(f"{sys.argv[1]}/global_step4", exist_ok=True)
a = np.load(f"{sys.argv[1]}/../ref_3.npy")
ckptfs_cuda.save(f"{sys.argv[1]}/global_step4/model.safetensors", {"embed": a}, wait=True)
PY
"$CKPTFS" drain "$MNT" --timeout 60 > /dev/null
$PY "$T/one.py" "$MNT"
crash_daemon
mount_fs
$PY "$T/restart.py" "$MNT" 4
check_log
echo "PASS: $CASE"
