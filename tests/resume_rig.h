/* tests/resume_rig.h - what the resume suites (tests/check_resume_best.c,
 * tests/check_resume_evals.c) share: their CNN on Fashion-MNIST
 * (tests/cnn_rig.h: 20 steps an epoch, 3 epochs, about a second a run),
 * a run of it in a directory, and readers of a run's metrics.jsonl and
 * checkpoints.  Include it after defining
 * `static struct kiln_registry *reg` (check_main fills it). */
#ifndef KILN_TESTS_RESUME_RIG_H
#define KILN_TESTS_RESUME_RIG_H

#include "checkpoint.h"
#include "ckpt_rig.h" /* same_sections, patch_u64 */
#include "cnn_rig.h"
#include "test_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *cnn_ini = "[run]\nseed = 5\nthreads = 1\nout_dir = %s\n" CNN_RIG_INI
			     "log_every = 1\neval_batch = 64\nschedule = constant\n"
			     "checkpoint_every = 0\n";

/* kiln_train of cnn_ini in dir with the overrides ov (NULL-terminated),
 * progress (may be NULL) its callback. */
static kiln_status cnn_train(const char *dir, const char *const *ov, kiln_progress_fn progress,
			     struct kiln_train_result *res)
{
	char ini[4096];
	snprintf(ini, sizeof ini, cnn_ini, dir);
	return test_train_text(reg, ini, ov, progress, res);
}

/* The steps of dir/metrics.jsonl's events `event` after its last resume
 * line (whole file: from_resume 0), space-separated into out. */
static void event_steps(const char *dir, const char *event, int from_resume, char *out, size_t n)
{
	char path[300], line[2048], want[64];
	snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
	snprintf(want, sizeof want, "{\"event\":\"%s\",", event);
	FILE *f = fopen(path, "r");
	ck_assert_msg(f != NULL, "%s", path);
	*out = 0;
	while (fgets(line, sizeof line, f)) {
		const char *sp = strstr(line, "\"step\":");
		if (from_resume && !strncmp(line, "{\"event\":\"resume\",", 18))
			*out = 0;
		if (strncmp(line, want, strlen(want)) || !sp)
			continue;
		size_t len = strlen(out);
		snprintf(out + len, n - len, "%s%lld", len ? " " : "", atoll(sp + 7));
	}
	fclose(f);
}

/* The ckpt-<step>.kiln files of dir, by step, space-separated into out. */
static void ckpt_files(const char *dir, char *out, size_t n)
{
	char path[400];
	*out = 0;
	for (int s = 0; s <= 100; s++) {
		snprintf(path, sizeof path, "%s/ckpt-%d.kiln", dir, s);
		if (access(path, F_OK))
			continue;
		size_t len = strlen(out);
		snprintf(out + len, n - len, "%s%d", len ? " " : "", s);
	}
}

#endif
