/* tests/fuzz/driver.c - run a fuzz target without libFuzzer: every file
 * named on the command line, or every file of every directory named, is
 * given once to LLVMFuzzerTestOneInput (tests/fuzz/fuzz.h).  A crash or a
 * sanitizer report fails the run; `make check` runs each target's corpus
 * this way (tests/fuzz_corpus.sh).  Prints how many inputs ran.
 */
#include <dirent.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Feed the file at path to the target; 0, or -1 when it cannot be read. */
static int run_file(const char *path)
{
	FILE *f = fopen(path, "rb");
	if (!f) {
		perror(path);
		return -1;
	}
	uint8_t *buf = NULL;
	size_t n = 0, cap = 0, got;
	do {
		if (cap - n < 65536) {
			cap = cap ? 2 * cap : 65536;
			uint8_t *grown = realloc(buf, cap);
			if (!grown) {
				fclose(f);
				free(buf);
				return -1;
			}
			buf = grown;
		}
		got = fread(buf + n, 1, cap - n, f);
		n += got;
	} while (got);
	int bad = ferror(f);
	fclose(f);
	if (!bad) {
		/* a copy of exactly n bytes, so ASan sees reads past the input */
		uint8_t *in = malloc(n ? n : 1);
		if (!in) {
			free(buf);
			return -1;
		}
		memcpy(in, buf, n);
		LLVMFuzzerTestOneInput(in, n);
		free(in);
	}
	free(buf);
	return bad ? -1 : 0;
}

static int cmp_names(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Every regular file of dir, in name order; the count run, or -1. */
static int run_dir(const char *dir)
{
	DIR *d = opendir(dir);
	if (!d) {
		perror(dir);
		return -1;
	}
	char **names = NULL;
	size_t n = 0;
	struct dirent *de;
	while ((de = readdir(d))) {
		if (de->d_name[0] == '.')
			continue;
		char **grown = realloc(names, (n + 1) * sizeof *names);
		if (!grown)
			break;
		names = grown;
		size_t len = strlen(dir) + strlen(de->d_name) + 2;
		if (!(names[n] = malloc(len)))
			break;
		snprintf(names[n++], len, "%s/%s", dir, de->d_name);
	}
	closedir(d);
	qsort(names, n, sizeof *names, cmp_names);
	int ran = 0;
	for (size_t i = 0; i < n; i++) {
		struct stat sb;
		if (ran >= 0 && !stat(names[i], &sb) && S_ISREG(sb.st_mode))
			ran = run_file(names[i]) ? -1 : ran + 1;
		free(names[i]);
	}
	free(names);
	return ran;
}

int main(int argc, char **argv)
{
	int total = 0;
	for (int i = 1; i < argc; i++) {
		struct stat sb;
		if (stat(argv[i], &sb)) {
			perror(argv[i]);
			return 1;
		}
		int ran = S_ISDIR(sb.st_mode) ? run_dir(argv[i]) : run_file(argv[i]) ? -1 : 1;
		if (ran < 0)
			return 1;
		total += ran;
	}
	printf("%s: %d inputs\n", argc > 0 ? argv[0] : "driver", total);
	return 0;
}
