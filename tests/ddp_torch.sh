#!/bin/sh
# tests/ddp_torch.sh - kiln's data-parallel training against PyTorch 2.x's
# DistributedDataParallel, loss for loss.
#
# bench/mlp_bench.ini's MLP (Fashion-MNIST, SGD with momentum): `kiln export`
# writes its initial weights; `kiln launch -n 2` trains 8 steps from them
# ([model] init_from, data.shuffle = 0, 32 samples a rank, one thread each)
# and logs every step's loss (metrics.jsonl: the global batch's mean);
# bench/pytorch_ddp.py --losses trains the same weights on the same global
# batches with torch.distributed (gloo) and DDP on 2 processes and prints
# its losses, averaged over the ranks.  Every step's losses agree within
# 1e-4 (relative to max(1, |loss|)).
#
# Needs PyTorch 2.x in $KILN_VENV (default: the source tree's .venv;
# scripts/install-deps --bench makes it), the gloo plugin and Fashion-MNIST;
# without any of them the test is skipped (exit 77) with the reason.
name=ddp-torch
. "$(dirname "$0")/lib.sh"
kiln="$abs_top_builddir/kiln"
venv=${KILN_VENV:-$srcdir/.venv}
py=$venv/bin/python
steps=8

[ -x "$py" ] || { echo "SKIP: no $py (set KILN_VENV; scripts/install-deps --bench makes it)"; exit 77; }
"$py" -c 'import sys, torch, torch.distributed as d; sys.exit(not (int(torch.__version__.split(".")[0]) >= 2 and d.is_available()))' 2>/dev/null ||
	{ echo "SKIP: $py has no PyTorch 2.x with torch.distributed"; exit 77; }
[ -f "$abs_top_builddir/plugins/.libs/kiln-gloo.so" ] || { echo "SKIP: the gloo plugin is not built"; exit 77; }
[ -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ] || { echo "SKIP: no Fashion-MNIST"; exit 77; }

ini="$srcdir/bench/mlp_bench.ini"
"$kiln" export "$ini" --safetensors "$tmp/init.safetensors" run.out_dir= > "$tmp/export.log" 2>&1 ||
	{ cat "$tmp/export.log"; fail "kiln export of the initial weights"; }

port=$(/usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])' 2>/dev/null ||
	echo $(( 20000 + $$ % 20000 )))
KILN_MASTER_PORT=$port timeout 180 "$kiln" launch -n 2 -- "$kiln" train "$ini" run.threads=1 \
	model.init_from="$tmp/init.safetensors" train.batch=32 data.shuffle=0 train.log_every=1 \
	train.max_steps=$steps train.eval=0 run.out_dir="$tmp/k" > "$tmp/kiln.log" 2>&1 ||
	{ tail -20 "$tmp/kiln.log"; fail "kiln launch -n 2 train"; }
sed -n 's/.*"event":"train".*"step":\([0-9]*\),"loss":\([0-9.e+-]*\).*/\1 \2/p' \
	"$tmp/k/metrics.jsonl" > "$tmp/kiln.losses"

(cd "$srcdir/bench" && OMP_NUM_THREADS=1 timeout 300 "$py" pytorch_ddp.py --losses --threads 1 \
	--init "$tmp/init.safetensors" --batch 64 --steps $steps) > "$tmp/torch.out" 2> "$tmp/torch.err" ||
	{ tail -20 "$tmp/torch.err"; fail "bench/pytorch_ddp.py --losses"; }

# step kiln torch |diff|, and the verdict
/usr/bin/python3 - "$tmp/kiln.losses" "$tmp/torch.out" "$steps" <<'PY' || fail "kiln's and PyTorch DDP's losses differ"
import json, sys
k = [tuple(l.split()) for l in open(sys.argv[1]) if l.strip()]
t = json.loads([l for l in open(sys.argv[2]) if l.startswith("{")][-1])["losses"]
n = int(sys.argv[3])
ok = len(k) == n and len(t) == n and [int(s) for s, _ in k] == list(range(1, n + 1))
if not ok:
    print("want %d steps: kiln logged %s, PyTorch %d" % (n, [s for s, _ in k], len(t)))
for (s, kl), tl in zip(k, t):
    d = abs(float(kl) - tl)
    bad = d > 1e-4 * max(1.0, abs(tl))
    ok = ok and not bad
    print("step %s kiln %s torch %.6f diff %.2e%s" % (s, kl, tl, d, "  <- over 1e-4" if bad else ""))
sys.exit(0 if ok else 1)
PY
echo "PASS: $steps steps of 2-rank DDP, kiln's losses within 1e-4 of PyTorch's"
