/* core/weights_gpt2.c - the GPT-2 release's weight layouts and llm.c's
 * model file (docs/safetensors.md, "GPT-2 and llm.c").
 *
 * GPT-2's files (OpenAI's release as Hugging Face's GPT2LMHeadModel saves
 * it) name the tensors as kiln's GPT examples name their layers
 * (transformer.h.0.attn.c_attn.weight), but hold the weights of the blocks'
 * four projections, GPT-2's Conv1D modules, as [in, out]: kiln's linear
 * (and llm.c, and PyTorch's nn.Linear) keeps [out, in].  Hugging Face's
 * GPT2Model files drop the "transformer." prefix, and older ones carry the
 * attention's causal mask as buffers (h.0.attn.bias, h.0.attn.masked_bias).
 *
 * llm.c's model file (train_gpt2.py's write_model, read by train_gpt2.c's
 * gpt2_build_from_checkpoint): a header of 256 int32 (magic 20240326,
 * version, max_seq_len, vocab_size, num_layers, num_heads, channels,
 * padded_vocab_size), then the parameters with no gaps, each kind for all
 * layers before the next kind: wte [Vp, C], wpe [maxT, C], ln_1 weight and
 * bias [L, C], c_attn [L, 3C, C] and [L, 3C], attn c_proj [L, C, C] and
 * [L, C], ln_2 [L, C] twice, c_fc [L, 4C, C] and [L, 4C], mlp c_proj
 * [L, C, 4C] and [L, C], ln_f [C] twice; weights [out, in] as kiln's.
 * Version 3 is f32 with the padded vocabulary, 5 the same in bf16, 1 f32
 * with V rows (before llm.c padded).  lm_head is always wte.
 */
#include "weights.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>

#include "internal.h"

/* ---- GPT-2's names and layouts -------------------------------------------- */

static const char *layer_type(const struct kiln_model *m, int layer)
{
	return m->layers[layer].type->name;
}

/* The part of a name after its last '.'. */
static const char *last_part(const char *name)
{
	const char *dot = strrchr(name, '.');
	return dot ? dot + 1 : name;
}

int kiln_gpt2_conv1d(const struct kiln_model *m, int i)
{
	static const char *const conv1d[] = { "c_attn", "c_proj", "c_fc", "q_attn" };
	const struct model_param *p = &m->params[i];
	const char *layer = m->layers[p->layer].name;
	if (strcmp(layer_type(m, p->layer), "linear") || p->desc.ndim != 2 ||
	    strcmp(last_part(p->name), "weight"))
		return 0;
	for (size_t k = 0; k < sizeof conv1d / sizeof *conv1d; k++)
		if (!strcmp(last_part(layer), conv1d[k]))
			return 1;
	return 0;
}

int kiln_gpt2_same_name(const struct kiln_model *m, int i, const char *name)
{
	static const char prefix[] = "transformer.";
	const char *own = m->params[i].name;
	return !strcmp(own, name) ||
	       (!strncmp(own, prefix, sizeof prefix - 1) && !strcmp(own + sizeof prefix - 1, name));
}

static int ends_with(const char *s, const char *suffix)
{
	size_t n = strlen(s), k = strlen(suffix);
	return n >= k && !strcmp(s + n - k, suffix);
}

int kiln_gpt2_skipped(const char *name)
{
	return ends_with(name, ".attn.bias") || ends_with(name, ".attn.masked_bias");
}

int kiln_gpt2_padded_rows(const struct kiln_model *m, int i)
{
	const struct model_param *p = &m->params[i];
	return !strcmp(layer_type(m, p->layer), "embedding") && p->desc.ndim == 2;
}

/* ---- llm.c's model file ----------------------------------------------------- */

#define LLMC_MAGIC 20240326
#define LLMC_HEADER_INTS 256

/* A dimension of llm.c's tensors, in terms of its header. */
enum { D_NONE, D_VP, D_T, D_C, D_3C, D_4C };

/* The parameter kinds in the file's order: the name (after
 * "transformer.h.N." for a block's), per block or not, rows and columns. */
static const struct llmc_kind {
	const char *name;
	int per_layer, rows, cols;
} llmc_kinds[] = {
	{ "transformer.wte.weight", 0, D_VP, D_C },   { "transformer.wpe.weight", 0, D_T, D_C },
	{ "ln_1.weight", 1, D_C, D_NONE },            { "ln_1.bias", 1, D_C, D_NONE },
	{ "attn.c_attn.weight", 1, D_3C, D_C },       { "attn.c_attn.bias", 1, D_3C, D_NONE },
	{ "attn.c_proj.weight", 1, D_C, D_C },        { "attn.c_proj.bias", 1, D_C, D_NONE },
	{ "ln_2.weight", 1, D_C, D_NONE },            { "ln_2.bias", 1, D_C, D_NONE },
	{ "mlp.c_fc.weight", 1, D_4C, D_C },          { "mlp.c_fc.bias", 1, D_4C, D_NONE },
	{ "mlp.c_proj.weight", 1, D_C, D_4C },        { "mlp.c_proj.bias", 1, D_C, D_NONE },
	{ "transformer.ln_f.weight", 0, D_C, D_NONE }, { "transformer.ln_f.bias", 0, D_C, D_NONE },
};
#define LLMC_KINDS ((int)(sizeof llmc_kinds / sizeof *llmc_kinds))

/* The header's numbers. */
struct llmc_header {
	int version, elem; /* elem: bytes per value */
	int64_t maxT, V, Vp, L, NH, C;
};

static int64_t llmc_dim(const struct llmc_header *h, int d)
{
	switch (d) {
	case D_VP: return h->Vp;
	case D_T: return h->maxT;
	case D_C: return h->C;
	case D_3C: return 3 * h->C;
	case D_4C: return 4 * h->C;
	default: return 1;
	}
}

int kiln_llmc_is_model_fd(int fd)
{
	int32_t magic = 0;
	return kiln_pread_all(fd, &magic, sizeof magic, 0) == 0 && magic == LLMC_MAGIC;
}

/* Check the header's numbers and the file size they imply. */
static kiln_status llmc_header(const char *path, const int32_t *raw, int64_t size,
			       struct llmc_header *h)
{
	h->version = raw[1];
	if (raw[0] != LLMC_MAGIC || (h->version != 1 && h->version != 3 && h->version != 5))
		return kiln_error(KILN_EDATA, "%s: not an llm.c model file (magic %d, version %d; expected %d and 1, 3 or 5)",
				  path, raw[0], raw[1], LLMC_MAGIC);
	h->elem = h->version == 5 ? 2 : 4;
	h->maxT = raw[2];
	h->V = raw[3];
	h->L = raw[4];
	h->NH = raw[5];
	h->C = raw[6];
	h->Vp = h->version == 1 ? h->V : raw[7];
	if (h->maxT < 1 || h->V < 1 || h->Vp < h->V || h->L < 1 || h->L > 4096 || h->NH < 1 ||
	    h->C < 1 || h->C % h->NH || h->maxT > (1 << 24) || h->Vp > (1 << 24) || h->C > (1 << 20))
		return kiln_error(KILN_EDATA, "%s: bad llm.c header: max_seq_len %lld, vocab %lld (padded %lld), %lld layers, %lld heads, %lld channels",
				  path, (long long)h->maxT, (long long)h->V, (long long)h->Vp,
				  (long long)h->L, (long long)h->NH, (long long)h->C);
	int64_t n = 0;
	for (int k = 0; k < LLMC_KINDS; k++)
		n += (llmc_kinds[k].per_layer ? h->L : 1) * llmc_dim(h, llmc_kinds[k].rows) *
		     llmc_dim(h, llmc_kinds[k].cols);
	int64_t want = LLMC_HEADER_INTS * 4 + n * h->elem;
	if (size != want)
		return kiln_error(KILN_EDATA, "%s: %lld bytes, but its header (version %d, %lld layers, %lld channels, vocab %lld, context %lld) makes %lld",
				  path, (long long)size, h->version, (long long)h->L, (long long)h->C,
				  (long long)h->Vp, (long long)h->maxT, (long long)want);
	return KILN_OK;
}

/* Every attention layer of m must have the file's heads. */
static kiln_status llmc_check_heads(const struct kiln_model *m, const char *path, int64_t heads)
{
	for (int i = 0; i < m->n_layers; i++) {
		int64_t h = 0;
		if (strcmp(layer_type(m, i), "attention"))
			continue;
		kiln_config_get_int(m->cfg, m->layers[i].section, "heads", &h);
		if (h != heads)
			return kiln_error(KILN_ECONFIG, "%s: the llm.c model has %lld heads, [%s] heads = %lld",
					  path, (long long)heads, m->layers[i].section, (long long)h);
	}
	return KILN_OK;
}

/* An llm.c file open for kiln_weights_in.read: where each tensor is. */
struct llmc_file {
	int fd;
	const struct kiln_file_seen *seen; /* when opened */
	uint64_t *off;  /* tensor j's first byte in the file */
};

/* kiln_weights_in.read of an llm.c file (ctx: struct llmc_file): tensor
 * j's bytes with pread (before session 39 the whole file was read into
 * memory first: a second copy of the model's weights on the host). */
static kiln_status llmc_read(const struct kiln_weights_in *in, int j, void *dst)
{
	const struct llmc_file *f = in->ctx;
	char what[128];
	snprintf(what, sizeof what, "tensor '%s'", in->t[j].name);
	return kiln_read_at(f->fd, in->path, f->seen, what, dst, in->t[j].bytes, f->off[j]);
}

/* The file's tensors, in its order, and where each starts (off[]). */
static void llmc_tensors(const struct llmc_header *h, char (*names)[96],
			 struct kiln_safetensors_tensor *t, uint64_t *off)
{
	uint64_t at = LLMC_HEADER_INTS * 4;
	int n = 0;
	for (int k = 0; k < LLMC_KINDS; k++) {
		const struct llmc_kind *K = &llmc_kinds[k];
		for (int64_t l = 0; l < (K->per_layer ? h->L : 1); l++, n++) {
			if (K->per_layer)
				snprintf(names[n], sizeof names[n], "transformer.h.%lld.%s", (long long)l,
					 K->name);
			else
				snprintf(names[n], sizeof names[n], "%s", K->name);
			memset(&t[n], 0, sizeof t[n]);
			t[n].name = names[n];
			t[n].dtype_name = h->elem == 2 ? "BF16" : "F32";
			t[n].dtype = h->elem == 2 ? KILN_BF16 : KILN_F32;
			t[n].ndim = K->cols == D_NONE ? 1 : 2;
			t[n].dims[0] = llmc_dim(h, K->rows);
			t[n].dims[1] = llmc_dim(h, K->cols);
			/* version 1: the table has V rows */
			if (K->rows == D_VP && h->version == 1)
				t[n].dims[0] = h->V;
			t[n].numel = t[n].dims[0] * (t[n].ndim == 2 ? t[n].dims[1] : 1);
			t[n].bytes = (size_t)t[n].numel * (size_t)h->elem;
			off[n] = at;
			at += t[n].bytes;
		}
	}
}

kiln_status kiln_llmc_load_fd(struct kiln_model *m, const char *path, int fd,
			      const struct kiln_file_seen *seen, int strict, void *stream)
{
	int32_t raw[LLMC_HEADER_INTS];
	struct llmc_header h = { 0 };
	struct llmc_file f = { fd, seen, NULL };
	char (*names)[96] = NULL;
	struct kiln_safetensors_tensor *t = NULL;
	kiln_status st;
	if (seen->size < sizeof raw) {
		st = kiln_error(KILN_EDATA, "%s: shorter than llm.c's %zu-byte header", path, sizeof raw);
		goto out;
	}
	if ((st = kiln_read_at(fd, path, seen, "the header", raw, sizeof raw, 0)) ||
	    (st = llmc_header(path, raw, (int64_t)seen->size, &h)) ||
	    (st = llmc_check_heads(m, path, h.NH)))
		goto out;
	int n = (int)(4 + 12 * h.L);
	names = calloc((size_t)n, sizeof *names);
	t = calloc((size_t)n, sizeof *t);
	f.off = calloc((size_t)n, sizeof *f.off);
	if (!names || !t || !f.off) {
		st = kiln_error(KILN_ENOMEM, "%s: out of memory", path);
		goto out;
	}
	llmc_tensors(&h, names, t, f.off);
	struct kiln_weights_in in = { path, n, t, KILN_WF_GPT2_NAMES, llmc_read, &f };
	st = kiln_weights_load(m, &in, strict, stream);
out:
	free(f.off);
	free(names);
	free(t);
	return st;
}
