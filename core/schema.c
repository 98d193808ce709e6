/* core/schema.c - the keys of the fixed config sections.
 *
 * Every key kiln reads from [run], [data], [data.eval], [model], [train] and
 * [dist] is one row here; docs/config.md is generated from these tables
 * (`kiln config --doc`) and a test keeps the two equal.
 */
#include "internal.h"

#define NOLIM 0, 0

static const struct kiln_key run_keys[] = {
	{ "device", KILN_KEY_STR, "cpu", NOLIM, NULL,
	  "Device plugin that computes (kiln-<device>.so): `cpu`, `cuda` (an NVIDIA GPU; see docs/gpu.md), or `auto`: the available device with the highest auto score (a GPU before the CPU; `kiln plugins` lists the scores; the choice is logged). Checked with the config (`kiln config` too): a name no device plugin has is an error at its line (exit 2) suggesting the nearest; kiln's own `cpu` and `cuda` are checked by their file's name without loading it (so kiln config and kiln pack of a GPU config start no CUDA runtime), and where this build lacks it that is a warning (kiln pack and kiln config open no device), and so fails, saying why, where the device opens, as does a plugin that exists but cannot run here (no GPU)." },
	{ "precision", KILN_KEY_ENUM, "fp32", NOLIM, "fp32|bf16|fp16|fp16_static",
	  "Precision policy (the amp plugin; docs/precision.md): `fp32`; `bf16` (bf16 compute, f32 master weights); `fp16` (f16 compute with dynamic loss scaling, parameters under [plugin.amp]); `fp16_static` (constant `[plugin.amp] loss_scale`). The loss scale and the overflow flag live in device memory; overflowing steps are skipped and counted." },
	{ "seed", KILN_KEY_INT, "0", 0, 4294967295.0, NULL,
	  "Seed of every random draw (init, shuffle, dropout)." },
	{ "threads", KILN_KEY_INT, "0", 0, 1024, NULL,
	  "Compute threads of the CPU device; 0 = one per CPU this process may run on (its affinity mask: all cores, or the share `kiln launch` and mpirun pin each rank to, or what taskset and cpusets allow), within its cgroup's CPU quota (rounded to the nearest CPU), and fewer while other processes keep its threads waiting for a CPU (the team adapts every ~100 ms: docs/PERFORMANCE.md, steady under contention; results stay bit-identical: kiln's own loops sum in a fixed order for any team, and a oneDNN kernel takes the smaller team only where a probe showed the same bytes, so only the starting team matters; an f32 or bf16 convolution's weight gradient on 2 or more threads runs in fixed blocks of the minibatch, the largest divisor of the batch up to 8 (a batch with none: min(8, batch/2) blocks of unequal size), each on one thread and summed in block order, so it too follows the team: plugins/cpu/convsplit.c). With the environment variable KILN_CPU_GEMM_SPLIT=auto (experimental, off by default: it cost 37% of the quiet MLP step), a large GEMM (16 MFLOP or more) on 2 or more threads is split into parts of whole columns or rows that the threads take one at a time, each on one thread, and a part a descheduled thread holds too long the calling thread runs itself (docs/PERFORMANCE.md, a late thread does not stall the team). A count set here is used as it is and never adapted; the CPU device says so once at info level when such a team's threads keep waiting for a CPU (where an adaptive team would have shrunk)." },
	{ "deterministic", KILN_KEY_BOOL, "0", NOLIM, NULL,
	  "Bit-identical runs for a given seed, thread count and config. On the CPU every kernel kiln runs is reproducible for a fixed thread count (reductions sum in a fixed order); what can still differ between two runs is a choice between kernels made by timing them, which round differently: the `[plugin.cpu]` keys set to `auto` (`conv_impl`, which the inference API and `kiln predict` set to `auto` unless the config chooses, so their logits can differ in the last bits between runs; `conv_algo`, `gemm_impl`, `bf16_gemm`, `bf16_conv`, ...; each key says which fixed choice this turns `auto` into). This turns them into fixed choices and insists that `threads` be set (0 = all cores would tie the result to the machine); devices with non-deterministic algorithms (atomics, autotuning) are told to avoid them." },
	{ "autotune", KILN_KEY_BOOL, "1", NOLIM, NULL,
	  "Time every engine a convolution can use, once per shape when the model is built, and keep the fastest (PyTorch's cudnn.benchmark). The CUDA device does it within `[plugin.cuda] workspace_mb` and caches the choice in `[plugin.cuda] autotune_cache`, so the next run skips the timing; with `deterministic = 1` only deterministic engines are candidates. On by default (the cache makes it a one-time cost per shape; 0 takes the library's heuristic choice). The CPU device's timed choices are its own keys, not this one: `[plugin.cpu] bf16_conv`, `bf16_gemm` and `conv_impl`, kept between runs in `[plugin.cpu] tune_cache`." },
	{ "plugin_path", KILN_KEY_STR, "", NOLIM, NULL,
	  "Colon-separated directories searched for plugins before $KILN_PLUGIN_PATH, the build tree and the install directory. Taken from the command line (`run.plugin_path=DIR`); in a config file it is ignored with a warning unless the environment has KILN_ALLOW_CONFIG_PLUGIN_PATH=1 (a config must not run its sender's code: docs/plugins.md)." },
	{ "memory_limit", KILN_KEY_STR, "", NOLIM, NULL,
	  "Device memory `[train] batch = auto` may plan for: a decimal number of bytes, optionally followed by K, M, G or T (powers of 1024; `KiB`, `MB`... read the same), e.g. `2G` or `1.5GiB`, whitespace around it ignored; anything else (hex, an exponent, a sign, a space inside) is a config error, whatever the batch, and so is less than 1 MiB (`1.5` is one byte: a unit left out). Empty = what the device reports free when the run starts (the CPU: MemAvailable, within its memory cgroup's limit and RLIMIT_AS; there the host staging and library memory count too). On the CPU under RLIMIT_AS (`ulimit -v`) the address space bounds the choice too, set or empty: the device total, host staging, library and the stacks of the run's threads must fit what the limit leaves, and a memory_limit larger than that is warned of (docs/memory.md, \"Under ulimit -v\"). Set, it also makes generation (`kiln generate`, kiln_generator_open) free a prompt's prefill plan, a second copy of the caches, after each prompt instead of holding it for the next prompt of its run length (docs/generate.md)." },
	{ "out_dir", KILN_KEY_STR, "runs/latest", NOLIM, NULL,
	  "Directory for metrics.jsonl, checkpoints/, and profile.txt and trace.json when profiling (created if missing). Empty (`run.out_dir=`): nothing is written, no checkpoint either, and `kiln train` warns so at its start unless `[train] checkpoint_last = 0` (docs/logging.md)." },
	{ "profile", KILN_KEY_BOOL, "0", NOLIM, NULL,
	  "Profile training (`kiln train --profile` sets it): every device op and copy of a step is timed, and at the end a table of self time per (layer, op, pass) over the steps after the first is printed and written to out_dir/profile.txt, with a Chrome trace in out_dir/trace.json. Each op is synchronised, so the device runs serialised: the times are self times and overlap is lost. See docs/profiler.md." },
	{ "comm", KILN_KEY_ENUM, "auto", NOLIM, "auto|none|gloo|mpi|nccl",
	  "Communicator of a data-parallel run (docs/distributed.md): `gloo` (TCP, CPU training, works anywhere), `mpi` (Open MPI; under mpirun/srun), `nccl` (CUDA devices); `auto`: none for one process, else nccl on cuda, mpi when started by Open MPI's mpirun, gloo otherwise. Rank and world size come from the environment (`kiln launch`, torchrun, Slurm, Open MPI)." },
	{ "profile_steps", KILN_KEY_INT, "20", 0, 1e9, NULL,
	  "Steps the profile's trace covers (the first N, warm-up included), keeping trace.json small; 0 = no trace. The table counts every step after the first." },
	{ "fuse", KILN_KEY_BOOL, "auto", NOLIM, "auto",
	  "Fuse an activation into the layer before it when that layer alone feeds it: linear, conv or batchnorm followed by `relu` runs as one op with the ReLU as its epilogue (oneDNN post-ops on the CPU, cuBLASLt epilogues on CUDA) and the ReLU's backward folded into the layer's backward (its mask from the fused output, the bias gradient in the same pass; a conv whose ReLU feeds a `maxpool` alone leaves the mask to the pooling, which takes it from its own, smaller output (a quarter with 2x2 windows): the same numbers); linear followed by `gelu` is fused in evaluation. The activation layer becomes a view (`kiln memory` marks it `(view)`, the profile shows no ReLU op; `kiln summary` lists the layers unfused, as PyTorch has them). Same numbers as `fuse = 0` up to float rounding (ReLU: bit for bit on the CPU, except in an NCHW model whose first conv of one channel runs NHWC when fused, its ReLU read by a maxpool alone, and by kiln's first-layer kernel on AVX-512, whose NHWC and NCHW weight gradients sum in other orders; GELU: not, in f32 and bf16 alike, oneDNN's epilogue computing it otherwise than kiln's GELU op). `auto` (the default): on for a device of type cpu (kiln's CPU device, whose oneDNN epilogues the tests check; measured neutral to faster: docs/PERFORMANCE.md), off on a GPU (CUDA's cuBLASLt GEMM epilogues pass the device conformance suite on an H200, and the GEMM-heavy MLP's step ran 4.3% faster fused with the same loss bit for bit, but a CNN with `fuse = 1` has not run on CUDA yet: docs/gpu.md); 0 or 1 applies on every device." },
	{ "infer_block", KILN_KEY_INT, "auto", 0, 1e9, "auto",
	  "Batch blocking for cache in the inference API (`kiln predict`, `kiln_infer`, on a device that computes in host memory: the CPU): a batch of the inference plan runs as blocks of this many rows, so that one layer's output is still in the cache when the next reads it. `auto`: when the plan's activations of a batch exceed twice the L2 cache of a core (1 MiB here) times the threads and the model's weights are no larger than a block's activations, the largest power of two of rows whose activations fit (the ResNet example: 8 rows a thread; the MLP and CNN, whose weights are larger, keep the whole batch); the choice is logged. `0`: off (runs of the API's batch); N: blocks of N rows (at most the batch). Same numbers up to float rounding (a convolution's kernel may differ with the rows). Training and `kiln eval` are not affected: docs/inference.md." },
	{ "devices", KILN_KEY_STR, "", NOLIM, NULL,
	  "Pipeline stages on devices of their own in this process (docs/pipeline.md): one `device:ordinal` per stage in stage order, e.g. `cpu:0, cpu:1`, all of `[run] device`'s plugin. Each stage's layers are prepared and run on its own instance, with its share of `[run] threads` (or of the CPUs the process may use when 0): T/P threads each (rounded down), the first T mod P stages one more, at least 1 each; the optimizer stays on `[run] device` with all of them. On the CPU the instances share host memory and their streams run on worker threads (`[plugin.cpu] async = auto`, the default, turns them on), so the stages run at the same time; the tensors crossing stages are copied on a copy stream ordered by events. Empty: every stage on `[run] device`. With `[dist] pipeline` (a stage a rank) not used: each rank runs its stage on `[run] device` with all its threads, and rank 0 warns. CPU only for now (a GPU would need each stage's parameters and arenas in its own device's memory)." },
	{ "bind_stages", KILN_KEY_ENUM, "none", NOLIM, "auto|always|none",
	  "With `[run] devices` on the CPU: pin each stage's stream workers (and the OpenMP team each starts, which inherits the mask) to CPUs of its own, as `kiln launch --bind core` pins each rank: `cpu:K` takes the K-th group of its thread share of the CPUs this process may run on (its affinity mask, in order), and only when every stage's team fits, stages x threads each at most the CPUs of the mask and of the cgroup's CPU quota (rounded as `[run] threads` is). `always`: whenever they fit. `auto`: when they fit and the machine is not full as the stages open (the rule that sets GOMP_SPINCOUNT: the 1-minute load average and the runnable threads at least the mask's CPUs), since a pinned stage cannot move to a core another process left free (under a load of 13-18 on 2 cores pinning cost 15-40% of the pipeline's samples/s). `none` (the default): never; the workers run anywhere in the process's mask. The default is `none` because the quiet window of session 13 showed no clear gain from pinning (M = 8 even, M = 16 within the runs' spread) while a busy loop on one core made pinned stages 4-17% slower. The training thread and the loader's workers are never pinned. Pinned, the two stages' passes no longer queue behind each other on one core (docs/pipeline.md, \"Stage threads on CPUs of their own\"; docs/PERFORMANCE.md, \"Session 13: pipeline pass variation\")." },
	{ NULL, 0, NULL, NOLIM, NULL, NULL }
};

static const struct kiln_key data_keys[] = {
	{ "source", KILN_KEY_STR, "idx", NOLIM, NULL,
	  "Data source plugin: `idx` (MNIST-format files), `records` (kiln's packed shards, from `kiln pack`), `folder` (ImageFolder of JPEG/PNG), `tar` (WebDataset shards), `lmdb`, `synthetic`, `tokens` (token shards in llm.c's format, from `kiln pack --format tokens`), `seq2seq` (digit-string tasks kiln makes itself: docs/rnn.md); its own keys are listed under its name below." },
	{ "limit", KILN_KEY_INT, "0", 0, 1e15, NULL,
	  "Use only the first N samples of the source; 0 = all (so does an N above the source's count, logged)." },
	{ "workers", KILN_KEY_INT, "1", 0, 256, "auto",
	  "Loader threads that assemble batches ahead of the step (into page-locked staging buffers): a count 0..256 (0 reads on the training thread) or `auto` (a short probe of 1, 2, 4, ... workers, up to the CPUs this process may run on (its affinity mask: `taskset`, `kiln launch --bind`), picks the fastest; logged). Results are identical for any count. On the CPU device with every CPU given to compute (`[run] threads = 0`, or as many), once batches 4..20 showed a fill costs at most 10% of the time between two batches and never blocks (data in memory), the training thread fills the batches itself and the workers sleep: same bytes, no wake-up preempting a compute thread each step (docs/data.md, \"Workers\"); not where the CPU's streams are async (a data-parallel rank, a `[run] devices` pipeline, `[plugin.cpu] async = 1`), whose training thread only enqueues: the workers fill every batch there." },
	{ "prefetch", KILN_KEY_INT, "2", 1, 256, NULL,
	  "Batches the workers keep ready beyond the ones they are filling (staging buffers: workers + prefetch)." },
	{ "shuffle", KILN_KEY_BOOL, "1", NOLIM, NULL,
	  "Reshuffle every epoch with a permutation drawn from (seed, epoch). Ignored for evaluation." },
	{ "resident", KILN_KEY_BOOL, "0", NOLIM, NULL,
	  "Benchmark mode: copy the first training batch to the device once and train every step on it, so a run measures the step with no data loading (the reference for the loader's overhead; see docs/PERFORMANCE.md)." },
	{ "on_error", KILN_KEY_ENUM, "fail", NOLIM, "fail|skip",
	  "A bad sample (corrupt record, truncated file, undecodable image, label out of range): `fail` stops the run (exit 3) naming the file, sample and reason; `skip` replaces it by another sample drawn from (seed, epoch, index), the same on every rank, and counts and reports the skips." },
	{ "max_image_pixels", KILN_KEY_INT, "89478485", 1, 268435456, NULL,
	  "PIL's `Image.MAX_IMAGE_PIXELS`, whose default this is, with PIL's rule (a decompression bomb guard): an encoded image (JPEG, PNG) whose header declares more pixels (width x height) is decoded with a warning (the first such image of a process only: PIL's DecompressionBombWarning), and one of more than twice this many (178,956,970 by default: PIL's DecompressionBombError) is refused before it is decoded, as a bad sample. At most 2^28, and no image of more than 2^28 pixels is decoded." },
	{ "cache", KILN_KEY_ENUM, "none", NOLIM, "none|ram|mmap",
	  "`ram` keeps each decoded image after its first read (before the random transforms), so later epochs skip reading and decoding (host memory: every image and a malloc chunk of overhead once the first epoch is done, which `kiln memory` reports on a line of its own, docs/memory.md); `mmap` states that the source's files are shared through the page cache by every worker and process: valid for sources that declare it (records, tokens), records maps its shards (one truncated in place under a run kills the run with SIGBUS: docs/data.md); tokens keeps its shards open and reads each window with one pread() (since session 38: a shard truncated under a run is an error naming the shard and the sample, exit 3)." },
	/* image transforms (core/transform.c), in the order they apply */
	{ "resize", KILN_KEY_INT, "0", 0, 65536, NULL,
	  "Resize the shorter side to this many pixels first, the longer side to int(resize * long / short) (torchvision `Resize(int)`, PIL's antialiased bilinear filter); 0 = no resize." },
	{ "size", KILN_KEY_STR, NULL, NOLIM, NULL,
	  "Output size `H W`, or `N` for N x N. Unset: the source's image size (after `resize`); required when the source's images vary in size." },
	{ "crop", KILN_KEY_ENUM, "none", NOLIM, "none|center|random|resized",
	  "How the output is cut from the image: `none` resizes the whole image to `size` when it differs; `center` is torchvision `CenterCrop` (zero fill when the image is smaller); `random` is `RandomCrop` with `pad`; `resized` is `RandomResizedCrop` with `scale` and `ratio`. For evaluation ([data.eval]) `random` and `resized` become `center`." },
	{ "pad", KILN_KEY_INT, "0", 0, 65536, NULL,
	  "Zero padding added to every side before a `random` crop (torchvision `RandomCrop(padding=pad)`)." },
	{ "scale", KILN_KEY_STR, "0.08 1.0", NOLIM, NULL,
	  "`lo hi`: range of the area fraction a `resized` crop takes (0 < lo <= hi <= 1)." },
	{ "ratio", KILN_KEY_STR, "0.75 1.3333333333", NOLIM, NULL,
	  "`lo hi`: range of the width/height ratio of a `resized` crop, drawn log-uniformly (0 < lo <= hi)." },
	{ "channels", KILN_KEY_INT, "0", 0, 3, NULL,
	  "Output channels: 0 = as the source, 1 (RGB to gray by PIL's ITU-R 601-2 luma) or 3 (gray copied to RGB)." },
	{ "flip", KILN_KEY_BOOL, "0", NOLIM, NULL,
	  "Random horizontal flip with probability 0.5 (torchvision `RandomHorizontalFlip`). Ignored for evaluation." },
	{ "mean", KILN_KEY_STR, "0", NOLIM, NULL,
	  "Normalisation x = (u8/255 - mean) / std (`ToTensor` + `Normalize`): one value for every channel or one per output channel (`0.485 0.456 0.406`)." },
	{ "std", KILN_KEY_STR, "1", NOLIM, NULL,
	  "Normalisation divisor (> 0): one value or one per output channel; see `mean`." },
	{ "dtype", KILN_KEY_ENUM, "f32", NOLIM, "f32|bf16",
	  "The samples' element type between the workers and the device: `f32`, or `bf16` (the transforms' f32 rounded to nearest even: half the copy traffic, widened to f32 on the device by one op; `kiln predict` and the inference API round their f32 samples to the same values). With `transform_on = device` the workers ship u8 instead." },
	{ "transform_on", KILN_KEY_ENUM, "host", NOLIM, "host|device",
	  "Where the normalisation runs: `host` (loader workers hand f32 samples to the step) or `device` (workers hand u8 pixels, a quarter of the bytes, and the device normalises). Both compute torchvision's rule in f32, (u/255 - mean) / std, so the samples are bit-equal either way." },
	{ NULL, 0, NULL, NOLIM, NULL, NULL }
};

static const struct kiln_key model_keys[] = {
	{ "layout", KILN_KEY_ENUM, "auto", NOLIM, "auto|nchw|nhwc",
	  "Memory layout of 4-d activations: `nchw`, `nhwc` (channels-last), or `auto`: the layout the device says its convolutions and pooling run fastest in (the CPU: `nhwc`, where oneDNN has direct kernels and `nchw` needs a reorder to a blocked layout around every convolution; CUDA: `nchw`; docs/PERFORMANCE.md, \"Layout, fusion and the defaults, measured\"). Results are the same up to float rounding; weights are stored alike (PyTorch's OIHW) in every layout." },
	{ "init_from", KILN_KEY_STR, "", NOLIM, NULL,
	  "A safetensors file whose tensors replace the initial parameters and batchnorm buffers by name (`conv1.weight`: the layer's name and the parameter, PyTorch's names and layouts; see docs/safetensors.md), e.g. a PyTorch state_dict or a `kiln export`; or a kiln checkpoint (`ckpt-<step>.kiln`, told apart by its magic bytes): its parameters and buffers alone, for fine-tuning with a new optimizer, schedule or lr (the optimizer state, step counts and data position start anew; the model's parameters must be the checkpoint's, whatever `init_strict`); empty = none. The `[layer.*]` sections an export records or a checkpoint was trained with are compared with this config's: a key that differs is a warning naming it, never an error. Read before the initialisation from [run] seed, which draws only the tensors the file does not give (each keeps the values it would have had), by `kiln train` and by `kiln export` when it exports initial weights (a checkpoint's weights replace it: `kiln export --checkpoint` and `kiln eval` never read it) A file that is not there is a config error at this key's line (exit 2, before any work: `config.ini:12: [model] init_from: /x/y: no such file`; exit 1 before session 36); one that cannot be read exits 1, one that is not a weights file 3." },
	{ "init_format", KILN_KEY_ENUM, "pytorch", NOLIM, "pytorch|gpt2",
	  "The names and layouts of a safetensors `init_from`: `pytorch`, the layers' names and PyTorch's layouts (nn.Linear [out, in]); `gpt2`, the GPT-2 release's as Hugging Face's GPT2LMHeadModel saves them: the same names (the `transformer.` prefix may be absent, as in GPT2Model files), the weights of the linear layers named `c_attn`, `c_proj`, `c_fc` (GPT-2's Conv1D) stored [in, out], the attention mask buffers `*.attn.bias` and `*.attn.masked_bias` skipped, and an embedding table that may have fewer rows than the model's (GPT-2's 50257 into a vocabulary padded to 50304: the extra rows become 0). llm.c's model file (`gpt2_124M.bin`, versions 1, 3 and 5) is told apart by its magic number and needs no `init_format`. See docs/safetensors.md." },
	{ "stages", KILN_KEY_STR, "", NOLIM, NULL,
	  "Pipeline stages by layer-name boundaries (docs/pipeline.md): `first, last | first, last | ...`, stage k running layers `first` to `last` of the k-th group in file order (one name: a one-layer stage; never the layers between: `flat, r1, fc2 | loss` is refused, naming stage 0 and its 3 names); the groups must tile every layer, and a `|` with no stage before or after it (leading, doubled or trailing) is refused. Instead of `[layer.X] stage`; empty = one stage (unless layers set `stage`). `auto` (or `auto:P`): kiln cuts the layers, in file order, into P stages (`[dist] pipeline`, else one per `[run] devices` entry; `auto:P` names it) so that the busiest stage's estimated cost is least: each layer's forward FLOPs a sample, as `kiln summary` counts them, once for the forward, once more for its input's gradient when a layer before it has trainable parameters, once more for its own parameters' gradient, plus 1; never a cut between a layer and the ReLU `[run] fuse` makes its epilogue; every rank computes the same cut from the same counts, and the log names it with each stage's share (docs/pipeline.md, \"Balanced stages\"). The cost also counts the bytes each pass moves (its inputs, output and parameters), at `stages_flops_per_byte` FLOPs a byte, so that memory-bound layers (a layernorm, a relu, an add) weigh by their time; measured stages may still differ by a few percent." },
	{ "stages_flops_per_byte", KILN_KEY_FLOAT, "11", 0, 1e6, NULL,
	  "`stages = auto`'s cost of one byte moved, in FLOPs: each layer costs its passes' FLOPs plus this times the bytes they move (the forward its inputs, output and parameters; the input's gradient 2 x inputs, output and parameters; the parameters' gradient inputs, output and 2 x parameters; the parameters' and buffers' bytes over a micro-batch's rows, [train] batch / [pipeline] micro_batches). A constant, the same on every rank (no timing): this machine's GEMM FLOP rate over the memory-bound layers' byte rate (`sh bench/stage_bytes.sh 5`, session 20: 80 GFLOP/s over 7.2 GB/s, 1 thread, AVX2; docs/pipeline.md, \"Balanced stages\"). 0: FLOPs alone (session 18's cut)." },
	{ "init_strict", KILN_KEY_BOOL, "1", NOLIM, NULL,
	  "1: every parameter and buffer of the model must be in `init_from`, and the file may hold nothing else but `*.num_batches_tracked` (like PyTorch's load_state_dict(strict=True)); the error names the first missing and unexpected tensors. 0: load the tensors whose names match, keep the initial values of the rest and log what was skipped. A shape that differs is an error either way." },
	{ NULL, 0, NULL, NOLIM, NULL, NULL }
};

static const struct kiln_key train_keys[] = {
	{ "epochs", KILN_KEY_INT, "10", 0, 1e9, NULL, "Passes over the training data. 0 runs no step (`kiln train` warns so; nothing is trained, evaluated or checkpointed)." },
	{ "batch", KILN_KEY_INT, "128", 1, 1e9, "auto",
	  "Samples per step (per rank), or `auto`: the largest multiple of 8 and of `[pipeline] micro_batches` (their least common multiple: 24 for 3; at most the training set) whose predicted memory (`kiln memory`: parameters, gradients, optimizer state, activations, workspace, evaluation and inputs) fits in [run] memory_limit; the choice and its prediction are logged, and `lr_scale` applies to it." },
	{ "eval_batch", KILN_KEY_INT, "0", 0, 1e9, NULL,
	  "Samples per evaluation step; 0 = same as `batch`. The last partial batch is evaluated too; the loss and accuracy are one sum over the set divided by its samples (or tokens not ignored), the same for any eval_batch (docs/training.md, \"Losses and metrics\"). With data-parallel ranks each rank evaluates its share of the set's batches (contiguous runs, every sample once, no padding) and the shares' sums are added, so every rank has the whole set's numbers, a 1-rank evaluation's up to f32 rounding (docs/distributed.md, item 8)." },
	{ "recompute", KILN_KEY_INT, "none", 1, 1024, "none|auto", /* KILN_MAX_LAYERS segments */
	  "Gradient checkpointing: `none`; `N`, the layers split into N segments of about equal activation bytes, and every output read only inside its own segment (all but the last) freed after the forward and recomputed during the backward; `auto`, N = the square root of the layer count. Less activation memory for one more forward's work; gradients, running statistics and dropout masks are the same bit for bit. `kiln memory` shows the effect." },
	{ "accumulate", KILN_KEY_INT, "1", 1, 65536, NULL,
	  "Gradient accumulation: one optimizer step per N micro-batches of `batch` (the first writes the gradients, the others add theirs; each micro-batch's loss gradient is seeded with 1/N, times the fp16 loss scale, as PyTorch's `scaler.scale(loss / N).backward()`), so the step sees batch x N samples; steps, `max_steps` and the schedule count optimizer steps. An epoch takes whole steps: the micro-batches after its last full step are left out, every epoch (drop_last for the whole step; logged at the start). Lightning 2.x's accumulate_grad_batches instead steps on the epoch's last batch with the accumulation incomplete (each batch's loss still divided by N): port with a training set that is a multiple of batch x N, or expect one step fewer per epoch. Dropout draws the masks of one batch of batch x N (each sample by its row in the step's global batch)." },
	{ "max_steps", KILN_KEY_INT, "0", 0, 1e15, NULL,
	  "Stop after this many steps in total; 0 = no limit." },
	{ "optimizer", KILN_KEY_STR, "sgd", NOLIM, NULL,
	  "The optimizer, by name: `sgd` (`momentum`, `nesterov`, `weight_decay`, `weight_decay_mode`), `adam` (torch.optim.Adam: `beta1`, `beta2`, `eps`, and `weight_decay` added to the gradient before the moments, L2 as Adam's), `adamw` (torch.optim.AdamW: the same keys, decoupled `weight_decay`), `lamb` (LAMB, You et al. 2019: AdamW's update scaled per parameter tensor by the trust ratio norm(p) / norm(update)), or an optim plugin's (`kiln plugins`; docs/plugins.md). Each built-in is one fused device op over every trainable parameter per step. The selected optimizer adds its own keys to [train]: they are listed under `[train] optimizer = NAME` below (the keys of the other built-in optimizers stay valid and unused, so a config may keep `momentum` beside `optimizer = adamw`)." },
	{ "lr", KILN_KEY_FLOAT, "0.01", 0, 1e6, NULL, "Learning rate (the base of the schedule)." },
	{ "schedule", KILN_KEY_ENUM, "constant", NOLIM, "constant|cosine|step|multistep|onecycle|exponential|linear|polynomial|plateau",
	  "Learning-rate schedule over the run's optimizer steps, after `warmup`: `constant`; `cosine` annealing to `lr_min` (CosineAnnealingLR); `step` (StepLR: times `gamma` every `step_size` steps); `multistep` (MultiStepLR: times `gamma` at each of `milestones`); `onecycle` (OneCycleLR with max_lr = lr, `pct_start`, `div_factor`, `final_div_factor`, `three_phase`, `anneal_strategy`; the rate alone: momentum and Adam's beta1 are not cycled, as OneCycleLR(cycle_momentum=False)); `exponential` (ExponentialLR: times `gamma` every step); `linear` (LinearLR: lr x `start_factor` moving linearly to lr x `end_factor` over `total_iters` steps, then constant); `polynomial` (PolynomialLR: lr x (1 - min(t, `total_iters`) / `total_iters`)^`power`, 0 from step `total_iters` on); `plateau` (ReduceLROnPlateau(mode = 'min') on the loss of each evaluation point: times `plateau_factor` when it has not improved by `plateau_threshold` for more than `plateau_patience` evaluations; needs `eval = 1`; its state is in every checkpoint). Computed on the device from its step counter (`plateau`: from the rate the host sets at an evaluation that cuts it). Every schedule counts optimizer steps, as a Lightning scheduler with `\"interval\": \"step\"`; Lightning's default interval is `epoch`: to port an epoch-stepped StepLR or MultiStepLR, multiply `step_size` or `milestones` by the steps per epoch (the S of the log's `epoch E step k/S` lines; floor(samples / (batch x accumulate x ranks))). An epoch-stepped CosineAnnealingLR's staircase has no equivalent (kiln's cosine moves every step)." },
	{ "step_size", KILN_KEY_INT, "1000", 1, 1e15, NULL,
	  "`schedule = step`: optimizer steps (after the warmup) between decays by `gamma`: StepLR's step_size; from an epoch-stepped StepLR, step_size x steps per epoch." },
	{ "gamma", KILN_KEY_FLOAT, "0.1", 0, 1, NULL,
	  "`step`, `multistep` and `exponential` schedules: the decay factor (`exponential`: every optimizer step, ExponentialLR's gamma; from an epoch-stepped ExponentialLR, gamma^(1 / steps per epoch) decays as much per epoch, smoothly)." },
	{ "milestones", KILN_KEY_LIST, "", NOLIM, NULL,
	  "`schedule = multistep`: up to 12 optimizer step counts (after the warmup; from an epoch-stepped MultiStepLR, its milestones x steps per epoch), in order, at which the rate is multiplied by `gamma`, e.g. `3000, 6000`; a step count given twice multiplies by `gamma` twice there, as MultiStepLR. An empty number (`3000,`) or one past 2^63 - 1 is an error." },
	{ "pct_start", KILN_KEY_FLOAT, "0.3", 0, 1, NULL,
	  "`schedule = onecycle`: share of the steps spent rising to `lr`, strictly between 0 and 1 (0 and 1 are config errors with onecycle), and pct_start x (steps after `warmup`) must not be exactly 1 (a rise of no step: OneCycleLR divides by zero; refused when the run counts its steps)." },
	{ "div_factor", KILN_KEY_FLOAT, "25", 1e-12, 1e12, NULL,
	  "`schedule = onecycle`: the first rate is lr / div_factor." },
	{ "final_div_factor", KILN_KEY_FLOAT, "10000", 1e-12, 1e12, NULL,
	  "`schedule = onecycle`: the last rate is lr / div_factor / final_div_factor." },
	{ "three_phase", KILN_KEY_BOOL, "0", NOLIM, NULL,
	  "`schedule = onecycle`: OneCycleLR's three_phase: 1 rises to `lr` over pct_start of the steps, falls back to lr / div_factor over as many, then anneals to the final rate (pct_start above 0.5 makes the second phase end past the run, as in PyTorch); 0 (PyTorch's default) rises, then anneals to the final rate." },
	{ "anneal_strategy", KILN_KEY_ENUM, "cos", NOLIM, "cos|linear",
	  "`schedule = onecycle`: OneCycleLR's anneal_strategy within each phase: `cos` (PyTorch's default) or `linear`." },
	{ "start_factor", KILN_KEY_FLOAT, "0.3333333333333333", 0, 1, NULL,
	  "`schedule = linear`: the first step's rate is lr x start_factor (LinearLR's start_factor, PyTorch's default 1/3), strictly above 0 (0 is a config error with `linear`, as LinearLR refuses it)." },
	{ "end_factor", KILN_KEY_FLOAT, "1", 0, 1, NULL,
	  "`schedule = linear`: the rate from step `total_iters` (after the warmup) on is lr x end_factor (LinearLR's end_factor)." },
	{ "total_iters", KILN_KEY_INT, "5", 1, 1e15, NULL,
	  "`schedule = linear` or `polynomial`: the optimizer steps (after the warmup) over which the rate moves (LinearLR's and PolynomialLR's total_iters; PyTorch's default 5); from an epoch-stepped scheduler, total_iters x steps per epoch." },
	{ "power", KILN_KEY_FLOAT, "1", 0, 1e6, NULL,
	  "`schedule = polynomial`: PolynomialLR's power (1, PyTorch's default: a linear decay to 0)." },
	{ "plateau_factor", KILN_KEY_FLOAT, "0.1", 0, 1, NULL,
	  "`schedule = plateau`: ReduceLROnPlateau's factor: the rate becomes max(rate x factor, `plateau_min_lr`) (a cut of 1e-8 or less, PyTorch's eps, is not made); below 1 (1 is a config error with `plateau`)." },
	{ "plateau_patience", KILN_KEY_INT, "10", 0, 1e9, NULL,
	  "`schedule = plateau`: evaluations without improvement tolerated; the next one without cuts the rate (ReduceLROnPlateau's patience). Evaluations are per epoch, or every `eval_every` steps: from an epoch-stepped ReduceLROnPlateau, the same patience with eval_every = 0." },
	{ "plateau_threshold", KILN_KEY_FLOAT, "1e-4", 0, 1e30, NULL,
	  "`schedule = plateau`: what counts as an improvement on the best loss so far: below best x (1 - threshold) (`plateau_threshold_mode = rel`) or best - threshold (`abs`); ReduceLROnPlateau's threshold." },
	{ "plateau_threshold_mode", KILN_KEY_ENUM, "rel", NOLIM, "rel|abs",
	  "`schedule = plateau`: ReduceLROnPlateau's threshold_mode, `rel` or `abs`." },
	{ "plateau_cooldown", KILN_KEY_INT, "0", 0, 1e9, NULL,
	  "`schedule = plateau`: evaluations after a cut during which no evaluation counts as bad (ReduceLROnPlateau's cooldown)." },
	{ "plateau_min_lr", KILN_KEY_FLOAT, "0", 0, 1e6, NULL,
	  "`schedule = plateau`: the rate is never cut below this (ReduceLROnPlateau's min_lr), as written: `lr_scale` scales `lr` but not this." },
	{ "lr_scale", KILN_KEY_ENUM, "none", NOLIM, "none|linear|sqrt",
	  "Scale `lr` by the global batch (batch x ranks x accumulate) over `base_batch`: `linear` (Goyal et al.) or `sqrt`; `none` keeps `lr` as written. The scaled rate is logged." },
	{ "base_batch", KILN_KEY_INT, "256", 1, 1e12, NULL,
	  "The batch `lr` was tuned for, for `lr_scale`." },
	{ "lr_min", KILN_KEY_FLOAT, "0", 0, 1e6, NULL, "Final learning rate of the cosine schedule (CosineAnnealingLR's eta_min), as written: `lr_scale` scales `lr` but not `lr_min`." },
	{ "warmup", KILN_KEY_INT, "0", 0, 1e12, NULL,
	  "Steps of linear warmup before the schedule: step t = 0 .. warmup - 1 runs at lr x (t + 1) / warmup, then the schedule starts at step `warmup` (over the steps after it): PyTorch's SequentialLR([LinearLR(start_factor = 1/warmup, total_iters = warmup - 1), schedule], milestones = [warmup]). Not the usual LinearLR(total_iters = warmup), nor HF transformers' get_cosine_schedule_with_warmup / get_linear_schedule_with_warmup, whose step t runs at lr x t / warmup (step 0 at rate 0): kiln's warmup rates are theirs one step earlier; after the warmup HF's cosine is kiln's `cosine` with lr_min = 0." },
	{ "weight_decay", KILN_KEY_FLOAT, "0", 0, 1, NULL,
	  "Weight decay. sgd: as `weight_decay_mode` says; adam: L2, `weight_decay * p` added to the gradient before the moments (torch.optim.Adam); adamw: decoupled, `p -= lr * weight_decay * p` before the Adam step; lamb: `weight_decay * p` added to the update before the trust ratio. The default 0 is torch.optim.SGD's and Adam's but not torch.optim.AdamW's (0.01): set 0.01 to port an AdamW(params, lr)." },
	{ "weight_decay_mode", KILN_KEY_ENUM, "l2", NOLIM, "l2|decoupled",
	  "sgd only: `l2` adds `weight_decay * p` to the gradient (PyTorch SGD `weight_decay`); `decoupled` shrinks the weights apart from the gradient, `p -= lr * weight_decay * p` (SGDW). adam always adds it to the gradient (`l2`; `decoupled` is refused: that is `optimizer = adamw`); adamw and lamb always decouple." },
	{ "no_decay", KILN_KEY_LIST, "", NOLIM, NULL,
	  "Parameters that get no weight decay: comma-separated shell patterns (fnmatch) on parameter names such as `fc1.weight`, `bn1.bias`, e.g. `*.bias, bn*`. Empty: every parameter decays." },
	{ "clip_norm", KILN_KEY_FLOAT, "0", 0, 1e30, NULL,
	  "Scale the gradients so their global L2 norm is at most this: by min(1, clip_norm / (norm + 1e-6)), as PyTorch's clip_grad_norm_ (Lightning's gradient_clip_val with the default gradient_clip_algorithm='norm'); 0 = off. As clip_grad_norm_, whose f32 norm is inf when the sum of squares exceeds FLT_MAX (a norm above ~1.8e19, finite gradients), such a step is taken with the gradients multiplied by 0 (docs/training.md)." },
	{ "clip_value", KILN_KEY_FLOAT, "0", 0, 1e30, NULL,
	  "Clamp every gradient to [-clip_value, clip_value] (clip_grad_value_; Lightning's gradient_clip_val with gradient_clip_algorithm='value'); 0 = off. Only a step whose gradient norm is finite is clamped: with `skip_nonfinite = 0` an infinite gradient reaches the optimizer as it is (clip_grad_value_ would clamp it to +-clip_value; docs/training.md)." },
	{ "skip_nonfinite", KILN_KEY_BOOL, "1", NOLIM, NULL,
	  "Skip, on the device, an optimizer step with a NaN or infinite gradient element (parameters, optimizer state and the optimizer's step count untouched, as PyTorch's GradScaler's found_inf skips optimizer.step(); finite gradients whose squares overflow f32 are finite), count it and report it; a log interval in which every step was skipped stops the run as diverged." },
	{ "log_every", KILN_KEY_INT, "100", 1, 1e9, NULL,
	  "Steps between reads of the device-side metric sums (the only host syncs of a step)." },
	{ "eval", KILN_KEY_BOOL, "1", NOLIM, NULL, "Evaluate on [data.eval] (after every epoch, or every `eval_every` steps), on data-parallel ranks each its share of the set (docs/distributed.md, item 8)." },
	{ "eval_every", KILN_KEY_INT, "0", 0, 1e15, NULL,
	  "Evaluate every N optimizer steps (and after the last); 0 = after every epoch. Evaluation plans keep no activations for backward." },
	{ "keep_best", KILN_KEY_INT, "0", 0, 1000, NULL,
	  "Keep checkpoints of the K best evaluations by `best_metric` in out_dir/checkpoints/best (written right after each evaluation that makes the top K; the displaced one is deleted; a resume continues the list, and a run resumes from a best/ file as from any checkpoint: docs/checkpoints.md); needs `[run] out_dir` (a run with an empty one is refused); 0 = off." },
	{ "best_metric", KILN_KEY_ENUM, "acc", NOLIM, "acc|loss",
	  "What `keep_best` ranks by: test accuracy (higher is better) or test loss (lower is better)." },
	{ "early_stop_patience", KILN_KEY_INT, "0", 0, 1e9, NULL,
	  "Stop when `early_stop_metric` has not improved by more than `early_stop_min_delta` for this many evaluations in a row; 0 = never." },
	{ "early_stop_metric", KILN_KEY_ENUM, "acc", NOLIM, "acc|loss",
	  "What early stopping watches: test accuracy (higher is better) or test loss (lower is better)." },
	{ "early_stop_min_delta", KILN_KEY_FLOAT, "0", 0, 1e30, NULL,
	  "The smallest change that counts as an improvement for early stopping." },
	{ "checkpoint_every", KILN_KEY_INT, "0", 0, 1e15, NULL,
	  "Write a checkpoint (out_dir/checkpoints/ckpt-<step>.kiln: the whole training state) every N steps and after the last step; 0 = none on the way (see `checkpoint_last`). See docs/checkpoints.md." },
	{ "checkpoint_last", KILN_KEY_BOOL, "1", NOLIM, NULL,
	  "Write a checkpoint after the run's last step (and after an early stop) even when `checkpoint_every` = 0, so a run always leaves its trained weights (Lightning's `last.ckpt`); `kiln eval` and `kiln export` read the newest by default. 0 = only `checkpoint_every`'s and a stop request's (the run's result then names a checkpoint only when one is of its last step: docs/checkpoints.md). Needs `[run] out_dir`." },
	{ "keep_last", KILN_KEY_INT, "3", 0, 1e9, NULL,
	  "Checkpoints kept: after each successful write all but the newest N at or below its step are deleted (one above it, which a resume skipped as unusable, is left and not counted: docs/checkpoints.md); 0 = keep all." },
	{ "resume", KILN_KEY_BOOL, "0", NOLIM, NULL,
	  "Continue from the newest usable checkpoint in out_dir/checkpoints (`kiln train --resume`); a fresh start when there is none. Only the keys listed in docs/checkpoints.md may differ from the checkpoint's config." },
	{ "overwrite", KILN_KEY_BOOL, "0", NOLIM, NULL,
	  "Start afresh in an out_dir that holds an earlier run (`kiln train --overwrite`): that run's files (metrics.jsonl, train.csv, eval.csv, events.out.tfevents.*, config.ini, profile.txt, trace.json, report.html and every checkpoint in out_dir/checkpoints) are deleted once every check that can refuse the run has passed (logged; a refused run deletes nothing); other files are left alone. Not with `resume` (an error). Without it (or `resume`) a used out_dir is refused and left as it is (Hugging Face's `overwrite_output_dir`), except the default out_dir `runs/latest`, which by its name holds the latest run: a fresh run there replaces the earlier one (logged). Either way a run whose `[model] init_from` is one of the files it would delete (the same file, links followed) is refused, nothing deleted: copy it out of the run directory first (docs/checkpoints.md)." },
	{ NULL, 0, NULL, NOLIM, NULL, NULL }
};

static const struct kiln_key dist_keys[] = {
	{ "bucket_mb", KILN_KEY_FLOAT, "25", 0.001, 65536, NULL,
	  "Size of a gradient bucket in MiB: the trainable gradients are cut, in reverse layer order, into contiguous slices of about this size, and each slice is averaged across the ranks as soon as the backward of its last layer is done, overlapping the rest of the backward (PyTorch DDP's `bucket_cap_mb`)." },
	{ "timeout", KILN_KEY_FLOAT, "300", 0.1, 1e6, NULL,
	  "Seconds any rendezvous or collective may take: a rank that died or hangs makes the others fail with an error naming it after at most this long, never hang. Time in which the whole job stood still (suspended: `scontrol suspend`, SIGSTOP of every process) does not count, except in the waits of Gloo's busy-polling pairs (`[plugin.gloo] busy_poll = 1`) and NCCL's kernels (docs/distributed.md, \"A suspended job\"). Rank 0's also sets how long its store waits for a new connection's token: a quarter of it, 1 to 10 s." },
	{ "overlap", KILN_KEY_BOOL, "1", NOLIM, NULL,
	  "Start each bucket's allreduce (ZeRO-1: reduce-scatter) during backward (with [train] accumulate > 1 the last micro-batch's, where the layers' ops add the gradients; PyTorch's no_sync() for the others), and with zero = 1 run the parameter allgathers on the comm stream overlapped with the next forward, each layer waiting only for its buckets (1); or start every bucket after backward and allgather on the compute stream before the next forward (0: for measuring what the overlap saves)." },
	{ "timing", KILN_KEY_BOOL, "0", NOLIM, NULL,
	  "Measure the overlap without serialising anything: host functions on the streams stamp when backward ends, when each bucket's allreduce runs and when the optimizer can start; each log point's metrics.jsonl gets a `comm` event with the exposed communication (the optimizer's wait after backward) and the allreduce time per step, and the run log a summary; with zero = 1 the log also counts the parameter allgathers that completed after the next forward began." },
	{ "sync_bn", KILN_KEY_BOOL, "0", NOLIM, NULL,
	  "Synchronised batch normalisation (PyTorch's SyncBatchNorm): in training every batchnorm layer takes its per-channel mean and variance over the global batch (the ranks' statistics are allgathered and merged in the forward, the two per-channel sums of its backward are allreduced), and its running statistics are updated from those, so they stay identical on every rank. 0: each rank normalises its own batch (DDP's default). Costs two small collectives per batchnorm layer per step, which wait for the compute stream." },
	{ "zero", KILN_KEY_INT, "0", 0, 3, NULL,
	  "ZeRO stage: 0 = plain data parallelism (every rank holds the whole optimizer state); 1 = ZeRO-1: the optimizer state is sharded across the ranks (each keeps 1/world of it and never holds it whole), gradients are reduce-scattered during backward, each rank updates its shard of the parameters and the shards are allgathered (overlapped with the next forward, see overlap). With `pipeline` = P: within each stage's D ranks, over the stage's slice. Checkpoints hold the whole state (rank 0 writes it a slot at a time, each gathered just before; with `pipeline`, gathered whole first), so they resume on any world size. Not with lamb. Stages 2 and 3 are refused (not implemented)." },
	{ "heartbeat", KILN_KEY_FLOAT, "30", 0, 1e6, NULL,
	  "Seconds a rank may go without a heartbeat: every rank's watchdog thread beats through the store every heartbeat/4 s and reads its peers'; a peer silent this long (stopped, frozen, its host dead or cut off) or a store that does not answer this long (rank 0 or its link) ends the run on every rank with an error naming the rank and its host name, well before `timeout`. A collective that times out first (`timeout` below this) names the peer whose heartbeat has stood still for two beats and 0.5 s, else calls the peer it waited for a suspect. 0 = no watchdog." },
	{ "pipeline", KILN_KEY_INT, "1", 1, 64, NULL,
	  "Pipeline stages on ranks (docs/pipeline.md, \"Stages on ranks\"): the world of P x D ranks runs D copies of a pipeline of P = this many stages (the model's `[layer.X] stage` / `[model] stages`, which must make exactly P), rank r being stage r % P of pipe r / P. Each rank runs its stage's layers only, the crossing tensors moving by the communicator's point-to-point send and recv; each stage's D ranks average its gradients (DDP over the stage's slice, its buckets started during the stage's last micro-batch's backward; nothing when D = 1), and each rank's optimizer steps, and holds the state of, its stage's parameters alone (with `zero = 1`: half, a third ... of them, ZeRO-1 within the stage's D ranks); the sampler shards over the D pipes only, and `[train] batch` is a pipe's batch (global batch: batch x D). With kiln-mpi, `[plugin.mpi] thread_level = multiple`. 1: every stage in one process (and all ranks data-parallel)." },
	{ NULL, 0, NULL, NOLIM, NULL, NULL }
};

/* The loggers besides metrics.jsonl (core/logger.h, docs/logging.md). */
static const struct kiln_key log_keys[] = {
	{ "tensorboard", KILN_KEY_BOOL, "0", NOLIM, NULL,
	  "Write TensorBoard event files (out_dir/events.out.tfevents.*; `tensorboard --logdir` on out_dir or a directory above it): every number of metrics.jsonl's train and eval lines as a scalar tagged `train/loss`, `train/lr`, `val/acc`, ... at its step. Rank 0 only; needs `[run] out_dir` (a run with an empty one is refused)." },
	{ "csv", KILN_KEY_BOOL, "0", NOLIM, NULL,
	  "Write the train lines to out_dir/train.csv and the evaluations to out_dir/eval.csv, each with a header naming its columns as metrics.jsonl names the fields. Rank 0 only; needs `[run] out_dir` (a run with an empty one is refused)." },
	{ "histograms", KILN_KEY_INT, "0", 0, 1e15, NULL,
	  "With `tensorboard = 1`: every N optimizer steps, a histogram of each parameter tensor (`weights/NAME`) and of each trainable one's gradient (`grads/NAME`); 0 = none. Each costs a host copy of the parameters and gradients at that step." },
	{ NULL, 0, NULL, NOLIM, NULL, NULL }
};

static const struct kiln_key pipeline_keys[] = {
	{ "micro_batches", KILN_KEY_INT, "1", 1, 65536, NULL,
	  "Micro-batches per step (docs/pipeline.md): `[train] batch` is cut into this many, which flow through the stages in `schedule`'s order; the gradients are the mean over them (as `[train] accumulate` of batch / micro_batches), with no communication before the last. Batchnorm uses each micro-batch's statistics and updates its running statistics once per micro-batch (PyTorch's semantics with micro-batches); dropout draws one batch's masks whatever the micro-batches. Must divide `[train] batch`. With `[train] accumulate = A` each optimizer step runs A pipeline steps, as `accumulate = A M` of batch/M (docs/pipeline.md, Combinations)." },
	{ "schedule", KILN_KEY_ENUM, "1f1b", NOLIM, "gpipe|1f1b",
	  "Order of the micro-batches' forwards and backwards on each stage: `gpipe` (all forwards, then all backwards: every micro-batch's activations alive at once) or `1f1b` (one forward, one backward: at most `stages` micro-batches' activations alive). Both give the same gradients bit for bit (each stage accumulates its micro-batches in the same order)." },
	{ "early_forwards", KILN_KEY_INT, "0", 0, 64, NULL,
	  "`schedule = 1f1b`: forwards each stage but the last runs beyond 1f1b's warm-up (docs/pipeline.md, \"Early forwards\"): stage s runs min(P - 1 - s + N, M) forwards before its first backward, so that the next stage's input of each micro-batch is ready a pass earlier and a hand-off's latency hides behind a pass instead of stalling the busiest stage. The order of each stage's micro-batches, and so the gradients, are 1f1b's bit for bit; each extra forward keeps one more micro-batch's activations alive (min(P + N, M) activation sets). 0: plain 1f1b." },
	{ "sendrecv", KILN_KEY_BOOL, "auto", NOLIM, "auto",
	  "Stages on ranks (`[dist] pipeline`): 1 (or on) sends a stage's crossing tensor and receives the one from the same stage right after it (1f1b's steady state: the activation forward, the gradient back) as one operation, the communicator's `sendrecv` (comm ops version 7; on kiln-nccl one NCCL group, as NCCL asks of point-to-point calls that must progress together; docs/pipeline.md, \"A send and the recv after it paired\"). 0 (or off): each on its own (a send on the transport's send stream or at once, the recv on the stage's stream). `auto` (the default): paired on `mpi` and `nccl`, not on `gloo` (by the communicator plugin's name; the choice is logged): on kiln-mpi pairing measured 1.19-1.68x the samples/s quietly and 1.3-1.5x under load, on kiln-gloo even quietly and 3-5x slower under load, on its shared-memory channels and on TCP alike (docs/PERFORMANCE.md, \"Session 13: pipeline sendrecv\"); since session 21 a pair on the CPU wakes the send stream's thread as an unpaired send does, which keeps paired passes on their cores under load: paired gloo is then level with unpaired, not faster, and stays off by default (docs/pipeline.md; docs/PERFORMANCE.md, \"Session 21: pipeline hand-offs on Zen 4\"). No effect in one process (its stages hand over in memory)." },
	{ "defer_wgrad", KILN_KEY_BOOL, "auto", NOLIM, "auto",
	  "Stages in one process (`[run] devices`): each stage's backward of a micro-batch computes its inputs' gradients (what the stage before waits for) first and sends them, and defers its `linear` layers' weight and bias gradients, which it runs one micro-batch at a time, in micro-batch order, while it waits for a peer's activation or gradient, at the latest P - 1 - s backwards later on stage s, and the rest before the optimizer (docs/pipeline.md, \"Deferred weight gradients\"). Parameters bit for bit those without it. 1 (or on): where the pipeline can (not on ranks, with data parallelism's hooks, tied weights, fp16 loss scaling or no layer to defer: a warning); the deferred passes read the plans' own buffers, kept alive for them: no copies, and one more activation set per stage of lag (2 stages, 1f1b: 3 instead of 2; `kiln memory`). 0 (or off): never. `auto` (the default): where the pipeline can, off until 2 readings in a row (every 4 steps) find the process's threads waited for a CPU more than 0.25 s a second, on until 2 in a row at most 0.25 (logged; meant for other processes on its CPUs, where the split measured +14-69% in session 49; what a quiet machine reads is not measured yet); it copies each deferred layer's input, output gradient (and output, with a fused ReLU) for each of min(M, P - s) micro-batches on stage s into records made when it first turns on, as its plans are made before it knows (docs/PERFORMANCE.md, \"Session 50: deferred weight gradients without copies, and auto\"). Both: a workspace per stage." },
	{ "zero_copy", KILN_KEY_BOOL, "1", NOLIM, NULL,
	  "Stages on ranks of one node on the CPU (`[dist] pipeline` with a communicator that maps memory for every rank, comm ops `map_shared`: kiln-gloo with `shm` on, kiln-mpi with its shared memory): each crossing tensor's activation and gradient live in memory both stages' ranks map, written by one stage's layers and read in place by the other's, so a hand-off is a message of 8 bytes that says the buffer is written, not a copy into the channel and another out of it (docs/pipeline.md, \"Hand-offs in place\"). In one process (stages on one CPU device or on `[run] devices` of their own) the producer writes each crossing tensor straight into the next stage's receive buffer, and its gradient comes back the same way: no copy. A tensor that is the data, or is sent to two stages, or whose gradient is not returned (a frozen stage 0) or adds into another, still goes as a message (a copy). 1 (the default): where the communicator (or the process) can; 0: every tensor as a message. Gradients the same bit for bit either way." },
	{ NULL, 0, NULL, NOLIM, NULL, NULL }
};

/* Keys every [layer.NAME] section has, whatever its type. */
const struct kiln_key kiln_layer_common_keys[] = {
	{ "type", KILN_KEY_STR, NULL, NOLIM, NULL,
	  "Layer type (required): one of the types listed below." },
	{ "input", KILN_KEY_STR, NULL, NOLIM, NULL,
	  "Name of the layer feeding this one; default: the previous layer (the data for the first)." },
	{ "inputs", KILN_KEY_LIST, NULL, NOLIM, NULL,
	  "Comma-separated input layers, for layers with several inputs." },
	{ "trainable", KILN_KEY_BOOL, "1", NOLIM, NULL,
	  "0 freezes the layer: no weight gradients are computed or stored." },
	{ "inplace", KILN_KEY_BOOL, "1", NOLIM, NULL,
	  "1 lets the planner give the layer's output an input's memory when the layer type allows it (relu; add, on either of its first two inputs) and nothing reads that input afterwards, forward or backward, a loss layer's backward write the logits' gradient over the logits when nothing reads them after it, and the gradients of an add's inputs (and a pos_embedding's) share its output's gradient instead of copies of it (when no later write into one comes before a read of the other); 0 forbids it. Results are the same either way." },
	{ "tie", KILN_KEY_STR, NULL, NOLIM, NULL,
	  "Weight tying: the name of another layer whose `weight` this layer's `weight` is (GPT's `[layer.lm_head] tie = transformer.wte`, PyTorch's shared nn.Parameter). Both must have a parameter `weight` of the same shape and the same `trainable`; only `weight` is tied. The tensor is stored, initialised (as that layer's), decayed, checkpointed and counted once, under that layer's name (`transformer.wte.weight`); both layers' gradients are summed into its gradient (the later layer's is added after the earlier layer's backward, from a gradient buffer of its own, which `kiln memory` counts). Safetensors exports write it once, under that name; imports read it from that name, or from this layer's (`lm_head.weight`) when only that is present, and accept a file with both only when they are equal (docs/safetensors.md). A layer cannot be tied to itself or to a layer that is itself tied (tie every user to the same layer instead)." },
	{ "stage", KILN_KEY_INT, NULL, 0, 63, NULL,
	  "Pipeline stage of this layer (docs/pipeline.md); default: the previous layer's stage (0 for the first). Stages follow the file order (each next stage one more); every tensor read on a later stage than its producer's (a skip connection too) is sent to it, and its gradient sent back. `[model] stages` is the other way to say it." },
	{ "recompute", KILN_KEY_BOOL, "0", NOLIM, NULL,
	  "1: gradient checkpointing for this layer alone: its output (and what its forward keeps for the backward) is freed after the forward and computed again just before the backward needs it, whatever [train] recompute says. Gradients are the same bit for bit. Where nothing can be freed (a loss, a view, an output sent to a later pipeline stage, a layer that keeps nothing and whose output no backward reads) a warning says so." },
	{ NULL, 0, NULL, NOLIM, NULL, NULL }
};

static const struct {
	const char *name;
	const struct kiln_key *keys;
	const char *doc;
} fixed[] = {
	{ "run", run_keys, "What runs where." },
	{ "data", data_keys, "Training data." },
	{ "data.eval", data_keys, "Evaluation data (default: the same source, test split)." },
	{ "data.val", data_keys, "Validation data, only when the section is present (inherits from [data] like [data.eval], split `val`): the evaluations during training (every epoch or `eval_every` steps), early stopping and `keep_best` use it, and [data.eval] is evaluated once at the end." },
	{ "model", model_keys, "Model-wide settings; layers follow in [layer.NAME] sections." },
	{ "train", train_keys, "The training loop." },
	{ "dist", dist_keys, "Data-parallel training across processes (docs/distributed.md): started by `kiln launch`, torchrun, srun or mpirun." },
	{ "log", log_keys, "Loggers besides out_dir/metrics.jsonl (docs/logging.md)." },
	{ "pipeline", pipeline_keys, "Pipeline parallelism (docs/pipeline.md): micro-batches and their schedule through the stages `[layer.X] stage` or `[model] stages` place." },
};

const struct kiln_key *kiln_config_schema(const char *section)
{
	for (size_t i = 0; i < KILN_ARRAY_LEN(fixed); i++)
		if (!strcmp(fixed[i].name, section))
			return fixed[i].keys;
	return NULL;
}

int kiln_schema_fixed_count(void) { return (int)KILN_ARRAY_LEN(fixed); }

const char *kiln_schema_fixed_name(int i, const char **doc)
{
	if (i < 0 || i >= (int)KILN_ARRAY_LEN(fixed))
		return NULL;
	if (doc)
		*doc = fixed[i].doc;
	return fixed[i].name;
}

const char *kiln_config_fixed_section(int i, const char **doc)
{
	return kiln_schema_fixed_name(i, doc);
}

const struct kiln_key *kiln_config_layer_keys(void) { return kiln_layer_common_keys; }

const char *kiln_version(void) { return PACKAGE_VERSION; }
