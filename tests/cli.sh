#!/bin/sh
# tests/cli.sh - the `kiln` command: exit codes and messages of `kiln
# --help`, `kiln config` and `kiln plugins`, with the test plugins of
# tests/plugins.  Run by `make check` from the build directory (automake
# exports srcdir; tests/local.mk exports top_builddir and abs_top_builddir).
name=cli
. "$(dirname "$0")/lib.sh"
plugdir="$abs_top_builddir/tests/plugins/.libs"
cfgdir="$srcdir/tests/config"

[ -x "$kiln" ] || { echo "FAIL: $kiln not built"; exit 99; }
[ -f "$plugdir/kiln-tgood.so" ] || { echo "FAIL: test plugins not built in $plugdir"; exit 99; }

# ---- dispatch -------------------------------------------------------------
kiln 0 --help
stdout_has "usage: kiln <command>"
stdout_has "plugins"
stdout_has "eval FILE"
stdout_has "--resume"
stdout_has "export FILE --onnx OUT"
# every command's description starts in column 40 (predict's began in 39
# before session 33)
bad=$(awk '/^  [a-z]/ && !(substr($0, 39, 1) == " " && substr($0, 40, 1) != " ")' "$out")
[ -z "$bad" ] || fail "--help: descriptions out of column 40: $bad"
kiln 0 --version
stdout_has "plugin ABI"
kiln 2
stderr_has "usage: kiln"
kiln 2 frobnicate
stderr_has "unknown command 'frobnicate'"
! grep -q "did you mean" "$err" || fail "frobnicate: a suggestion for a word near no command"
# a near miss names the command (before session 36 it did not)
kiln 2 trian
stderr_has "kiln: error: unknown command 'trian'; did you mean 'train'?"
kiln 2 reprot
stderr_has "unknown command 'reprot'; did you mean 'report'?"
kiln 2 evl
stderr_has "unknown command 'evl'; did you mean 'eval'?"
kiln 0 config --help
stdout_has "usage: kiln config"
kiln 0 plugins --help
stdout_has "usage: kiln plugins"
kiln 0 eval --help
stdout_has "usage: kiln eval FILE [--checkpoint CKPT]"
kiln 2 eval
stderr_has "usage: kiln eval"
kiln 2 eval "$cfgdir/cli.ini" --checkpoint
stderr_has "kiln: error: --checkpoint needs a value"
kiln 0 train --help
stdout_has "--resume"
stdout_has "SIGTERM"

# ---- kiln config ------------------------------------------------------------
# (cli.ini has no model: `kiln config` refuses an empty one as training
# does, session 34; l.ini is cli.ini with one)
{ cat "$cfgdir/cli.ini"; printf '\n[layer.fc1]\ntype = linear\nout = 4\n\n[layer.loss]\ntype = softmax_xent\n'; } > "$tmp/l.ini"
kiln 2 config "$cfgdir/cli.ini" "run.plugin_path=$plugdir"
stderr_has "kiln: error: $cfgdir/cli.ini: no [layer.NAME] sections: the model is empty"
kiln 0 config "$tmp/l.ini" "run.plugin_path=$plugdir"
for s in '[run]' '[data]' '[data.eval]' '[model]' '[train]' '[dist]'; do
	stdout_has "$s"
done
stdout_has "seed = 7"
stdout_has "lr = 0.05"
stdout_has "batch = 128"          # a default
stdout_has "source = tsrc"
stdout_has "count = 7"            # a key of the source plugin
stdout_has "plugin_path = $plugdir"
[ ! -s "$err" ] || fail "stderr not empty"

kiln 0 config "$tmp/l.ini" "run.plugin_path=$plugdir" train.lr=0.5
stdout_has "lr = 0.5"

# a misspelt key in each fixed section: exit 2, file:line, suggestion
for t in "run 4 threds threads" "data 5 limt limit" "train 6 epocs epochs"; do
	set -- $t
	kiln 2 config "$cfgdir/typo_$1.ini" "run.plugin_path=$plugdir"
	stderr_has "typo_$1.ini:$2: unknown key '$3' in [$1]"
	stderr_has "did you mean '$4'?"
done
# [model] has no keys yet: the error says so instead of suggesting
kiln 2 config "$cfgdir/typo_model.ini" "run.plugin_path=$plugdir"
stderr_has "typo_model.ini:3: unknown key 'layuot' in [model]; did you mean 'layout'?"
# a misspelt key of the source plugin
printf '[data]\nsource = tsrc\ncuont = 3\n' > "$tmp/src.ini"
kiln 2 config "$tmp/src.ini" "run.plugin_path=$plugdir"
stderr_has "src.ini:3: unknown key 'cuont' in [data]"
stderr_has "did you mean 'count'?"
# an unknown section
printf '[run]\n\n[trian]\nlr = 1\n' > "$tmp/sec.ini"
kiln 2 config "$tmp/sec.ini" "run.plugin_path=$plugdir"
stderr_has "sec.ini:3: unknown section [trian]; did you mean [train]?"
# a syntax error
printf '[train]\nlr = 1\nnot ini\n' > "$tmp/syn.ini"
kiln 2 config "$tmp/syn.ini"
stderr_has "syn.ini:3: syntax error"

# bad overrides
kiln 2 config "$cfgdir/cli.ini" "run.plugin_path=$plugdir" train.batch=0
stderr_has "command line"
stderr_has "'batch' = 0 is out of range"
kiln 2 config "$cfgdir/cli.ini" "run.plugin_path=$plugdir" train.epocs=3
stderr_has "command line"
stderr_has "did you mean 'epochs'?"
kiln 2 config "$cfgdir/cli.ini" lr=0.1
stderr_has "override 'lr=0.1'"
# a key overridden twice: the last taken, as before, but said (before
# session 50 without a word; twice in a file is an error); the same text
# twice changes nothing and is not told
kiln 0 config "$tmp/l.ini" "run.plugin_path=$plugdir" train.lr=0.1 train.epochs=2 train.lr=0.2
stderr_has "[config] warning: command line 'train.lr=0.2' sets train.lr again, after 'train.lr=0.1': 'train.lr=0.2' is taken"
stdout_has "lr = 0.2"
kiln 0 config "$tmp/l.ini" "run.plugin_path=$plugdir" train.lr=0.1 train.lr=0.1
! grep -q "again" "$err" || fail "the same override twice warned: $(grep again "$err")"
kiln 2 config "$cfgdir/cli.ini" notanoverride
stderr_has "unexpected argument 'notanoverride'"
# missing or unreadable config
kiln 2 config "$tmp/does-not-exist.ini"
stderr_has "$tmp/does-not-exist.ini"
kiln 2 config
stderr_has "usage: kiln config"
# a source that is not there names what is
kiln 2 config "$cfgdir/cli.ini" "run.plugin_path=$plugdir" data.source=nosuchsource
stderr_has "nosuchsource"
stderr_has "tsrc"
# a device that is not there: exit 2 at its line, the nearest name suggested
# (before session 31 `kiln config` said OK and train failed with exit 1 and
# "no device plugin named 'cpuu'", no file:line)
sed '/^\[run\]/a device = cpuu' "$tmp/l.ini" > "$tmp/dev.ini"
kiln 2 config "$tmp/dev.ini" "run.plugin_path=$plugdir"
stderr_has "$tmp/dev.ini:4: [run] device = 'cpuu': no device plugin of that name; did you mean 'cpu'? (devices: auto, cpu"
kiln 2 train "$tmp/dev.ini" "run.plugin_path=$plugdir" "run.out_dir=$tmp/devrun"
stderr_has "$tmp/dev.ini:4: [run] device = 'cpuu'"
kiln 0 config "$tmp/dev.ini" "run.plugin_path=$plugdir" run.device=auto
kiln 0 config "$tmp/dev.ini" "run.plugin_path=$plugdir" run.device=cpu
# the layers' required keys: `kiln config` refuses what building the model
# would (it exited 0 before session 33), and a key a command-line override
# unset is told as such (before: the file's line alone, as if the file
# lacked it)
fc1=$(grep -n '^\[layer.fc1\]' "$tmp/l.ini" | cut -d: -f1)
kiln 0 config "$tmp/l.ini" "run.plugin_path=$plugdir"
grep -v '^out = 4$' "$tmp/l.ini" > "$tmp/l2.ini"
kiln 2 config "$tmp/l2.ini" "run.plugin_path=$plugdir"
stderr_has "kiln: error: layer 'fc1': $tmp/l2.ini:$fc1: [layer.fc1] needs 'out' (number of output features)"
kiln 2 config "$tmp/l.ini" "run.plugin_path=$plugdir" layer.fc1.out=
stderr_has "kiln: error: layer 'fc1' ('out' unset by command line 'layer.fc1.out='): $tmp/l.ini:$fc1: [layer.fc1] needs 'out'"
kiln 2 config "$tmp/l.ini" "run.plugin_path=$plugdir" layer.fc1.type=
stderr_has "kiln: error: $tmp/l.ini:$fc1: [layer.fc1] has no 'type' key ('type' unset by command line 'layer.fc1.type=')"
# every choice value gets the nearest name, as a device does (before
# session 33 a layer type, a source, an optimizer or an enum got none)
kiln 2 config "$tmp/l.ini" "run.plugin_path=$plugdir" layer.fc1.type=lnear
stderr_has "no layer plugin named 'lnear'; did you mean 'linear'? (available: "
kiln 2 config "$tmp/l.ini" "run.plugin_path=$plugdir" data.source=tsrcc
stderr_has "no source plugin named 'tsrcc'; did you mean 'tsrc'? (available: "
kiln 2 config "$tmp/l.ini" "run.plugin_path=$plugdir" train.optimizer=adamww
stderr_has "[train] optimizer = adamww: one of "
stderr_has "; did you mean 'adamw'?"
kiln 2 config "$tmp/l.ini" "run.plugin_path=$plugdir" run.precision=bf61
stderr_has "'precision' = 'bf61' is not one of fp32|bf16|fp16|fp16_static; did you mean 'bf16'?"
kiln 2 config "$tmp/l.ini" "run.plugin_path=$plugdir" layer.fc1.type=dense
grep -q "did you mean" "$err" && fail "'dense' got a suggestion: $(cat "$err")"
# what `kiln train` refuses before it opens the data, `kiln config`
# refuses too (it exited 0 on each before session 34): exit 2 naming the key
cfg_refuses() {
	ov=$1; shift
	kiln 2 config "$tmp/l.ini" "run.plugin_path=$plugdir" "$ov"
	stderr_has "command line '$ov': $*"
}
cfg_refuses run.memory_limit=-1 "[run] memory_limit = '-1': expected a decimal number of bytes"
cfg_refuses run.devices=,,, "[run] devices: expected a list of up to"
cfg_refuses data.mean=zzz "[data] mean = 'zzz' is not a number"
cfg_refuses "data.eval.std=1 x" "[data.eval] std = '1 x' is not a number"
# past a double's range: out of range, not "not a number" (session 38)
cfg_refuses "data.mean=0.5,1e-400" "[data] mean = '0.5,1e-400': 1e-400 is out of range (a double holds 0 and magnitudes"
# a subnormal is a number a double holds: read as it is, in a list as in a
# key (refused as out of range for a moment in session 38; main took it)
kiln 0 config "$tmp/l.ini" "run.plugin_path=$plugdir" "data.mean=0.5,1e-320" "data.std=1e-310"
kiln 0 config "$tmp/l.ini" "run.plugin_path=$plugdir" "train.lr=1e-310"
# an override's value is trimmed on the right as a file's is (before
# session 34 "data.workers=4 " passed here and failed in kiln train, and
# "train.schedule=cosine " was refused: "did you mean 'cosine'")
kiln 0 config "$tmp/l.ini" "run.plugin_path=$plugdir" "data.workers=4 " "train.schedule=cosine	 "
stdout_matches '^workers = 4$'
stdout_matches '^schedule = cosine$'
cfg_refuses model.stages=nolayer "[model] stages: no layer 'nolayer'"
cfg_refuses layer.fc1.tie=nolayer "[layer.fc1] tie = nolayer: there is no layer 'nolayer'"
cfg_refuses layer.fc1.input=nolayer "[layer.fc1] input = nolayer: no layer 'nolayer' above this one"
cfg_refuses layer.loss.inputs=fc1,nolayer "[layer.loss] inputs = fc1,nolayer: no layer 'nolayer' above this one"
# an empty name between commas (it was "takes 1..1 inputs, got 0" at the
# type line, or a dropped input)
cfg_refuses "layer.fc1.inputs=,," "[layer.fc1] inputs = ,,: an empty layer name (a stray comma?)"
cfg_refuses "layer.loss.inputs=fc1," "[layer.loss] inputs = fc1,: an empty layer name (a stray comma?)"
cfg_refuses layer.fc1.int8_scale=0.5 "[layer.fc1] int8_scale = 0.5: INT8 layers are for evaluation only"
# kiln's own GPU device where it is not built says so, not "a typo", as a
# warning: kiln config and kiln pack of a GPU config on a CPU-only build go
# on (they open no device; training fails opening it)
if ! "$kiln" plugins 2>/dev/null | grep -q "^cuda "; then
	kiln 0 config "$tmp/dev.ini" "run.plugin_path=$plugdir" run.device=cuda
	stderr_has "[run] device = cuda: this kiln has no cuda device plugin (kiln-cuda.so is not in the plugin path: not built"
fi
# kiln's own device is checked by its file's name, not loaded: kiln config
# of a GPU config runs no CUDA probe (it loaded kiln-cuda.so before
# session 32, the CUDA runtime's start on a GPU node)
if [ -e "$top_builddir/plugins/.libs/kiln-cuda.so" ]; then
	LD_DEBUG=files "$kiln" config "$tmp/dev.ini" "run.plugin_path=$plugdir" run.device=cuda > "$tmp/ld.out" 2>&1 ||
		fail "kiln config with run.device=cuda: exit $?"
	grep -q "file=.*kiln-cuda\.so .*dynamically loaded" "$tmp/ld.out" &&
		fail "kiln config with run.device=cuda loaded kiln-cuda.so (ran its probe)"
	grep -q "file=.*kiln-[a-z]*\.so .*dynamically loaded" "$tmp/ld.out" ||
		fail "LD_DEBUG=files shows no plugin loaded by kiln config (its source's): the check above would prove nothing"
fi

# values train or predict would refuse, refused by kiln config too with their
# place (said OK before session 31; train even ran with infer_block = x)
for kv in "data.workers=autoo:'workers' = 'autoo' is not an integer or one of auto" \
	"train.recompute=-1:'recompute' = -1 is out of range [1, 1024]" \
	"run.infer_block=x:'infer_block' = 'x' is not an integer or one of auto" \
	"data.size=8x8:'size' = '8x8' is not H W or N (pixels, 1 to 65536)" \
	"train.milestones=6000, 3000:'milestones' = '6000, 3000' is not in order (each step count at least the one before)" \
	"train.milestones=,,,:'milestones' = ',,,' has a comma with no number before or after it" \
	"train.milestones=3000,:'milestones' = '3000,' has a comma with no number before or after it" \
	"train.milestones=99999999999999999999:'milestones' = '99999999999999999999' holds a number out of range"; do
	kiln 2 config "$cfgdir/cli.ini" "run.plugin_path=$plugdir" "${kv%%:*}"
	stderr_has "command line '${kv%%:*}': in [${kv%%.*}]: ${kv#*:}"
done
kiln 0 config "$tmp/l.ini" "run.plugin_path=$plugdir" data.workers=auto train.recompute=none run.infer_block=0 \
	"data.size=8 9" "train.milestones=3000, 6000" "train.milestones=3000, 3000"

# a pair key with an empty number (before session 34 "1," was (1, 0) and
# ",1" (0, 1), and kiln config said OK): refused, naming the key
conv="layer.c1.type=conv layer.c1.out=4 layer.c1.kernel=3"
for kv in "padding=1,:number 2" "padding=,1:number 1" "padding=1,,2:number 2" "stride=2,:number 2"; do
	kiln 2 config "$tmp/l.ini" "run.plugin_path=$plugdir" $conv "layer.c1.${kv%%:*}"
	v=${kv%%:*}
	stderr_has "command line 'layer.c1.$v': in [layer.c1]: '${v%%=*}' = '${v#*=}': ${kv#*:} is empty (expected integers separated by commas)"
done
kiln 0 config "$tmp/l.ini" "run.plugin_path=$plugdir" $conv "layer.c1.padding=1, 2"

# options that would be ignored: refused (before session 31 the last of a
# value option given twice won, and these combinations did nothing)
c="$cfgdir/cli.ini"
kiln 2 predict "$c" --checkpoint a.kiln --checkpoint=b.kiln --eval-set
stderr_has "kiln: error: --checkpoint given twice: give it once"
kiln 2 generate "$c" --prompt a --tokens 2 --tokens=3
stderr_has "kiln: error: --tokens given twice: give it once"
# (--prompt may be given several times since session 45: a prompt each,
# tests/generate.sh)
kiln 2 export "$c" --safetensors a.st --safetensors b.st
stderr_has "kiln: error: --safetensors given twice: give it once"
kiln 2 pack "$c" --out "$tmp/p2" --split a --split=b
stderr_has "--split given twice: give it once"
kiln 2 pack --format tokens "$c" --out "$tmp/p3" --out "$tmp/p4"
stderr_has "--out given twice: give it once"
# a value that spells an option is a value, not the option again (the
# first check rescanned argv: "--checkpoint given twice")
kiln 2 generate "$c" --prompt --checkpoint --checkpoint "$tmp/none.kiln"
stderr_has "kiln: error: --prompt TEXT (or --prompts FILE) and --tokens N are required"
! grep -q "given twice" "$err" || fail "a value spelling an option was taken for the option: $(cat "$err")"
kiln 2 export "$c" --format gpt2 --onnx "$tmp/m.onnx"
stderr_has "kiln: error: --format names the tensors of --safetensors FILE: --onnx ignores it"
kiln 2 predict "$c" --logits "$tmp/l.npy" --format csv --eval-set
stderr_has "kiln: error: --logits writes the logits and prints nothing: --format and --top-k have no effect with it"
kiln 2 predict "$c" --logits "$tmp/l.npy" --top-k=2 --eval-set
stderr_has "--format and --top-k have no effect with it"
[ ! -e "$tmp/m.onnx" ] && [ ! -e "$tmp/l.npy" ] && [ ! -e "$tmp/p2" ] || fail "a refused command wrote a file"

# a file the user names that is not there: a usage error (exit 2), for
# every command (before session 36 a missing --checkpoint, --vocab or
# [model] init_from was exit 1, a text file of pack --format tokens 3)
lc="$tmp/l.ini run.plugin_path=$plugdir"
for cmd in eval export predict generate; do
	case $cmd in
	export) extra="--onnx $tmp/m.onnx" ;;
	predict) extra=--eval-set ;;
	generate) extra="--prompt a --tokens 1" ;;
	*) extra= ;;
	esac
	kiln 2 $cmd $lc --checkpoint "$tmp/none.kiln" $extra
	stderr_has "kiln: error: checkpoint $tmp/none.kiln: no such file"
done
kiln 2 generate $lc --prompt a --tokens 1 --vocab "$tmp/v.json" --merges "$tmp/m.txt"
stderr_has "kiln: error: --vocab $tmp/v.json: no such file"
kiln 2 train $lc model.init_from="$tmp/none.st" train.batch=2 "run.out_dir=$tmp/initrun"
stderr_has "[model] init_from: $tmp/none.st: no such file"
kiln 2 pack --format tokens --out "$tmp/pt" "$tmp/none.txt"
stderr_has "kiln: error: $tmp/none.txt: no such file"
printf 'abc\n' > "$tmp/t.txt"
kiln 2 pack --format tokens --out "$tmp/pt" "$tmp/t.txt" data.limit=5
stderr_has "kiln: error: data.limit=5: no such file (--format tokens takes no section.key=value overrides"
# a directory where a file is named: a usage error too, before any work
# (before session 50 --checkpoint DIR built the model and opened the data,
# then failed "cannot open: a directory", exit 1; --prompts DIR said
# "cannot be read", exit 1; a text file of pack --format tokens exit 3)
mkdir -p "$tmp/adir/checkpoints"
for cmd in eval export predict generate quantize; do
	case $cmd in
	export) extra="--onnx $tmp/m.onnx" ;;
	predict) extra=--eval-set ;;
	generate) extra="--prompt a --tokens 1" ;;
	quantize) extra="--calibrate 1 --out $tmp/q.st" ;;
	*) extra= ;;
	esac
	kiln 2 $cmd $lc --checkpoint "$tmp/adir/checkpoints" $extra
	stderr_has "kiln: error: checkpoint $tmp/adir/checkpoints: a directory, not a file (name a checkpoint file, such as RUN_DIR/checkpoints/ckpt-<step>.kiln, or leave --checkpoint out"
	! grep -q "^\[" "$err" || fail "$cmd --checkpoint DIR did work before refusing it: $(head -1 "$err")"
done
kiln 2 eval $lc --quantized "$tmp/adir"
stderr_has "kiln: error: --quantized $tmp/adir: a directory, not a file"
kiln 2 generate $lc --prompts "$tmp/adir" --tokens 1
stderr_has "kiln: error: --prompts $tmp/adir: a directory, not a file"
kiln 2 pack --format tokens --out "$tmp/pt" "$tmp/adir"
stderr_has "kiln: error: $tmp/adir: a directory, not a file"
kiln 2 train $lc model.init_from="$tmp/adir" train.batch=2 "run.out_dir=$tmp/initrun"
stderr_has "[model] init_from: $tmp/adir: a directory, not a weights file"
# an empty output name: refused before any work (`--onnx=` built the model,
# then failed ": ONNX export: : cannot write", exit 1)
kiln 2 export $lc --onnx=
stderr_has "kiln: error: --onnx needs a file name"
kiln 2 export $lc --safetensors ""
stderr_has "kiln: error: --safetensors needs a file name"
[ ! -e "$tmp/pt" ] && [ ! -e "$tmp/initrun" ] || fail "a refused command wrote a file"
# --resume with --overwrite, in the words typed (before session 36:
# "command line 'train.overwrite=1'")
kiln 2 train $lc --resume --overwrite "run.out_dir=$tmp/ro"
stderr_has "kiln: error: --resume with --overwrite: --resume continues the run in out_dir, --overwrite deletes it: choose one"
! grep -q "train.overwrite=1" "$err" || fail "--resume --overwrite names an override nobody typed"
# a restart under kiln launch of a run begun with --overwrite: kiln's own
# overrides (train.overwrite=1, then =0) are not the user's repeats (before
# the fix every rank warned "... sets train.overwrite again"); the user's are
export KILN_RESTART=1
kiln 2 train $lc --overwrite train.batch=2 train.batch=3 model.init_from="$tmp/none.st" "run.out_dir=$tmp/rs"
unset KILN_RESTART
stderr_has "[config] warning: command line 'train.batch=3' sets train.batch again, after 'train.batch=2'"
[ "$(grep -c "again, after" "$err")" = 1 ] || fail "a restart warned of kiln's own overrides: $(grep "again, after" "$err")"
# an option of another pack format says which (before session 36:
# "unknown option")
kiln 2 pack "$tmp/l.ini" --out "$tmp/pf" --val-fraction 0.1
stderr_has "kiln: error: --val-fraction goes only with --format tokens"
kiln 2 pack --format tokens "$tmp/t.txt" --out "$tmp/pf" --store=png
stderr_has "kiln: error: --store goes only with --format records or folder (it packs a CONFIG's data)"
kiln 2 pack --format tokens "$tmp/t.txt" --out "$tmp/pf" --bogus
stderr_has "unknown option '--bogus'"
# an argument with '=' that is no section.key=value is an INPUT (a file
# name), not an override (before session 36 `imgs/y=1.png` was taken for one:
# "no INPUT" or "expected section.key=value")
kiln 2 predict $lc "$tmp/imgs/y=1.png"
stderr_has "kiln: error: $tmp/imgs/y=1.png: no such file or folder (taken for a file name: an override is section.key=value)"
kiln 2 predict $lc lr=0.1
stderr_has "kiln: error: lr=0.1: no such file or folder (taken for a file name"

# kiln launch takes --opt=value as the other commands do (refused before
# session 31), and an option once
kiln 0 launch --nproc=2 --bind=none --grace=5 -- true
stderr_has "ranks 0..1 of 2"
stderr_has "ranks not bound (--bind none)"
kiln 0 launch -n=1 -- true
stderr_has "ranks 0..0 of 1"
kiln 2 launch -n 2 --nproc=3 -- true
stderr_has "kiln: error: --nproc given twice: give it once"
# -n within reason, refused before any fork (before session 36 -n 100000
# was accepted and forked until fork failed)
kiln 2 launch -n 100000 -- true
stderr_has "kiln launch: error: -n 100000: more ranks than this machine takes (at most "
stderr_has "set KILN_LAUNCH_MAX_NPROC=100000 to start them anyway"
KILN_LAUNCH_MAX_NPROC=1
export KILN_LAUNCH_MAX_NPROC
kiln 2 launch -n 2 -- true
stderr_has "kiln launch: error: -n 2: more ranks than this machine takes (at most 1: KILN_LAUNCH_MAX_NPROC)"
KILN_LAUNCH_MAX_NPROC=x
kiln 2 launch -n 2 -- true
stderr_has "KILN_LAUNCH_MAX_NPROC='x': expected a positive integer"
unset KILN_LAUNCH_MAX_NPROC
# a rank command `kiln` off PATH is this kiln (docs/distributed.md's
# `kiln launch ... -- kiln train` from a build tree: exit 127 "cannot run
# 'kiln'" before session 33)
if [ ! -e /usr/bin/kiln ] && [ ! -e /bin/kiln ]; then
	save_path=$PATH
	PATH=/usr/bin:/bin
	kiln 0 launch -n 2 -- kiln --version
	PATH=$save_path
	[ "$(grep -c 'plugin ABI' "$out")" = 2 ] || fail "two ranks of 'kiln --version': $(cat "$out")"
	stderr_has "kiln launch: no 'kiln' on PATH: the ranks run this kiln, /"
	# a `kiln` on PATH that cannot run (its interpreter missing) is that
	# error, not this kiln in its place (session 33's fallback took ENOENT
	# from it for "no kiln")
	mkdir -p "$tmp/badbin"
	printf '#!/nonexistent/interpreter\n' > "$tmp/badbin/kiln"
	chmod +x "$tmp/badbin/kiln"
	PATH=$tmp/badbin:/usr/bin:/bin
	kiln 127 launch -n 1 -- kiln --version
	PATH=$save_path
	stderr_has "kiln launch: error: cannot run 'kiln': No such file or directory"
	! grep -q 'plugin ABI' "$out" || fail "a broken 'kiln' on PATH ran this kiln instead"
	! grep -q "no 'kiln' on PATH" "$err" || fail "a 'kiln' on PATH was taken for none"
fi

# ---- kiln plugins -------------------------------------------------------------
kiln 0 plugins
stdout_has "search path:"
stdout_matches "^  /"
stdout_has "KIND"
# every device's traits; `device = auto` opens the best available by score
stdout_matches "^cpu +cpu +10 +mpi or gloo$"
stdout_matches "^device = auto opens: (cpu|cuda)$"
# the CPU device names the ISA oneDNN dispatches to (KILN_PROC_DESCRIBE)
stdout_matches "^device cpu: oneDNN [0-9]+\.[0-9]+\.[0-9]+, ISA [a-z0-9_]+, bf16 "
# $KILN_PLUGIN_PATH is searched and listed
KILN_PLUGIN_PATH="$tmp/envdir"
export KILN_PLUGIN_PATH
kiln 0 plugins
unset KILN_PLUGIN_PATH
stdout_has "  $tmp/envdir"
# an entry that is a file, or not there, says so (listed like a directory
# before session 36)
printf x > "$tmp/afile"
KILN_PLUGIN_PATH="$tmp/afile:$tmp/nodir:$plugdir"
export KILN_PLUGIN_PATH
kiln 0 plugins
unset KILN_PLUGIN_PATH
stdout_has "  $tmp/afile (not a directory: name the directory that holds the plugins)"
stdout_has "  $tmp/nodir (does not exist)"
grep -qx "  $plugdir" "$out" || fail "a directory of the path has a note"

kiln 0 plugins --path "$plugdir"
stdout_has "search path:"
stdout_has "  $plugdir"
stdout_has "$plugdir/kiln-tgood.so: 3 plugin(s)"
stdout_has "$plugdir/kiln-tbadabi.so: NOT LOADED: "
stdout_has "ABI 3.0, this kiln is ABI 2.32"
stdout_has "$plugdir/kiln-tnewer.so: NOT LOADED: plugin 'tnewer' was built for ABI 2.33, newer than this kiln's ABI 2.32"
stdout_has "$plugdir/kiln-tnosym.so: NOT LOADED: "
stdout_has "no exported symbol kiln_plugin_init"
stdout_has "$plugdir/kiln-tdlfail.so: NOT LOADED: "
stdout_has "undefined symbol"
stdout_has "$plugdir/kiln-tnull.so: NOT LOADED: "
stdout_has "tnull: refusing to initialise (test)"
stdout_matches "^optim +tgood +2\.[0-9]+ +available "
stdout_matches "^source +tsrc +2\.[0-9]+ +available "
stdout_matches "^source +tprobe +2\.[0-9]+ +unavailable: no test accelerator on this machine \(tprobe\)"
# (nothing on stderr: before session 43, on a CPU OpenBLAS does not know,
# the CPU device's opening said at INFO which kernels kiln had it take,
# now a debug line: plugins/cpu/openblas.c, tests/openblas_core.sh)
[ ! -s "$err" ] || fail "stderr not empty: $(head -3 "$err")"

kiln 2 plugins --bogus
stderr_has "kiln: error: unknown option '--bogus' (kiln plugins takes --path)"
stderr_has "usage: kiln plugins"
# arguments a command does not take, in its own words (before session 34:
# "(overrides look like train.lr=0.1)" to a command that takes none, "unknown
# option" for a known one in the wrong place or a flag given a value, "is
# not an integer" for one past 64 bits)
kiln 2 plugins train.lr=5
stderr_has "kiln: error: unexpected argument 'train.lr=5': kiln plugins takes no section.key=value overrides"
kiln 2 report "$tmp" train.lr=5
stderr_has "kiln: error: unexpected argument 'train.lr=5': kiln report takes no section.key=value overrides"
kiln 2 report "$tmp" -x
stderr_has "kiln: error: unknown option '-x' (kiln report takes -o)"
kiln 2 config --doc extra
stderr_has "kiln: error: kiln config --doc takes no other argument ('extra')"
kiln 2 summary --batch 2 "$cfgdir/cli.ini"
stderr_has "kiln: error: option '--batch' before FILE: kiln summary takes FILE first (usage below)"
kiln 2 eval "$cfgdir/cli.ini" --fold=1
stderr_has "kiln: error: --fold takes no value ('--fold=1')"
kiln 2 memory "$cfgdir/cli.ini" --x
stderr_has "kiln: error: unknown option '--x' (kiln memory takes no options)"
kiln 2 config "$cfgdir/cli.ini" "run.plugin_path=$plugdir" train.max_steps=9223372036854775808
stderr_has "'max_steps' = 9223372036854775808 is out of range [0, 1e+15]"
kiln 2 plugins --path
stderr_has "kiln: error: --path needs a value"

# ---- every command's options (cli_opt, cli_opt_int, cli_bad_arg in cli/kiln.c) ----
c="$cfgdir/cli.ini"
# needs_value ARGS... FLAG: FLAG last, without its value
needs_value() {
	kiln 2 "$@"
	eval "flag=\${$#}"
	stderr_has "kiln: error: $flag needs a value"
}
for f in --prompt --tokens --checkpoint --vocab --merges --temperature --top-k --seed; do
	needs_value generate "$c" $f
done
needs_value generate "$c" --prompt a --tokens
needs_value summary "$c" --batch
needs_value report "$tmp" -o
needs_value plugins --path
for f in --checkpoint --quantized; do needs_value eval "$c" $f; done
for f in --checkpoint --calibrate --out --method --percentile; do needs_value quantize "$c" $f; done
for f in --checkpoint --logits --format --quantized --top-k --batch; do needs_value predict "$c" $f; done
for f in --safetensors --onnx --checkpoint --quantized --format; do needs_value export "$c" $f; done
needs_value bench data "$c" --batches
for f in --nproc --runs --max --bench-dir --tools; do needs_value bench comm $f; done
# not_int ARGS... FLAG VALUE: an integer option with a value that is not
# a whole integer in its range, refused naming both
not_int() {
	kiln 2 "$@"
	eval "flag=\${$(($# - 1))} v=\${$#}"
	stderr_has "kiln: error: $flag '$v': expected an integer in ["
}
not_int generate "$c" --prompt a --tokens 5.5
stderr_has "--tokens '5.5': expected an integer in [0, 1000000000]"
not_int generate "$c" --prompt a --tokens 99999999999
not_int generate "$c" --prompt a --tokens 3 --top-k 2x
not_int generate "$c" --prompt a --tokens 3 --seed -1
not_int summary "$c" --batch 1.5
not_int summary "$c" --batch 0
not_int quantize "$c" --out "$tmp/q" --calibrate 1.5
not_int predict "$c" x.png --top-k 0
not_int predict "$c" x.png --batch 1e3
not_int bench data "$c" --batches 3.0
not_int bench comm --nproc 2.5
not_int bench comm --runs x
not_int bench comm --max 1000
# an unknown option: the error line (since session 34 with the options the
# command takes), then the command's usage
unknown() {
	kiln 2 "$@"
	case "$(head -n 1 "$err")" in
	"kiln: error: unknown option '--bogus' (kiln $1 takes "*) ;;
	"kiln: error: unknown option '--bogus'") [ "$1" = bench ] || fail "no options listed: $(head -n 1 "$err")" ;;
	*) fail "the first line of stderr is '$(head -n 1 "$err")'" ;;
	esac
	stderr_has "usage: kiln $1"
}
for cmd in config train eval memory quantize summary generate predict export; do
	unknown $cmd --bogus # where FILE goes
done
for cmd in config train eval memory quantize summary generate predict export; do
	unknown $cmd "$c" --bogus
done
unknown report "$tmp" --bogus
unknown plugins --bogus
unknown bench data "$c" --bogus
unknown bench data --bogus
unknown bench comm --bogus
# --name=VALUE is the same option as --name VALUE
kiln 2 generate "$c" --prompt=a --tokens=2.5
stderr_has "kiln: error: --tokens '2.5': expected an integer in [0, 1000000000]"
kiln 2 generate "$c" --prompt=a --tokens=
stderr_has "kiln: error: --tokens '': expected an integer in [0, 1000000000]"

# ---- the probe's answers kept between runs (core/probe_cache.c) -----------------
# finding source tsrc (kiln-tgood.so, not named after it) probes the files;
# each load of kiln-tgood.so appends "init" to $TGOOD_INIT_LOG
pdir="$tmp/probe plugins"
mkdir -p "$pdir"
cp "$plugdir/kiln-tgood.so" "$plugdir/kiln-tnull.so" "$pdir/"
KILN_PROBE_CACHE="$tmp/probe_cache" TGOOD_INIT_LOG="$tmp/inits"
export KILN_PROBE_CACHE TGOOD_INIT_LOG
inits() { if [ -f "$TGOOD_INIT_LOG" ]; then wc -l < "$TGOOD_INIT_LOG" | tr -d ' '; else echo 0; fi; }
probe_run() { # probe_run LOADS: a lookup of tsrc loads kiln-tgood.so LOADS times
	before=$(inits)
	kiln 0 config "$tmp/l.ini" "run.plugin_path=$pdir" data.source=tsrc
	stdout_has "source = tsrc"
	[ $(($(inits) - before)) -eq "$1" ] || fail "kiln-tgood.so loaded $(($(inits) - before)) times, expected $1"
}
probe_run 2 # a probe child and this process
grep -qF "$pdir/kiln-tgood.so	5:tgood 4:tsrc 4:tprobe" "$KILN_PROBE_CACHE" || fail "the probe cache lacks kiln-tgood.so's answer"
grep -qF "kiln-tnull.so" "$KILN_PROBE_CACHE" && fail "the probe cache keeps a file that failed to load"
probe_run 1 # the kept answer: no probe child loads it
kiln 0 plugins --path "$pdir" # a file that fails to load still says so
stdout_has "$pdir/kiln-tnull.so: NOT LOADED: "
stdout_has "tnull: refusing to initialise (test)"
touch -d '2001-01-01' "$pdir/kiln-tgood.so"
probe_run 2 # the file changed (mtime): probed again
probe_run 1
printf 'kiln-probe garbage\n\001\002 %s\t4:tsrc\n' "$pdir/kiln-tgood.so" > "$KILN_PROBE_CACHE"
probe_run 2 # an unreadable cache is ignored and rewritten
probe_run 1
rm -f "$KILN_PROBE_CACHE"
KILN_PROBE_CACHE=none
probe_run 2
probe_run 2
[ ! -e "$tmp/probe_cache" ] || fail "KILN_PROBE_CACHE=none wrote a cache file"
unset KILN_PROBE_CACHE TGOOD_INIT_LOG

echo "PASS: $checks kiln runs"
exit 0
