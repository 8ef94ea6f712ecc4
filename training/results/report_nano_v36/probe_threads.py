"""Which op first rounds differently at 1 and 2 torch threads? One AR training forward/backward of the nano (F23).

Run from the repo root: .venv/bin/python training/results/report_nano_v36/probe_threads.py (v36: the forward and the
loss bitwise equal; 51 of 91 parameter gradients differ, by at most 1.7e-6 relative, largest in the vision tower).
"""
import json, sys, torch
sys.path.insert(0, str(__import__('pathlib').Path(__file__).resolve().parents[3]))
from training.data import build_datasets
from training.collate import collate
from training.trainer import _load_init
from training.objective import diffusion_loss, SelectedLogits
from wam_diff_core.attention.backends import use_backend

data = [{"path": "runs/fast/data_plan/train.json", "task": "planning", "weight": 1.0}]
def run(threads):
    torch.set_num_threads(threads)
    loaded = _load_init("runs/ab_v36/F23/ar/model", 0, torch.device("cpu"))
    use_backend(loaded.model, "sdpa")
    model = loaded.model.train()
    ds = build_datasets(data, loaded.processor, 8192, 512, "skip")
    batch = collate([ds[i] for i in range(8)], loaded.pad_token_id, with_noisy=False)
    outs, order = {}, []
    def hook(name):
        def f(mod, inp, out):
            t = out[0] if isinstance(out, (tuple, list)) else getattr(out, "last_hidden_state", out)
            if torch.is_tensor(t):
                if name not in outs: order.append(name)
                outs[name] = t.detach().clone()
        return f
    hs = [m.register_forward_hook(hook(n)) for n, m in model.named_modules() if n]
    gen = torch.Generator().manual_seed(0)
    out = diffusion_loss(SelectedLogits(model), model, batch, 1, loaded.settings.mask_token_id, gen)
    out.loss.backward()
    for h in hs: h.remove()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return out.loss.item(), outs, order, grads
l2, o2, order, g2 = run(2)
l1, o1, _, g1 = run(1)
print("loss", l2, l1, l2 == l1)
shown = 0
for n in order:
    a, b = o2[n], o1.get(n)
    if b is None or a.shape != b.shape: continue
    d = (a.float() - b.float()).abs().max().item()
    if d > 0 and shown < 12:
        print("first differing outputs:", n, type(a), tuple(a.shape), f"{d:.2e}"); shown += 1
print("modules compared", len(order))
rel = sorted(((((g2[n]-g1[n]).abs().max()/(g2[n].abs().max()+1e-30)).item(), n) for n in g2), reverse=True)
print("largest relative grad differences:", [(f"{r:.1e}", n) for r, n in rel[:8]])
print("params with identical grads:", sum(1 for r, n in rel if r == 0), "of", len(rel))
from collections import Counter
print("differing by part:", Counter(n.split('.')[1] + ('.' + n.split('.')[2] if n.split('.')[1]=='visual' else '') for r, n in rel if r > 0))
print("identical by part:", Counter(n.split('.')[1] for r, n in rel if r == 0))
print("text params differing:", [(f"{r:.1e}", n) for r, n in rel if r > 0 and 'visual' not in n][:6])
