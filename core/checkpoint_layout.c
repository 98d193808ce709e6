/* core/checkpoint_layout.c - a checkpoint's parameter table (its "tensors"
 * section) against a model's: the same table; the same tensors laid out
 * in another order, read by name (checkpoint_load.c moves each tensor's
 * slice from its place in the file to its place in the model); or another
 * model, refused naming the first difference.
 *
 * Another order is what a kiln before 2026-12-06 (commit 71e6d1c) wrote
 * for [layer.a] tie = b with a before b: it laid the tied tensor b.weight
 * out at b's place, kiln now at its earliest user's (a's,
 * kiln_model_tie_owner) so that a pipeline stage's parameters stay one
 * slice.  It is also what a kiln writes for the same model with other
 * layers frozen ([layer] trainable): the trainable tensors go first
 * (graph.c layout_params), and the table has no trainable flag.  Each
 * tensor keeps its 64-byte aligned extent (its elements and the padding
 * after them) in either order, so the parameters' and buffers' lengths
 * are the same and the move is a permutation of extents: every stored
 * byte lands once.  The optimizer slots hold the trainable tensors alone:
 * they move as the parameters do when the checkpoint's trainable tensors
 * are the model's (ckpt_same_trainable), and are refused when not.
 */
#include "checkpoint_impl.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

/* The first line where a and b differ, into la/lb (for messages). */
static void first_diff(const char *a, const char *b, char *la, char *lb, size_t n)
{
	while (*a && *b) {
		size_t ka = strcspn(a, "\n"), kb = strcspn(b, "\n");
		if (ka != kb || memcmp(a, b, ka)) {
			snprintf(la, n, "%.*s", (int)ka, a);
			snprintf(lb, n, "%.*s", (int)kb, b);
			return;
		}
		a += ka + (a[ka] != 0);
		b += kb + (b[kb] != 0);
	}
	snprintf(la, n, "%.*s", (int)strcspn(a, "\n"), *a ? a : "(end)");
	snprintf(lb, n, "%.*s", (int)strcspn(b, "\n"), *b ? b : "(end)");
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Table text's lines with each line's offset (third field) cut out,
 * sorted: two tables of the same tensors laid out in another order give
 * the same result.  NULL when out of memory. */
static char **lines_sans_offset(const char *text, int *n_out)
{
	int n = 0, cap = 0;
	char **v = NULL;
	for (const char *a = text; *a;) {
		const size_t k = strcspn(a, "\n");
		char *line = strndup(a, k), *f2, *f3;
		if (n == cap) {
			char **w = realloc(v, (size_t)(cap = cap * 2 + 16) * sizeof *v);
			if (!w) {
				free(line);
				line = NULL;
			} else {
				v = w;
			}
		}
		if (!line)
			goto oom;
		/* "name region offset ...": drop " offset" */
		if ((f2 = strchr(line, ' ')) && (f2 = strchr(f2 + 1, ' ')) && (f3 = strchr(f2 + 1, ' ')))
			memmove(f2, f3, strlen(f3) + 1);
		v[n++] = line;
		a += k + (a[k] != 0);
	}
	qsort(v, (size_t)n, sizeof *v, cmp_str);
	*n_out = n;
	return v ? v : calloc(1, sizeof *v);
oom:
	while (n--)
		free(v[n]);
	free(v);
	return NULL;
}

/* 1 when tables a and b hold the same tensors (names, regions, sizes,
 * dtypes, shapes) at other offsets, 0 when not, -1 when out of memory. */
static int same_but_offsets(const char *a, const char *b)
{
	int na = 0, nb = 0, same = -1;
	char **la = lines_sans_offset(a, &na), **lb = la ? lines_sans_offset(b, &nb) : NULL;
	if (la && lb) {
		same = na == nb;
		for (int i = 0; same && i < na; i++)
			same = !strcmp(la[i], lb[i]);
	}
	for (int i = 0; la && i < na; i++)
		free(la[i]);
	for (int i = 0; lb && i < nb; i++)
		free(lb[i]);
	free(la);
	free(lb);
	return same;
}

/* The first layer of m whose tie names a later layer, else -1 (for the
 * message: whose layout changed). */
static int later_tie(const struct kiln_model *m)
{
	for (int i = 0; i < m->n_layers; i++)
		if (m->layers[i].tie > i)
			return i;
	return -1;
}

/* A tensor's extent in elements: its own and the padding that keeps the
 * next 64-byte aligned (graph.c layout_params). */
static size_t extent(const struct model_param *p)
{
	return kiln_align_up((size_t)p->numel * sizeof(float)) / sizeof(float);
}

/* 1 when at[] (each of m's tensors' offset in a checkpoint) is the layout
 * a kiln before 2026-12-06 gave m: graph.c layout_params's passes
 * (trainable, frozen, buffers) and order, but each tied tensor at the
 * place of the layer its tie names, a tying layer's slot laid out
 * nowhere (for the message: that is the one known cause of an order
 * other than m's with m's trainable flags). */
static int old_tie_layout(const struct kiln_model *m, const size_t *at)
{
	size_t end[2] = { 0, 0 };
	for (int pass = 0; pass < 3; pass++)
		for (int i = 0; i < m->n_layers; i++) {
			const struct model_layer *L = &m->layers[i];
			for (int k = 0; k < L->n_params; k++) {
				const int j = L->pidx[k];
				const struct model_param *p = &m->params[j];
				if ((L->tie >= 0 && k == L->tie_slot) ||
				    (p->buffer ? 2 : !p->trainable) != pass)
					continue;
				if (at[j] != end[p->buffer])
					return 0;
				end[p->buffer] += extent(p);
			}
		}
	return 1;
}

/* A line of the checkpoint's table: its name and offset. */
struct named_off {
	const char *name;
	size_t off;
};

static int cmp_named(const void *a, const void *b)
{
	return strcmp(((const struct named_off *)a)->name, ((const struct named_off *)b)->name);
}

/* Table text's lines as (name, offset), sorted by name, into *out
 * (malloc'd; the names point into text, whose lines' first spaces become
 * NULs).  KILN_EDATA naming the line when an offset is not a decimal
 * number. */
static kiln_status parse_offsets(const struct kiln_ckpt *ck, char *text, struct named_off **out,
				 int *n_out)
{
	int n = 0;
	for (const char *a = text; *a; a += strcspn(a, "\n") + (a[strcspn(a, "\n")] != 0))
		n++;
	struct named_off *v = calloc((size_t)(n ? n : 1), sizeof *v);
	if (!v)
		return kiln_error(KILN_ENOMEM, "out of memory");
	n = 0;
	for (char *a = text; *a;) {
		const size_t k = strcspn(a, "\n");
		char *end = a + k, *f1 = memchr(a, ' ', k), *q = NULL,
		     *f2 = f1 ? memchr(f1 + 1, ' ', (size_t)(end - f1 - 1)) : NULL;
		unsigned long long off = 0;
		/* "name region offset ...": offset decimal digits alone */
		int ok = f2 && f2[1] >= '0' && f2[1] <= '9';
		if (ok) {
			errno = 0;
			off = strtoull(f2 + 1, &q, 10);
			ok = !errno && q < end && *q == ' ' && off <= SIZE_MAX;
		}
		if (!ok) {
			free(v);
			return kiln_error(KILN_EDATA, "checkpoint %s: its 'tensors' line '%.*s' is malformed (want NAME REGION OFFSET NUMEL DTYPE DIMS)",
					  ck->path, (int)(k < 200 ? k : 200), a);
		}
		*f1 = '\0';
		v[n++] = (struct named_off){ a, (size_t)off };
		a = end + (*end != 0);
	}
	qsort(v, (size_t)n, sizeof *v, cmp_named);
	*out = v;
	*n_out = n;
	return KILN_OK;
}

/* A tensor's place in the checkpoint (places_tile): region, offset. */
struct place {
	int region, i;
	size_t off;
};

static int cmp_place(const void *a, const void *b)
{
	const struct place *x = a, *y = b;
	if (x->region != y->region)
		return x->region - y->region;
	return x->off < y->off ? -1 : x->off > y->off;
}

/* at[i], the checkpoint's offset of each tensor of m, lays the extents
 * out as every kiln did: in each region one after another from 0 (they
 * are m's tensors: so to the region's end, and the sections have m's
 * lengths), so that every read is within its section.  Which come first
 * is the writer's trainable flags' (not in the table): checked where the
 * optimizer slots are read (ckpt_same_trainable).  KILN_EDATA naming the
 * first tensor out of place. */
static kiln_status places_tile(const struct kiln_ckpt *ck, const struct kiln_model *m,
			       const size_t *at)
{
	struct place *v = malloc((size_t)(m->n_params ? m->n_params : 1) * sizeof *v);
	kiln_status st = KILN_OK;
	size_t end[2] = { 0, 0 };
	if (!v)
		return kiln_error(KILN_ENOMEM, "out of memory");
	for (int i = 0; i < m->n_params; i++)
		v[i] = (struct place){ m->params[i].buffer != 0, i, at[i] };
	qsort(v, (size_t)m->n_params, sizeof *v, cmp_place);
	for (int k = 0; k < m->n_params && !st; k++) {
		const struct model_param *p = &m->params[v[k].i];
		size_t *e = &end[v[k].region];
		if (v[k].off != *e)
			st = kiln_error(KILN_EDATA, "checkpoint %s: its 'tensors' table lays '%s' out at %zu, where no tensor before it ends: refused",
					ck->path, p->name, v[k].off);
		*e += extent(p);
	}
	free(v);
	return st;
}

/* The checkpoint's table `theirs` holds m's tensors at other offsets:
 * each one's offset there into *at (malloc'd, m->n_params), checked to lay
 * them out as a kiln does (places_tile). */
static kiln_status tensors_at(const struct kiln_ckpt *ck, const struct kiln_model *m,
			      char *theirs, size_t **at)
{
	struct named_off *v = NULL;
	int n = 0;
	kiln_status st = parse_offsets(ck, theirs, &v, &n);
	size_t *w = st ? NULL : malloc((size_t)(m->n_params ? m->n_params : 1) * sizeof *w);
	if (!st && !w)
		st = kiln_error(KILN_ENOMEM, "out of memory");
	for (int i = 0; !st && i < m->n_params; i++) {
		const struct named_off key = { m->params[i].name, 0 };
		const struct named_off *f = bsearch(&key, v, (size_t)n, sizeof *v, cmp_named);
		/* (same_but_offsets found every name once) */
		if (!f)
			st = kiln_error(KILN_EINTERNAL, "checkpoint %s: no tensor '%s'", ck->path,
					key.name);
		else
			w[i] = f->off;
	}
	if (!st)
		st = places_tile(ck, m, w);
	free(v);
	if (st)
		free(w);
	else
		*at = w;
	return st;
}

kiln_status ckpt_layout(struct kiln_ckpt *ck, const struct kiln_model *m, size_t **at,
			char *theirs_line, char *mine_line, size_t n, int *differ)
{
	char *mine = ckpt_tensors_text(m), *theirs = NULL;
	kiln_status st;
	int same;
	*differ = 0;
	*at = NULL;
	if (!mine)
		return kiln_error(KILN_ENOMEM, "out of memory");
	if (!(st = kiln_ckpt_read_text(ck, "tensors", &theirs)) && strcmp(mine, theirs)) {
		first_diff(theirs, mine, theirs_line, mine_line, n);
		if ((same = same_but_offsets(theirs, mine)) < 0)
			st = kiln_error(KILN_ENOMEM, "out of memory");
		else if (!same)
			*differ = 1;
		else
			st = tensors_at(ck, m, theirs, at);
	}
	free(mine);
	free(theirs);
	return st;
}

kiln_status ckpt_same_model(struct kiln_ckpt *ck, const struct kiln_model *m, size_t **at)
{
	char a[256], b[256];
	int differ;
	kiln_status st = ckpt_layout(ck, m, at, a, b, sizeof a, &differ);
	if (st || !differ)
		return st;
	return kiln_error(KILN_ECONFIG, "checkpoint %s holds another model: its parameter '%s', this model's '%s' (name region offset numel dtype shape)",
			  ck->path, a, b);
}

void ckpt_layout_note(const struct kiln_ckpt *ck, const struct kiln_model *m, const size_t *at)
{
	const int x = later_tie(m);
	char why[400] = "";
	int i = 0;
	while (i < m->n_params - 1 && at[i] == m->params[i].off)
		i++;
	if (x >= 0 && old_tie_layout(m, at))
		snprintf(why, sizeof why, " (a kiln before 2026-12-06 laid the weight of [%s] tie = %s out at %s's place, kiln now at %s's)",
			 m->layers[x].section, m->layers[m->layers[x].tie].name,
			 m->layers[m->layers[x].tie].name, m->layers[x].name);
	else if (m->n_params)
		snprintf(why, sizeof why, " ('%s' at element %zu there, %zu here: written with other layers frozen, whose trainable tensors went first, or by another kiln)",
			 m->params[i].name, at[i], m->params[i].off);
	kiln_log(KILN_LOG_INFO, "ckpt", "checkpoint %s lays this model's tensors out in another order%s: read by name",
		 ck->path, why);
}

kiln_status ckpt_same_trainable(const struct kiln_ckpt *ck, const struct kiln_model *m,
				const size_t *at)
{
	const struct rsec *r = m->state_slots ? ckpt_section(ck, m->optim_info.slot_names[0]) : NULL;
	if (!r)
		return KILN_OK;
	/* a kiln lays the trainable tensors out first and its slots hold
	 * them alone: they end where the slot does */
	const uint64_t end = r->bytes / sizeof(float);
	for (int i = 0; i < m->n_params; i++) {
		const struct model_param *p = &m->params[i];
		const int there = (at ? at[i] : p->off) < end;
		if (p->buffer || there == p->trainable || !extent(p))
			continue;
		return kiln_error(KILN_ECONFIG, "checkpoint %s: '%s' is %s here but %s in the checkpoint: its optimizer state ('%s') holds the trainable tensors alone, so it resumes with the same layers frozen only ([%s] trainable = %d there); [model] init_from loads its weights whatever is frozen",
				  ck->path, p->name, p->trainable ? "trainable" : "frozen",
				  there ? "trainable" : "frozen", r->tag, m->layers[p->layer].section,
				  there);
	}
	return KILN_OK;
}

kiln_status kiln_ckpt_slot_layout(struct kiln_ckpt *ck, const struct kiln_model *m, size_t **lay)
{
	kiln_status st = ckpt_same_model(ck, m, lay);
	if (!st && (st = ckpt_same_trainable(ck, m, *lay))) {
		free(*lay);
		*lay = NULL;
	}
	return st;
}

int ckpt_layout_kind(const struct kiln_model *m, const char *tag)
{
	if (!strcmp(tag, "params"))
		return CKPT_MAP_PARAMS;
	if (!strcmp(tag, "buffers"))
		return CKPT_MAP_BUFFERS;
	for (int k = 0; k < m->state_slots; k++)
		if (!strcmp(tag, m->optim_info.slot_names[k]))
			return CKPT_MAP_SLOT;
	return CKPT_MAP_NONE;
}

int ckpt_gather(const struct kiln_model *m, const size_t *at, int kind, size_t lo, size_t hi,
		const float *stored, int fd, uint64_t at_byte, float *out)
{
	for (int i = 0; i < m->n_params; i++) {
		const struct model_param *p = &m->params[i];
		if (p->buffer != (kind == CKPT_MAP_BUFFERS) || (kind == CKPT_MAP_SLOT && !p->trainable))
			continue;
		const size_t a = p->off > lo ? p->off : lo, e = p->off + extent(p),
			     b = e < hi ? e : hi;
		if (a >= b)
			continue;
		const size_t src = at[i] + (a - p->off), bytes = (b - a) * sizeof(float);
		if (stored)
			memcpy(out + (a - lo), stored + src, bytes);
		else if (kiln_pread_all(fd, out + (a - lo), bytes, at_byte + src * sizeof(float)))
			return -1;
	}
	return 0;
}

kiln_status kiln_ckpt_check_sample(struct kiln_ckpt *ck, const struct kiln_model *m)
{
	char a[256], b[256], sample[160];
	size_t *at = NULL;
	int differ;
	kiln_status st = ckpt_layout(ck, m, &at, a, b, sizeof a, &differ);
	free(at);
	if (st || !differ)
		return st;
	kiln_ckpt_sample_text(&m->sample, sample, sizeof sample);
	sample[strcspn(sample, "\n")] = '\0';
	return kiln_error(KILN_EDATA, "checkpoint %s: its section 'sample' (input %s) does not give the model it holds (a corrupt 'sample' section, or other [layer] sections): its parameter '%s', this model's '%s' (name region offset numel dtype shape)",
			  ck->path, sample, a, b);
}
