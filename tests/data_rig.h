/* tests/data_rig.h - a data set opened as the trainer opens it, on the cpu
 * device with a copy stream, for the suites that drive the loader engine
 * (tests/check_data.c, check_tokens.c).  The including file defines
 * `static struct kiln_registry *reg` (opened) before including this.
 */
#ifndef KILN_TESTS_DATA_RIG_H
#define KILN_TESTS_DATA_RIG_H

#include "data.h"
#include "loader.h"
#include "test_util.h"

#include <check.h>
#include <string.h>

struct rig {
	struct kiln_config *cfg;
	struct kiln_device *dev;
	struct kiln_dataset d;
	void *copy;
};

/* The config INI (validated), the cpu device, a stream, and [data] opened
 * for split train: the dataset's status (the rest fails the test). */
static inline kiln_status rig_open(struct rig *r, const char *ini)
{
	memset(r, 0, sizeof *r);
	r->cfg = test_config(reg, ini);
	ck_assert_msg(kiln_device_open(reg, r->cfg, "cpu", 0, &r->dev) == 0, "%s",
		      kiln_last_error());
	ck_assert(kiln_device_stream_create(r->dev, &r->copy) == 0);
	return kiln_dataset_open(r->cfg, reg, "data", "train", 1, &r->d);
}

static inline void rig_close(struct rig *r)
{
	kiln_dataset_close(&r->d);
	kiln_device_stream_destroy(r->dev, r->copy);
	kiln_device_close(r->dev);
	kiln_config_free(r->cfg);
}

#endif /* KILN_TESTS_DATA_RIG_H */
