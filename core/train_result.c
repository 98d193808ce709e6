/* core/train_result.c - the caller's struct kiln_train_result: its size
 * checked before a run, the run's result copied into it after.  The
 * struct grows at the end and the caller says how big its copy is
 * (`size`: kiln/kiln.h), so a program built against an older header gets
 * no byte written past its struct (before session 34 the library cleared
 * and filled sizeof(its own struct) bytes of whatever the caller had). */
#include "train.h"

#include <string.h>

kiln_status trainer_result_check(const struct kiln_train_result *res, const char *fn)
{
	if (!res)
		return kiln_error(KILN_EINVAL, "%s: no struct kiln_train_result given (NULL)", fn);
	/* (a size that cannot hold `size` itself: not set, or garbage) */
	if (res->size < sizeof res->size)
		return kiln_error(KILN_EINVAL, "%s: struct kiln_train_result's size is %zu: set .size = sizeof(struct kiln_train_result) before the call (KILN_TRAIN_RESULT_INIT)",
				  fn, res->size);
	return KILN_OK;
}

void trainer_result_out(struct kiln_train_result *res, const struct kiln_train_result *full)
{
	const size_t n = res->size < sizeof *full ? res->size : sizeof *full;
	memcpy(res, full, n);
	/* (after the copy, which wrote the library's 0 there) */
	res->size = n;
}

void trainer_result_none(struct kiln_train_result *res)
{
	memset(res, 0, sizeof *res);
	res->test_loss = res->test_acc = -1;
	res->val_loss = res->val_acc = -1;
	res->loss_scale = 1;
	res->resumed_step = -1;
}
