#!/bin/sh
# tests/report.sh - `kiln report` in a real browser: train a tiny profiled
# run, write its report, render it with headless Chromium (Debian's
# chromium; the test skips with 77 without it) to a DOM dump and a PNG, and
# check that the page has every section, no script and no external
# resource, that text from the config is escaped, that each plot has one
# circle and one polyline vertex per metrics.jsonl line of its kind (and a
# note instead of a plot for a field no line has), and that the PNG is a
# real picture; that the fields newer trainers log (lr, samples_per_s,
# data_wait, grad_norm, time) are plotted (a synthetic metrics.jsonl); that
# 200,000 distinct fields are read in well under 20 s; that a resumed
# run's curves leave out the lines the interrupted run logged after its
# checkpoint (session 40).  Bad input: no metrics.jsonl is a usage error.
name=report
. "$(dirname "$0")/lib.sh"
need_fashion_mnist
chromium=$(command -v chromium || command -v chromium-browser) ||
	{ echo "SKIP: chromium is not installed (scripts/install-deps installs it)"; exit 77; }

run="$tmp/run"
kiln 0 train "$srcdir/examples/fashion_mnist_mlp.ini" data.limit=1000 data.eval.limit=200 \
	train.epochs=2 train.log_every=4 run.profile=1 run.profile_steps=2 "run.out_dir=$run"
# text from the config must be escaped: a comment that would be markup
echo '; <script>alert(1)</script> & "quoted" <b>bold</b>' >>"$run/config.ini"
kiln 0 report "$run"
html="$run/report.html"
[ -s "$html" ] || fail "no $html"
grep -qF '&lt;script&gt;alert(1)&lt;/script&gt; &amp; &quot;quoted&quot; &lt;b&gt;bold&lt;/b&gt;' "$html" ||
	fail "the config comment is not escaped in the report"
! grep -qi '<script' "$html" || fail "the report has a <script>"
! grep -qiE '(src|href)=' "$html" || fail "the report refers to an external resource"

# render: the DOM as Chromium parsed it, and a screenshot (slow on a
# loaded machine: a generous timeout)
chrome() {
	timeout 600 "$chromium" --headless --no-sandbox --disable-gpu --user-data-dir="$tmp/chrome" \
		--window-size=1200,3000 "$@" "file://$html" 2>"$tmp/chrome.err"
}
chrome --dump-dom >"$tmp/dom.html" || { cat "$tmp/chrome.err"; fail "chromium --dump-dom failed"; }
chrome --screenshot="$tmp/report.png" >/dev/null || { cat "$tmp/chrome.err"; fail "chromium --screenshot failed"; }
grep -q '</html>' "$tmp/dom.html" || fail "the dumped DOM is incomplete"
for id in result curves config summary memory profile; do
	grep -q "<section id=\"$id\">" "$tmp/dom.html" || fail "the rendered page has no section '$id'"
done
grep -q "Total params: 535,818" "$tmp/dom.html" || fail "no model summary in the page"
grep -q "activations peak at" "$tmp/dom.html" || fail "no memory report in the page"
grep -q "self time per (layer, op, pass)" "$tmp/dom.html" || fail "no profile table in the page"
grep -q "&lt;script&gt;alert(1)" "$tmp/dom.html" || fail "the escaped comment did not survive rendering"
echo "ok: Chromium rendered every section"

# points: one circle and one polyline vertex per line of the kind
metrics="$run/metrics.jsonl"
circles() { grep -o "<circle class=\"pt\" data-series=\"$1\"" "$tmp/dom.html" | wc -l; }
vertices() {
	sed -n "s/.*<polyline [^>]*data-series=\"$1\" points=\"\([^\"]*\)\".*/\1/p" "$tmp/dom.html" |
		awk '{ print NF }'
}
plots=0
for f in loss acc lr samples_per_s data_wait grad_norm loss_scale time; do
	for set in train test; do
		if [ $set = train ]; then
			n=$(grep '"event":"train"' "$metrics" | grep -c "\"$f\":")
		else
			n=$(grep '"event":"eval"' "$metrics" | grep '"set":"test"' | grep -c "\"$f\":")
		fi
		[ "$(circles "$set.$f")" -eq "$n" ] || fail "$set.$f: $(circles "$set.$f") circles, $n lines"
		[ "$n" -eq 0 ] || [ "$(vertices "$set.$f")" -eq "$n" ] ||
			fail "$set.$f: $(vertices "$set.$f") polyline vertices, $n lines"
		[ "$n" -eq 0 ] || plots=$((plots + 1))
	done
	if ! grep -q "\"$f\":" "$metrics"; then
		grep -q "no \"$f\" field" "$tmp/dom.html" || fail "no note for the absent field $f"
	fi
done
[ "$(grep -c '"event":"train"' "$metrics")" -ge 4 ] || fail "too few train lines in $metrics"
[ "$plots" -ge 5 ] || fail "only $plots series plotted"
echo "ok: $plots series, one point per metrics line each"

# the screenshot: a PNG of the page's size, not a blank one
[ "$(head -c 8 "$tmp/report.png" | od -An -tx1 | tr -d ' \n')" = 89504e470d0a1a0a ] ||
	fail "the screenshot is not a PNG"
size=$(wc -c <"$tmp/report.png")
[ "$size" -gt 50000 ] || fail "the screenshot is only $size bytes: blank?"
echo "ok: screenshot $size bytes"

# the fields helper-written trainers add to train lines (lr, samples_per_s,
# data_wait, grad_norm, time): each gets its plot, grad_norm only where
# logged; a line that is not JSON is skipped
syn="$tmp/syn"
mkdir "$syn"
awk 'BEGIN { for (s = 10; s <= 80; s += 10) {
	printf "{\"event\":\"train\",\"epoch\":1,\"step\":%d,\"loss\":%g,\"acc\":%g,\"skipped\":0,", s, 2 / s, 1 - 1 / s
	printf "\"loss_scale\":1.0,\"time\":%g,\"lr\":%g,\"samples_per_s\":%d,\"data_wait\":%g", s / 10, 0.1 / s, 1000 + s, 0.01 * (s % 3)
	if (s % 20 == 0) printf ",\"grad_norm\":%g", 10 / s
	print "}" }
	print "not json"
	print "{\"event\":\"eval\",\"set\":\"val\",\"epoch\":1,\"step\":40,\"loss\":0.5,\"acc\":0.8,\"acc5\":0.9,\"samples\":10}" }' \
	>"$syn/metrics.jsonl"
kiln 0 report "$syn"
for want in train.lr:8 train.samples_per_s:8 train.data_wait:8 train.time:8 train.grad_norm:4 \
	val.loss:1 val.acc:1 train.loss:8; do
	s=${want%:*}
	n=$(grep -o "<circle class=\"pt\" data-series=\"$s\"" "$syn/report.html" | wc -l)
	[ "$n" -eq "${want#*:}" ] || fail "synthetic run: $s has $n points, expected ${want#*:}"
done
for id in lr throughput data_wait grad_norm time; do
	grep -q "<svg class=\"plot\" id=\"plot-$id\"" "$syn/report.html" || fail "synthetic run: no plot $id"
done
grep -q "some not JSON objects: skipped" "$syn/report.html" || fail "synthetic run: the bad line is not reported"
echo "ok: lr, throughput, data wait, gradient norm and time plotted when logged"

# a resumed run: 6 steps, a checkpoint at step 4, the one of step 6 lost
# (the run killed after its last line), resumed to step 8 from step 4's:
# each curve has one point a step logged, the resumed run's at step 6
# (before session 40 the first run's step 6 too: 5 train points for 4
# steps logged), and the Result section says what was left out
rr="$tmp/resumed"
set -- "$srcdir/examples/fashion_mnist_mlp.ini" data.limit=1000 data.eval.limit=200 \
	train.batch=64 train.log_every=2 train.eval_every=2 train.checkpoint_every=4 "run.out_dir=$rr"
kiln 0 train "$@" train.max_steps=6
rm "$rr/checkpoints/ckpt-6.kiln"
kiln 0 train "$@" train.max_steps=8 --resume
kiln 0 report "$rr"
for s in train.loss:4 train.lr:4 test.loss:4 test.acc:4; do
	n=$(grep -o "<circle class=\"pt\" data-series=\"${s%:*}\"" "$rr/report.html" | wc -l)
	[ "$n" -eq "${s#*:}" ] || fail "resumed run: ${s%:*} has $n points, expected ${s#*:} (steps 2, 4, 6, 8)"
done
grep -qF "1 resume(s): 2 train and eval line(s) of an interrupted run" "$rr/report.html" ||
	fail "resumed run: the Result section does not say what was left out"
echo "ok: a resumed run's curves: one point a step logged"

# 200,000 distinct fields (10 train lines of 20,000): looked up one by one,
# the old code took 20-25 s for half as many, so ~90 s here (0.2 s for
# 100,000 by name hash; a 20 s bound, so only a quadratic lookup fails it),
# and train.loss still has its 10 points
big="$tmp/big"
mkdir "$big"
awk 'BEGIN { for (l = 0; l < 10; l++) {
	printf "{\"event\":\"train\",\"epoch\":1,\"step\":%d,\"loss\":%g", l + 1, 1 / (l + 1)
	for (i = 0; i < 20000; i++) printf ",\"k%06d\":%d", l * 20000 + i, i
	print "}" } }' >"$big/metrics.jsonl"
timeout -k 5 20 "$kiln" report "$big" >"$out" 2>"$err" || fail "kiln report of 200,000 fields: exit $? (124: over 20 s)"
n=$(grep -o '<circle class="pt" data-series="train.loss"' "$big/report.html" | wc -l)
[ "$n" -eq 10 ] || fail "200,000 fields: train.loss has $n points, expected 10"
echo "ok: 200,000 distinct fields reported in under 20 s"

# -o, a run without config.ini, bad input
kiln 0 report "$run" -o "$tmp/other.html"
[ -s "$tmp/other.html" ] || fail "-o wrote nothing"
rm "$run/config.ini"
kiln 0 report "$run" -o "$tmp/noconfig.html"
grep -q "No config.ini" "$tmp/noconfig.html" || fail "no note for a missing config.ini"
kiln 2 report "$tmp"
stderr_has "metrics.jsonl"
kiln 2 report
kiln 2 report "$run" --bogus
echo "ok: report.sh: $checks kiln runs"
