/* tests/ckpt_tool.c - checkpoint files for shell tests:
 *   ckpt_tool check FILE          verify; print the error and exit 1 if bad
 *   ckpt_tool sections FILE       one line per section: tag bytes crc32c
 *   ckpt_tool same A B TAG...     exit 0 when sections TAG... of A and B
 *                                 are byte-identical, else 1 naming the first
 *   ckpt_tool close A B TOL TAG... exit 0 when the f32 sections TAG... of A
 *                                 and B agree elementwise within
 *                                 TOL * (1 + |a|); prints the largest
 *                                 difference of each
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
			int bad = na != nb || na % 4;
			for (uint64_t k = 0; !bad && k < na / 4; k++) {
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
	fprintf(stderr, "usage: ckpt_tool check FILE | sections FILE | same A B TAG... | close A B TOL TAG...\n");
	return 2;
}
