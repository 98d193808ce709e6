/* core/weights.h - the weight files kiln reads and writes besides its
 * checkpoints (docs/safetensors.md): safetensors in kiln's names and
 * PyTorch's layouts, in the GPT-2 release's layouts (core/weights_gpt2.c),
 * and llm.c's model file (core/weights_gpt2.c), all loaded by one loader
 * (core/weights.c) from a list of tensors.
 */
#ifndef KILN_WEIGHTS_H
#define KILN_WEIGHTS_H

#include "graph.h"

/* How a file's tensors map onto the model's parameters. */
enum {
	/* GPT-2's names: "h.0.ln_1.weight" is also "transformer.h.0.ln_1.weight",
	 * the attention layers' causal-mask buffers ("*.attn.bias",
	 * "*.attn.masked_bias") are skipped, and an embedding table may have
	 * fewer rows than the model's (a padded vocabulary: the rest are 0) */
	KILN_WF_GPT2_NAMES = 1,
	/* the weight of a linear layer named c_attn, c_proj, c_fc or q_attn is
	 * [in, out] in the file (GPT-2's Conv1D), [out, in] in kiln */
	KILN_WF_CONV1D = 2,
};

/* The tensors of one file, whatever its format: their names, dtypes and
 * shapes in t (data unused), their bytes read from the file as they are
 * loaded (pread: a file cut short meanwhile is an error naming the
 * tensor, not SIGBUS; before session 39 safetensors were read through a
 * mapping). */
struct kiln_weights_in {
	const char *path;
	int n;
	struct kiln_safetensors_tensor *t;
	int flags; /* KILN_WF_* */
	/* t[j].bytes bytes of tensor j into dst: KILN_OK, or the status and
	 * message of a read that failed, came short or found the file
	 * changed since it was opened (kiln_read_at's) */
	kiln_status (*read)(const struct kiln_weights_in *in, int j, void *dst);
	const void *ctx; /* the reader's: the open file */
};

/* Load `in` into m's parameters and buffers: kiln_model_load_safetensors's
 * rules (strict, shapes, dtypes), with in->flags' name and layout maps. */
kiln_status kiln_weights_load(struct kiln_model *m, const struct kiln_weights_in *in, int strict,
			      void *stream);

/* What the file open on fd is (KILN_WEIGHTS_IS_*, graph.h), by its first
 * bytes. */
int kiln_weights_kind_fd(int fd);
/* *out for the file open on fd (borrowed), named path: its stat and its
 * kind now.  KILN_OK, or KILN_EIO when fstat() fails. */
kiln_status kiln_weights_open_fd(int fd, const char *path, struct kiln_weights_file *out);
/* The weights of w into m, as [model] init_format and init_strict say:
 * [model] init_from's file (named 0), or the trained weights a command
 * names (named 1: --checkpoint F, core/trained.c kiln_given_load).  A
 * checkpoint gives its weights alone.  A safetensors file that records
 * the [layer.*] sections it was exported from (kiln export since session
 * 41, metadata kiln.layers), and a checkpoint (its config's, since
 * session 42), is compared with m's once its tensors loaded (a shape's
 * error first): a key that differs is a warning, named or not, never an
 * error (docs/safetensors.md, "The model a file was exported from").  A
 * safetensors file's CRC32Cs (kiln.crc32c) are checked as its tensors
 * are read, those this rank loads alone (since session 42).
 * *told: 1 once the file is known to be of its kind (a checkpoint's or
 * llm.c's magic, a safetensors header that parsed), so that an error is
 * that format's alone; 0 for a file that is none of them. */
kiln_status kiln_weights_load_fd(struct kiln_model *m, const struct kiln_weights_file *w,
				 int named, int *told, void *stream);

/* Is parameter i stored [in, out] in GPT-2's files (a Conv1D weight)? */
int kiln_gpt2_conv1d(const struct kiln_model *m, int i);
/* Does the file's tensor `name` hold parameter i under GPT-2's names? */
int kiln_gpt2_same_name(const struct kiln_model *m, int i, const char *name);
/* Is `name` one of the GPT-2 release's causal-mask buffers (skipped)? */
int kiln_gpt2_skipped(const char *name);
/* May parameter i take a file tensor of fewer rows (a padded vocabulary)? */
int kiln_gpt2_padded_rows(const struct kiln_model *m, int i);

/* llm.c's model file (gpt2_124M.bin): does the file open on fd start
 * with its magic (read with pread)? */
int kiln_llmc_is_model_fd(int fd);
/* Load llm.c's model file, the regular file open on fd (borrowed), named
 * path in messages, as *seen saw it when it was opened, into m (GPT-2's
 * names, kiln's layouts; a stage's rank its stage's slice alone, as every
 * file kiln_weights_load reads). */
kiln_status kiln_llmc_load_fd(struct kiln_model *m, const char *path, int fd,
			      const struct kiln_file_seen *seen, int strict, void *stream);

#endif
