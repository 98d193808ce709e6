/* kiln/status.h - status codes, the thread-local error message, and logging.
 *
 * Every fallible kiln function returns a kiln_status: 0 on success, a negative
 * KILN_E* code on failure.  On failure it has also set a message for the
 * calling thread, readable with kiln_last_error() until the next failing call
 * on the same thread.  Library and plugin code never exits; only the `kiln`
 * command turns a status into an exit code (kiln_status_exit_code()).
 */
#ifndef KILN_STATUS_H
#define KILN_STATUS_H

#include <stdarg.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define KILN_PRINTF(f, a) __attribute__((format(printf, f, a)))
#else
#define KILN_PRINTF(f, a)
#endif

typedef int kiln_status;

enum {
	KILN_OK = 0,
	KILN_EINVAL = -1,    /* bad argument from the caller (a bug or bad API use) */
	KILN_ENOMEM = -2,    /* out of host or device memory */
	KILN_EIO = -3,       /* file could not be opened, read or written */
	KILN_ECONFIG = -4,   /* bad config file, key, value or override: exit 2 */
	KILN_EUSAGE = -5,    /* bad command line: exit 2 */
	KILN_EDATA = -6,     /* bad data file or sample: exit 3 */
	KILN_ENOTSUP = -7,   /* operation or shape not supported by this device/plugin */
	KILN_EPLUGIN = -8,   /* plugin missing, unloadable, or failed its probe */
	KILN_EABI = -9,      /* plugin built against another ABI major */
	KILN_ENOTFOUND = -10,/* named thing does not exist */
	KILN_ETIMEOUT = -11, /* collective or rendezvous timed out */
	KILN_EDEVICE = -12,  /* device library error (oneDNN, CUDA, ...) */
	KILN_EINTERNAL = -13 /* kiln bug: please report */
};

/* The message of the calling thread's last failure ("" if none).  The string
 * is owned by kiln and valid until the next kiln call on this thread. */
const char *kiln_last_error(void);

/* The size of the buffer that holds any message kiln_last_error() returns,
 * its NUL included: a copy into a char[KILN_ERROR_MAX] is never cut. */
#define KILN_ERROR_MAX 10240

/* Set the calling thread's message (printf-style) and return `st`, so that
 * `return kiln_error(KILN_EDATA, "%s: truncated", path);` reads naturally.
 * A message longer than KILN_ERROR_MAX - 1 bytes keeps its first quarter and
 * its end, joined by "...". */
kiln_status kiln_error(kiln_status st, const char *fmt, ...) KILN_PRINTF(2, 3);
kiln_status kiln_verror(kiln_status st, const char *fmt, va_list ap);

/* Prefix the current message with "what: " (keeps the status). */
kiln_status kiln_error_wrap(kiln_status st, const char *fmt, ...) KILN_PRINTF(2, 3);

void kiln_clear_error(void);

/* "KILN_ECONFIG" etc.; never NULL. */
const char *kiln_status_name(kiln_status st);

/* Exit code the CLI uses for a status: 0 ok, 2 usage/config, 3 data, 1 other. */
int kiln_status_exit_code(kiln_status st);

/* ---- logging ---------------------------------------------------------- */

enum kiln_log_level {
	KILN_LOG_ERROR = 0,
	KILN_LOG_WARN = 1,
	KILN_LOG_INFO = 2,
	KILN_LOG_DEBUG = 3
};

/* A log sink receives every message at or below the current level.  `who` is
 * the emitting component ("core", "cpu", "idx", ...), `msg` has no trailing
 * newline.  Both strings are borrowed for the duration of the call.  The sink
 * may be called from any thread; kiln serialises calls to it. */
typedef void (*kiln_log_fn)(void *user, int level, const char *who, const char *msg);

/* Replace the sink (NULL restores the default: "[who] msg" lines on stderr). */
void kiln_log_set_sink(kiln_log_fn fn, void *user);
void kiln_log_set_level(int level);
int kiln_log_get_level(void);

void kiln_log(int level, const char *who, const char *fmt, ...) KILN_PRINTF(3, 4);
void kiln_vlog(int level, const char *who, const char *fmt, va_list ap);

#ifdef __cplusplus
}
#endif
#endif /* KILN_STATUS_H */
