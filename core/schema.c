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
	  "Device plugin that computes (kiln-<device>.so): `cpu`." },
	{ "seed", KILN_KEY_INT, "0", 0, 4294967295.0, NULL,
	  "Seed of every random draw (init, shuffle, dropout)." },
	{ "threads", KILN_KEY_INT, "0", 0, 1024, NULL,
	  "Compute threads of the CPU device; 0 = all cores." },
	{ "plugin_path", KILN_KEY_STR, "", NOLIM, NULL,
	  "Colon-separated directories searched for plugins before $KILN_PLUGIN_PATH, the build tree and the install directory." },
	{ "out_dir", KILN_KEY_STR, "runs/latest", NOLIM, NULL,
	  "Directory for metrics.jsonl and checkpoints/ (created if missing)." },
	{ NULL, 0, NULL, NOLIM, NULL, NULL }
};

static const struct kiln_key data_keys[] = {
	{ "source", KILN_KEY_STR, "idx", NOLIM, NULL,
	  "Data source plugin: `idx` (MNIST-format files), `records` (kiln's packed shards, from `kiln pack`), `folder` (ImageFolder of JPEG/PNG), `tar` (WebDataset shards), `lmdb`, `synthetic`; its own keys are listed under its name below." },
	{ "limit", KILN_KEY_INT, "0", 0, 1e15, NULL,
	  "Use only the first N samples of the source; 0 = all." },
	{ "workers", KILN_KEY_STR, "1", NOLIM, NULL,
	  "Loader threads that assemble batches ahead of the step (into page-locked staging buffers): a count 0..256 (0 reads on the training thread) or `auto` (a short probe of 1, 2, 4, ... workers picks the fastest; logged). Results are identical for any count." },
	{ "prefetch", KILN_KEY_INT, "2", 1, 256, NULL,
	  "Batches the workers keep ready beyond the ones they are filling (staging buffers: workers + prefetch)." },
	{ "shuffle", KILN_KEY_BOOL, "1", NOLIM, NULL,
	  "Reshuffle every epoch with a permutation drawn from (seed, epoch). Ignored for evaluation." },
	{ "resident", KILN_KEY_BOOL, "0", NOLIM, NULL,
	  "Benchmark mode: copy the first training batch to the device once and train every step on it, so a run measures the step with no data loading (the reference for the loader's overhead; see docs/PERFORMANCE.md)." },
	{ "on_error", KILN_KEY_ENUM, "fail", NOLIM, "fail|skip",
	  "A bad sample (corrupt record, truncated file, undecodable image, label out of range): `fail` stops the run (exit 3) naming the file, sample and reason; `skip` replaces it by another sample drawn from (seed, epoch, index), the same on every rank, and counts and reports the skips." },
	{ "cache", KILN_KEY_ENUM, "none", NOLIM, "none|ram|mmap",
	  "`ram` keeps each decoded image after its first read (before the random transforms), so later epochs skip reading and decoding; `mmap` states that packed files (source = records, which always maps them) are shared through the page cache by every worker and process." },
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
	{ "transform_on", KILN_KEY_ENUM, "host", NOLIM, "host|device",
	  "Where the normalisation runs: `host` (loader workers hand f32 samples to the step) or `device` (workers hand u8 pixels, a quarter of the bytes, and the device normalises)." },
	{ NULL, 0, NULL, NOLIM, NULL, NULL }
};

static const struct kiln_key model_keys[] = {
	{ "layout", KILN_KEY_ENUM, "nchw", NOLIM, "nchw|nhwc",
	  "Memory layout of 4-d activations: `nchw`, or `nhwc` (channels-last). Results are the same up to float rounding." },
	{ NULL, 0, NULL, NOLIM, NULL, NULL }
};

static const struct kiln_key train_keys[] = {
	{ "epochs", KILN_KEY_INT, "10", 0, 1e9, NULL, "Passes over the training data." },
	{ "batch", KILN_KEY_INT, "128", 1, 1e9, NULL, "Samples per step (per rank)." },
	{ "eval_batch", KILN_KEY_INT, "0", 0, 1e9, NULL,
	  "Samples per evaluation step; 0 = same as `batch`. The last partial batch is evaluated too." },
	{ "max_steps", KILN_KEY_INT, "0", 0, 1e15, NULL,
	  "Stop after this many steps in total; 0 = no limit." },
	{ "optimizer", KILN_KEY_ENUM, "sgd", NOLIM, "sgd", "Optimizer." },
	{ "lr", KILN_KEY_FLOAT, "0.01", 0, 1e6, NULL, "Learning rate (the base of the schedule)." },
	{ "schedule", KILN_KEY_ENUM, "constant", NOLIM, "constant|cosine",
	  "Learning-rate schedule over the run's steps: `constant`, or `cosine` annealing to `lr_min` (PyTorch's CosineAnnealingLR). Computed on the device from its step counter." },
	{ "lr_min", KILN_KEY_FLOAT, "0", 0, 1e6, NULL, "Final learning rate of the cosine schedule." },
	{ "warmup", KILN_KEY_INT, "0", 0, 1e12, NULL,
	  "Steps of linear warmup from lr/warmup to lr before the schedule." },
	{ "momentum", KILN_KEY_FLOAT, "0.9", 0, 1, NULL, "SGD momentum." },
	{ "nesterov", KILN_KEY_BOOL, "0", NOLIM, NULL, "Nesterov momentum." },
	{ "weight_decay", KILN_KEY_FLOAT, "0", 0, 1, NULL,
	  "L2 penalty added to the gradient (PyTorch SGD `weight_decay`)." },
	{ "log_every", KILN_KEY_INT, "100", 1, 1e9, NULL,
	  "Steps between reads of the device-side metric sums (the only host syncs of a step)." },
	{ "eval", KILN_KEY_BOOL, "1", NOLIM, NULL, "Evaluate on [data.eval] after every epoch." },
	{ "checkpoint_every", KILN_KEY_INT, "0", 0, 1e15, NULL,
	  "Write a checkpoint (out_dir/checkpoints/ckpt-<step>.kiln: the whole training state) every N steps and after the last step; 0 = off. See docs/checkpoints.md." },
	{ "keep_last", KILN_KEY_INT, "3", 0, 1e9, NULL,
	  "Checkpoints kept: after each successful write all but the newest N are deleted; 0 = keep all." },
	{ "resume", KILN_KEY_BOOL, "0", NOLIM, NULL,
	  "Continue from the newest usable checkpoint in out_dir/checkpoints (`kiln train --resume`); a fresh start when there is none. Only the keys listed in docs/checkpoints.md may differ from the checkpoint's config." },
	{ NULL, 0, NULL, NOLIM, NULL, NULL }
};

static const struct kiln_key dist_keys[] = {
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
	{ "inplace", KILN_KEY_BOOL, "0", NOLIM, NULL,
	  "1 allows the layer to overwrite its input; the planner decides whether it does (it does not yet: the memory issue adds in-place planning)." },
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
	{ "model", model_keys, "Model-wide settings; layers follow in [layer.NAME] sections." },
	{ "train", train_keys, "The training loop." },
	{ "dist", dist_keys, "Data-parallel settings (none yet)." },
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
