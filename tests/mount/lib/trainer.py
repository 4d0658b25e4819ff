#!/usr/bin/python3
"""trainer.py MNT MANIFEST — the trainer-like writer of the drain cases
(drain_trainer.sh, s3_trainer.sh): six steps, each a step_N/ with a
torch.save of the model and of the optimizer, a manifest (outside the
mount) of their sha256, then `latest` rewritten in place, then the step
two back deleted.

TRAINER_PAUSE=FILE: after step 3, wait (at most 60 s) until FILE exists.
The cases' watchers create it once they have seen step_3 consistent in the
backend, so each run shows them one intermediate state at least (a
watcher that never sees one fails its case)."""
import hashlib, json, os, shutil, sys, time, torch
mnt, manifest = sys.argv[1], sys.argv[2]
pause = os.environ.get("TRAINER_PAUSE")
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 512))
opt = torch.optim.Adam(model.parameters())
sums = {}
for step in range(1, 7):
    loss = model(torch.randn(8, 512)).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
    d = os.path.join(mnt, f"step_{step}")
    os.makedirs(d)
    torch.save(model.state_dict(), os.path.join(d, "model.pt"))
    torch.save(opt.state_dict(), os.path.join(d, "optim.pt"))
    for n in ("model.pt", "optim.pt"):
        with open(os.path.join(d, n), "rb") as f:
            sums[f"step_{step}/{n}"] = hashlib.sha256(f.read()).hexdigest()
    with open(manifest + ".tmp", "w") as f:
        json.dump(sums, f)
    os.replace(manifest + ".tmp", manifest)
    with open(os.path.join(mnt, "latest"), "w") as f:
        f.write(f"step_{step}")
    if step > 2:
        shutil.rmtree(os.path.join(mnt, f"step_{step - 2}"))
    if pause and step == 3:
        deadline = time.monotonic() + 60
        while not os.path.exists(pause) and time.monotonic() < deadline:
            time.sleep(0.02)
