/* tests/ckpt_tool.c - checkpoint files for shell tests:
 *   ckpt_tool check FILE          verify; print the error and exit 1 if bad
 *   ckpt_tool sections FILE       one line per section: tag bytes crc32c
 *   ckpt_tool same A B TAG...     exit 0 when sections TAG... of A and B
 *                                 are byte-identical, else 1 naming the first
 *   ckpt_tool close A B TOL TAG... exit 0 when the f32 sections TAG... of A
 *                                 and B agree elementwise within
 *                                 TOL * (1 + |a|); prints the largest
 *                                 difference of each
 *   ckpt_tool step A0 A1 B0 B1 TOL NAME...
 *                                 exit 0 when the update of each named f32
 *                                 weight (section tensors) from A0 to A1 and
 *                                 from B0 to B1 agree: |u - v| <= TOL |u|
 *                                 (2-norms); prints each relative difference
 *   ckpt_tool nan FILE TAG INDEX  f32 element INDEX of section TAG set to
 *                                 NaN in place, its CRCs redone (a diverged
 *                                 run's checkpoint)
 *   ckpt_tool set FILE TAG INDEX VALUE
 *                                 the same, set to VALUE (a negative
 *                                 running variance)
 *   ckpt_tool order IN OUT REGION NAME...
 *                                 IN rewritten to OUT with REGION's tensors
 *                                 ("params" or "buffers") laid out in the
 *                                 order NAME... (each of them, for params
 *                                 the trainable ones first; 64-byte
 *                                 aligned): their "tensors" lines'
 *                                 offsets, their extents (elements and
 *                                 padding) moved in the region's sections
 *                                 ("params" and each optimizer slot,
 *                                 "optim.*" but "optim.step", within its
 *                                 length; "buffers"), the CRCs and size
 *                                 redone (a kiln's older layout of the
 *                                 same model)
 *   ckpt_tool nan64 FILE TAG INDEX
 *                                 f64 element INDEX set to NaN (keep_best's
 *                                 value of an entry, early stopping's best)
 *   ckpt_tool int FILE TAG INDEX VALUE
 *                                 i64 element INDEX (little-endian) set to
 *                                 VALUE (a count)
 */
#include <math.h>
#include <kiln/kiln.h>

#include "checkpoint.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static struct kiln_ckpt *open_or_die(const char *path)
{
	struct kiln_ckpt *ck;
	if (kiln_ckpt_open(path, &ck)) {
		fprintf(stderr, "ckpt_tool: %s\n", kiln_last_error());
		exit(1);
	}
	return ck;
}

static char *section(struct kiln_ckpt *ck, const char *tag, uint64_t *n)
{
	char *b;
	if (kiln_ckpt_find(ck, tag, n) || !(b = malloc(*n + 1)) || kiln_ckpt_read(ck, tag, b, *n)) {
		fprintf(stderr, "ckpt_tool: %s\n", kiln_last_error());
		exit(1);
	}
	return b;
}

/* A copy of the f32 tensor NAME of ck (its "tensors" section: "name
 * section offset count dtype shape" lines), its element count in *n;
 * NULL if absent. */
static float *named(struct kiln_ckpt *ck, const char *name, uint64_t *n)
{
	uint64_t nk, ns;
	char *keys = section(ck, "tensors", &nk), *line, *save = NULL;
	keys[nk] = 0;
	float *v = NULL;
	for (line = strtok_r(keys, "\n", &save); line && !v; line = strtok_r(NULL, "\n", &save)) {
		char nm[256], sec[64], dt[16];
		unsigned long long off, cnt;
		if (sscanf(line, "%255s %63s %llu %llu %15s", nm, sec, &off, &cnt, dt) != 5 ||
		    strcmp(nm, name) || strcmp(dt, "f32"))
			continue;
		char *b = section(ck, sec, &ns);
		if ((off + cnt) * 4 <= ns && (v = malloc(cnt * 4 + 1))) {
			memcpy(v, b + off * 4, cnt * 4);
			*n = cnt;
		}
		free(b);
	}
	free(keys);
	return v;
}

/* ckpt_tool step: the updates of the named weights in two runs agree */
static int step_cmd(int argc, char **argv)
{
	struct kiln_ckpt *ck[4];
	for (int k = 0; k < 4; k++)
		ck[k] = open_or_die(argv[2 + k]);
	const double tol = atof(argv[6]);
	int rc = 0;
	for (int i = 7; i < argc; i++) {
		float *w[4];
		uint64_t n[4] = { 0 };
		int bad = 0;
		for (int k = 0; k < 4; k++)
			if (!(w[k] = named(ck[k], argv[i], &n[k])) || n[k] != n[0])
				bad = 1;
		double du = 0, dd = 0;
		for (uint64_t j = 0; !bad && j < n[0]; j++) {
			const double u = (double)w[1][j] - w[0][j], v = (double)w[3][j] - w[2][j];
			du += u * u;
			dd += (u - v) * (u - v);
		}
		const double rel = du > 0 ? sqrt(dd / du) : (dd > 0 ? INFINITY : 0);
		bad |= !(rel <= tol);
		printf("%s: %llu floats, update's relative difference %.3g%s\n", argv[i],
		       (unsigned long long)n[0], rel, bad ? " DIFFERS" : "");
		rc |= bad;
		for (int k = 0; k < 4; k++)
			free(w[k]);
	}
	for (int k = 0; k < 4; k++)
		kiln_ckpt_close(ck[k]);
	return rc;
}

static uint64_t le64(const uint8_t *p)
{
	uint64_t v = 0;
	for (int i = 7; i >= 0; i--)
		v = v << 8 | p[i];
	return v;
}

static void put_le32(uint8_t *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

/* ckpt_tool nan: the file's layout is docs/checkpoints.md's (a 64-byte
 * header whose u32 at 24 counts the sections; each section a 48-byte
 * header: tag[32], u64 bytes, u32 payload CRC32C, u32 CRC32C of the 44
 * bytes before it; then the payload). */
/* Element index of `width` bytes (4: f32, 8: f64) of section tag set to
 * the bytes at v. */
static int set_cmd(const char *path, const char *tag, uint64_t index, const void *v, size_t width)
{
	FILE *f = fopen(path, "r+b");
	uint8_t *b = NULL;
	long n = -1;
	if (f && !fseek(f, 0, SEEK_END) && (n = ftell(f)) >= 64 && (b = malloc((size_t)n)))
		rewind(f);
	if (!b || fread(b, 1, (size_t)n, f) != (size_t)n) {
		fprintf(stderr, "ckpt_tool: %s: cannot read\n", path);
		return 1;
	}
	const uint32_t sections = (uint32_t)le64(b + 24) & 0xffffffffu;
	uint64_t pos = 64;
	for (uint32_t i = 0; i < sections && pos + 48 <= (uint64_t)n; i++) {
		uint8_t *sh = b + pos, *data = sh + 48;
		const uint64_t bytes = le64(sh + 32);
		pos += 48 + bytes;
		if (strncmp((const char *)sh, tag, 32) || (index + 1) * width > bytes)
			continue;
		memcpy(data + width * index, v, width);
		put_le32(sh + 40, kiln_crc32c(0, data, bytes));
		put_le32(sh + 44, kiln_crc32c(0, sh, 44));
		rewind(f);
		const int bad = fwrite(b, 1, (size_t)n, f) != (size_t)n || fclose(f);
		free(b);
		return bad;
	}
	fprintf(stderr, "ckpt_tool: %s: no f%d element %llu in a section '%s'\n", path,
		(int)width * 8, (unsigned long long)index, tag);
	return 1;
}

static void put_le64(uint8_t *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

/* A tensor of ckpt_tool order's region: its name, the rest of its
 * "tensors" line after the offset, its offset (elements) and extent in
 * IN and in OUT. */
struct placed {
	char name[256], rest[256];
	uint64_t was, is, ext;
};

/* The "tensors" text of IN with region's tensors at the places of
 * order NAME... (argv[0..n)): into t[] (*nt of them, each named), the
 * new text written to `text` (malloc'd).  Nonzero on a name missing or
 * left out. */
static int order_table(const char *keys, const char *region, char **names, int n,
		       struct placed *t, int *nt, char **text)
{
	size_t len = 0, cap = strlen(keys) + 64 * (size_t)n + 1;
	char *out = malloc(cap), *copy = strdup(keys), *line, *save = NULL;
	int k = 0, bad = !out || !copy;
	for (line = strtok_r(copy, "\n", &save); !bad && line; line = strtok_r(NULL, "\n", &save)) {
		char nm[256], sec[64];
		unsigned long long off;
		int rest = 0;
		if (sscanf(line, "%255s %63s %llu %n", nm, sec, &off, &rest) != 3 || k == 64) {
			bad = 1;
			break;
		}
		if (strcmp(sec, region)) {
			len += (size_t)sprintf(out + len, "%s\n", line);
			continue;
		}
		struct placed *p = &t[k++];
		unsigned long long numel = strtoull(line + rest, NULL, 10);
		snprintf(p->name, sizeof p->name, "%s", nm);
		snprintf(p->rest, sizeof p->rest, "%s", line + rest);
		p->was = off;
		p->ext = (numel * 4 + 63) / 64 * 16;
	}
	uint64_t at = 0;
	for (int i = 0; !bad && i < n; i++) {
		int f = -1;
		for (int j = 0; j < k; j++)
			if (!strcmp(t[j].name, names[i]))
				f = j;
		if (f < 0) {
			fprintf(stderr, "ckpt_tool: no %s tensor '%s'\n", region, names[i]);
			bad = 1;
			break;
		}
		t[f].is = at;
		at += t[f].ext;
		len += (size_t)sprintf(out + len, "%s %s %llu %s\n", t[f].name, region,
				       (unsigned long long)t[f].is, t[f].rest);
	}
	if (!bad && n != k) {
		fprintf(stderr, "ckpt_tool: %d %s tensors, %d named\n", k, region, n);
		bad = 1;
	}
	free(copy);
	*nt = k;
	*text = out;
	return bad;
}

/* ckpt_tool order (the layout of set_cmd's) */
static int order_cmd(const char *in, const char *outp, const char *region, char **names, int n)
{
	const int buffers = !strcmp(region, "buffers");
	if (!buffers && strcmp(region, "params")) {
		fprintf(stderr, "ckpt_tool: order: REGION is params or buffers, not '%s'\n", region);
		return 2;
	}
	struct kiln_ckpt *ck = open_or_die(in);
	struct placed t[64];
	uint64_t nk;
	int nt = 0;
	char *keys = section(ck, "tensors", &nk), *text = NULL;
	keys[nk] = 0;
	kiln_ckpt_close(ck);
	if (order_table(keys, region, names, n, t, &nt, &text)) {
		free(keys);
		free(text);
		return 1;
	}
	FILE *f = fopen(in, "rb");
	long len = -1;
	uint8_t *b = NULL, *o = NULL;
	if (f && !fseek(f, 0, SEEK_END) && (len = ftell(f)) >= 64 && (b = malloc((size_t)len)) &&
	    (o = malloc((size_t)len + strlen(text))))
		rewind(f);
	if (!o || fread(b, 1, (size_t)len, f) != (size_t)len) {
		fprintf(stderr, "ckpt_tool: %s: cannot read\n", in);
		return 1;
	}
	fclose(f);
	const uint32_t sections = (uint32_t)le64(b + 24) & 0xffffffffu;
	uint64_t pos = 64, at = 64;
	memcpy(o, b, 64);
	for (uint32_t i = 0; i < sections; i++) {
		const uint8_t *sh = b + pos, *data = sh + 48;
		uint64_t bytes = le64(sh + 32);
		uint8_t *oh = o + at, *od = oh + 48;
		const char *tag = (const char *)sh;
		pos += 48 + bytes;
		memcpy(oh, sh, 48);
		if (!strcmp(tag, "tensors")) {
			bytes = strlen(text);
			memcpy(od, text, bytes);
			put_le64(oh + 32, bytes);
		} else if (buffers ? !strcmp(tag, "buffers")
				   : !strcmp(tag, "params") ||
					     (!strncmp(tag, "optim.", 6) && strcmp(tag, "optim.step"))) {
			memcpy(od, data, bytes);
			for (int k = 0; k < nt; k++)
				if ((t[k].was + t[k].ext) * 4 <= bytes && (t[k].is + t[k].ext) * 4 <= bytes)
					memcpy(od + 4 * t[k].is, data + 4 * t[k].was, 4 * t[k].ext);
		} else {
			memcpy(od, data, bytes);
		}
		put_le32(oh + 40, kiln_crc32c(0, od, bytes));
		put_le32(oh + 44, kiln_crc32c(0, oh, 44));
		at += 48 + bytes;
	}
	put_le64(o + 16, at);
	put_le32(o + 60, kiln_crc32c(0, o, 60));
	FILE *w = fopen(outp, "wb");
	const int bad = !w || fwrite(o, 1, at, w) != at || fclose(w);
	if (bad)
		fprintf(stderr, "ckpt_tool: %s: cannot write\n", outp);
	free(b);
	free(o);
	free(keys);
	free(text);
	return bad;
}

int main(int argc, char **argv)
{
	if (argc == 3 && !strcmp(argv[1], "check")) {
		kiln_ckpt_close(open_or_die(argv[2]));
		return 0;
	}
	if (argc == 3 && !strcmp(argv[1], "sections")) {
		struct kiln_ckpt *ck = open_or_die(argv[2]);
		for (int i = 0; i < kiln_ckpt_section_count(ck); i++) {
			const char *tag;
			uint64_t bytes;
			uint32_t crc;
			kiln_ckpt_section_get(ck, i, &tag, &bytes, &crc);
			printf("%s %llu %08x\n", tag, (unsigned long long)bytes, crc);
		}
		kiln_ckpt_close(ck);
		return 0;
	}
	if (argc >= 5 && !strcmp(argv[1], "same")) {
		struct kiln_ckpt *a = open_or_die(argv[2]), *b = open_or_die(argv[3]);
		int rc = 0;
		for (int i = 4; i < argc && !rc; i++) {
			uint64_t na, nb;
			char *x = section(a, argv[i], &na), *y = section(b, argv[i], &nb);
			if (na != nb || memcmp(x, y, na)) {
				fprintf(stderr, "ckpt_tool: section '%s' differs between %s and %s\n",
					argv[i], argv[2], argv[3]);
				rc = 1;
			}
			free(x);
			free(y);
		}
		kiln_ckpt_close(a);
		kiln_ckpt_close(b);
		return rc;
	}
	if (argc >= 6 && !strcmp(argv[1], "close")) {
		struct kiln_ckpt *a = open_or_die(argv[2]), *b = open_or_die(argv[3]);
		double tol = atof(argv[4]);
		int rc = 0;
		for (int i = 5; i < argc; i++) {
			uint64_t na, nb;
			char *x = section(a, argv[i], &na), *y = section(b, argv[i], &nb);
			double worst = 0, rel = 0;
			const int shape = na != nb || na % 4;
			int bad = shape;
			/* every element, so the max below is the tensor's, not the
			 * max up to the first one over the tolerance */
			for (uint64_t k = 0; !shape && k < na / 4; k++) {
				float u, v;
				memcpy(&u, x + 4 * k, 4);
				memcpy(&v, y + 4 * k, 4);
				double d = fabs((double)u - (double)v);
				if (!(d <= tol * (1 + fabs(u))))
					bad = 1;
				if (d > worst)
					worst = d;
				if (d / (1 + fabs(u)) > rel)
					rel = d / (1 + fabs(u));
			}
			printf("%s: %llu floats, max |a-b| %.3g (relative %.3g)%s\n", argv[i],
			       (unsigned long long)(na / 4), worst, rel, bad ? " DIFFERS" : "");
			rc |= bad;
			free(x);
			free(y);
		}
		kiln_ckpt_close(a);
		kiln_ckpt_close(b);
		return rc;
	}
	const float f32 = argc == 6 ? strtof(argv[5], NULL) : NAN;
	const double f64 = NAN;
	if (argc == 5 && !strcmp(argv[1], "nan"))
		return set_cmd(argv[2], argv[3], strtoull(argv[4], NULL, 10), &f32, 4);
	if (argc == 6 && !strcmp(argv[1], "set"))
		return set_cmd(argv[2], argv[3], strtoull(argv[4], NULL, 10), &f32, 4);
	if (argc == 5 && !strcmp(argv[1], "nan64"))
		return set_cmd(argv[2], argv[3], strtoull(argv[4], NULL, 10), &f64, 8);
	if (argc == 6 && !strcmp(argv[1], "int")) {
		uint8_t le[8];
		const uint64_t v = strtoull(argv[5], NULL, 10);
		for (int i = 0; i < 8; i++)
			le[i] = (uint8_t)(v >> (8 * i));
		return set_cmd(argv[2], argv[3], strtoull(argv[4], NULL, 10), le, 8);
	}
	if (argc >= 8 && !strcmp(argv[1], "step"))
		return step_cmd(argc, argv);
	if (argc >= 6 && !strcmp(argv[1], "order"))
		return order_cmd(argv[2], argv[3], argv[4], argv + 5, argc - 5);
	fprintf(stderr, "usage: ckpt_tool check FILE | sections FILE | same A B TAG... | close A B TOL TAG... | "
		"step A0 A1 B0 B1 TOL NAME... | nan FILE TAG INDEX | set FILE TAG INDEX VALUE | "
		"order IN OUT REGION NAME... | nan64 FILE TAG INDEX | int FILE TAG INDEX VALUE\n");
	return 2;
}
