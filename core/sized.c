/* core/sized.c - the public structs libkiln fills in a caller's memory
 * and that grow from one kiln to the next (kiln/kiln.h, "Structs the
 * library fills"): struct kiln_train_cfg, kiln_memory, kiln_plugin_info.
 * Each begins with `size_t size`, set by the caller to its sizeof; the
 * library fills a struct of its own size and copies the first
 * min(size, its sizeof) bytes, so a program built against an older
 * header (a smaller struct) gets no byte written past it.  (Before
 * session 35 these were filled whole: sizeof the library's struct.)
 * struct kiln_train_result has its own pair (core/train_result.c). */
#include "internal.h"

#include <string.h>

/* The caller's size (the struct's first member). */
static size_t size_of(const void *out)
{
	size_t size;
	memcpy(&size, out, sizeof size);
	return size;
}

kiln_status kiln_sized_check(const void *out, const char *fn, const char *type, const char *init)
{
	if (!out)
		return kiln_error(KILN_EINVAL, "%s: no struct %s given (NULL)", fn, type);
	/* (a size that cannot hold `size` itself: not set, or garbage) */
	const size_t size = size_of(out);
	if (size < sizeof size)
		return kiln_error(KILN_EINVAL, "%s: struct %s's size is %zu: set .size = sizeof(struct %s) before the call (%s)",
				  fn, type, size, type, init);
	return KILN_OK;
}

void kiln_sized_out(void *out, const void *full, size_t full_size)
{
	const size_t size = size_of(out), n = size < full_size ? size : full_size;
	memcpy(out, full, n);
	/* (after the copy, which wrote the library's own size there) */
	memcpy(out, &n, sizeof n);
}
