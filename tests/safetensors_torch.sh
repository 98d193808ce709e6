#!/bin/sh
# tests/safetensors_torch.sh - kiln's safetensors export read by PyTorch
# (the reverse of check_safetensors' PyTorch -> kiln test).
#
# tests/st_export_test trains the model of tests/data/st_cnn.ini three steps,
# writes it with kiln_model_save_safetensors and writes its eval-mode
# logits for a fixed input; tests/data/gen_safetensors_refs.py --check
# loads the file into the PyTorch model with load_state_dict(strict=True)
# and compares PyTorch's logits with kiln's (rel 1e-4), in both of kiln's
# layouts.  Then `kiln export` re-exports those weights through [model]
# init_from: byte-identical, and a fresh `kiln export` loads strictly too.
#
# Needs /usr/bin/python3 with torch (scripts/install-deps --bench);
# without it the test is skipped (exit 77), and only then.
name=st
. "$(dirname "$0")/lib.sh"
py=/usr/bin/python3

if ! [ -x "$py" ] || ! "$py" -c 'import torch, numpy' 2>/dev/null; then
	echo "SKIP: $py cannot import torch and numpy (scripts/install-deps --bench installs them)"
	exit 77
fi

ini="$srcdir/tests/data/st_cnn.ini"
gen="$srcdir/tests/data/gen_safetensors_refs.py"

for layout in nchw nhwc; do
	mkdir -p "$tmp/$layout"
	"$top_builddir/tests/st_export_test" "$ini" "$tmp/$layout" fc2 "model.layout=$layout" ||
		fail "st_export_test ($layout)"
	# three training steps: num_batches_tracked = 3
	"$py" "$gen" --check "$tmp/$layout/model.safetensors" "$tmp/$layout/logits.safetensors" \
		--tracked 3 || fail "PyTorch does not reproduce kiln's logits ($layout)"
done

# `kiln export` needs a [data] source for the sample shape: synthetic 3x8x8;
# no run directory, so it exports the initial weights (and init_from)
data="data.source=synthetic"
nodir="run.out_dir="
if ! "$top_builddir/kiln" plugins 2>/dev/null | grep -q '^source  *synthetic .*available'; then
	echo "note: no synthetic source (configure without loaders): kiln export not checked"
	exit 0
fi
"$top_builddir/kiln" export "$ini" --safetensors "$tmp/re.safetensors" "$data" "$nodir" \
	"data.image_size=8 8" data.image_channels=3 \
	"model.init_from=$tmp/nchw/model.safetensors" || fail "kiln export with init_from"
cmp "$tmp/nchw/model.safetensors" "$tmp/re.safetensors" ||
	fail "kiln export of init_from weights differs from the file it loaded"
"$top_builddir/kiln" export "$ini" --safetensors "$tmp/fresh.safetensors" "$data" "$nodir" \
	"data.image_size=8 8" data.image_channels=3 || fail "kiln export (fresh init)"
"$py" "$gen" --check "$tmp/fresh.safetensors" --tracked 0 || fail "fresh export"
echo "PASS: PyTorch loads kiln's exports strictly and reproduces kiln's logits"
