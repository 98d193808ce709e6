/* plugins/common/c_locale.h - numbers in the C locale, whatever the
 * application's.  A program that embeds libkiln may call
 * setlocale(LC_ALL, "") (Qt and GTK applications do, at start); in de_DE
 * strtod("0.1") then stops at the '.', and printf("%g", 0.5) writes "0,5".
 * kiln's configs, its metrics files and the numbers it writes into a config
 * and reads back (kiln quantize's scales) are C-locale text, so every
 * float kiln parses goes through common_strtod and every float it formats
 * (for a file, a string it parses again, a message: kiln's English says
 * "loss 0.5432") through common_snprintf_c, or between
 * common_c_numbers_begin and _end; kiln_error and kiln_log do.  The CLI never calls
 * setlocale: for it these are the plain functions.  One copy for the core
 * and the plugins.  Header-only: static inline.
 */
#ifndef KILN_COMMON_C_LOCALE_H
#define KILN_COMMON_C_LOCALE_H

#include <locale.h>   /* newlocale, uselocale, locale_t */
#include <stdarg.h>
#include <stdio.h>    /* vsnprintf */
#include <stdlib.h>   /* strtod */
#ifndef __cplusplus
#include <stdatomic.h>
#endif

/* The C locale as a locale_t, made once (a race makes two and frees one:
 * glibc's "C" is its static object anyway, nothing is allocated); (locale_t)0
 * only when newlocale failed (out of memory), and then the callers below
 * fall back to the thread's locale.  C++ (kiln-gloo): a static local,
 * initialised once by the language. */
static inline locale_t common_c_locale(void)
{
#ifdef __cplusplus
	static const locale_t c_loc = newlocale(LC_ALL_MASK, "C", (locale_t)0);
	return c_loc;
#else
	static _Atomic(locale_t) c_loc;
	locale_t l = atomic_load_explicit(&c_loc, memory_order_acquire), none = (locale_t)0;
	if (l)
		return l;
	l = newlocale(LC_ALL_MASK, "C", (locale_t)0);
	if (l && !atomic_compare_exchange_strong(&c_loc, &none, l)) {
		freelocale(l);
		l = none;
	}
	return l;
#endif
}

/* Switch this thread to the C locale until common_c_numbers_end(returned):
 * for printf and scanf calls in between (uselocale is per thread: other
 * threads, the application's included, keep theirs). */
static inline locale_t common_c_numbers_begin(void)
{
	const locale_t c = common_c_locale();
	return c ? uselocale(c) : (locale_t)0;
}

static inline void common_c_numbers_end(locale_t old)
{
	if (old)
		uselocale(old);
}

/* strtod in the C locale ('.' the decimal point), the same contract
 * (errno included: uselocale leaves it alone).  Through uselocale, not
 * glibc's strtod_l, which needs _GNU_SOURCE before the first include. */
static inline double common_strtod(const char *s, char **end)
{
	const locale_t old = common_c_numbers_begin();
	const double d = strtod(s, end);
	common_c_numbers_end(old);
	return d;
}

/* vsnprintf and snprintf in the C locale, the same contract. */
static inline int common_vsnprintf_c(char *buf, size_t n, const char *fmt, va_list ap)
{
	const locale_t old = common_c_numbers_begin();
	const int r = vsnprintf(buf, n, fmt, ap);
	common_c_numbers_end(old);
	return r;
}

/* v for printf's %f, %g and %e in a line a person reads: a NaN without
 * its sign bit, so that a non-finite number reads nan, inf or -inf, as
 * metrics' CSV cells do (core/logger.c): glibc writes "-nan" for a NaN
 * whose sign bit is set, as x86's inf - inf and 0 * inf make, and a NaN's
 * sign means nothing (before session 40 a diverged run's epoch line said
 * "train loss -nan"). */
static inline double common_nan_plain(double v)
{
	return v != v ? __builtin_nan("") : v;
}

__attribute__((format(printf, 3, 4)))
static inline int common_snprintf_c(char *buf, size_t n, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	const int r = common_vsnprintf_c(buf, n, fmt, ap);
	va_end(ap);
	return r;
}

#endif
