/* tests/plugins/test_plugin.h - what the test plugins share: a descriptor
 * with every field given, and the exported entry point, so that each file
 * writes only what makes it the case it tests.  (tests/oot/oot.c does not
 * use this: it must build from the installed headers alone.)
 */
#ifndef KILN_TESTS_TEST_PLUGIN_H
#define KILN_TESTS_TEST_PLUGIN_H

#include <kiln/plugin.h>

/* static const struct kiln_plugin VAR, built for ABI MAJOR.MINOR, with
 * the kind, name, summary, ops table, keys and probe given (NULL where
 * the plugin has none). */
#define TEST_PLUGIN(var, major, minor, kind_, name_, summary_, ops_, keys_, probe_)    \
	static const struct kiln_plugin var = {                                         \
		.abi_major = (major),                                                   \
		.abi_minor = (minor),                                                   \
		.kind = (kind_),                                                        \
		.name = (name_),                                                        \
		.summary = (summary_),                                                  \
		.ops = (ops_),                                                          \
		.keys = (keys_),                                                        \
		.probe = (probe_),                                                      \
	}

/* The exported kiln_plugin_init, returning the expression RESULT (which
 * may read the const struct kiln_host *host it is given). */
#define TEST_PLUGIN_INIT(result)                                                                 \
	KILN_PLUGIN_EXPORT const struct kiln_plugin *const *kiln_plugin_init(                    \
		const struct kiln_host *host);                                                   \
	KILN_PLUGIN_EXPORT const struct kiln_plugin *const *kiln_plugin_init(                    \
		const struct kiln_host *host)                                                    \
	{                                                                                        \
		return (result);                                                                 \
	}

#endif
