# plugins/common: code that more than one plugin (and the core) uses, kept
# once.  Headers of inline helpers, listed in each user's _SOURCES:
#   clones.h     KILN_CLONES: a loop built for AVX-512, AVX2 and baseline
#   describe.h   tensor and op descriptions for error messages
#   device.h     what both devices do alike: op names, run()'s argument
#                check, op extents, lists of live objects
#   scalar_ops.h the one-thread scalar steps (LR schedule, loss scaler, clip
#                factor, batch norm's commit), C and CUDA
PLUGIN_COMMON_H = plugins/common/clones.h plugins/common/describe.h plugins/common/device.h plugins/common/scalar_ops.h
# The communicators' shared pieces, compiled into each of them (hidden there:
# only kiln_plugin_init is exported): the collective watchdog and the
# /dev/shm rounds of kiln-mpi and kiln-gloo, kiln_plugin_init (comm_init.h).
PLUGIN_COMM_COMMON = plugins/common/watchdog.c plugins/common/watchdog.h plugins/common/comm_init.h \
	plugins/common/shmcoll.c plugins/common/shmcoll.h plugins/common/clones.h plugins/common/shm_room.h plugins/common/half.h \
	plugins/common/rank_name.h plugins/common/shm_stale.h
# open_file.h: opening a file to read, refusing FIFOs and devices before
# open() can block (the core and kiln-loaders.so; issue 25)
PLUGIN_COMMON_H += plugins/common/open_file.h
# cache_file.h: where rebuildable files live ($XDG_CACHE_HOME/kiln) and
# writing one atomically (the IDX inflated copies, the plugin probe's
# answers, cuDNN's autotune cache)
PLUGIN_COMMON_H += plugins/common/cache_file.h
# spin_rule.h: GOMP_SPINCOUNT by the load at start (cli/kiln.c and the Check
# suites' main)
PLUGIN_COMMON_H += plugins/common/spin_rule.h
PLUGIN_COMMON_H += plugins/common/norm_lut.h
# c_locale.h: numbers in the C locale whatever the application's (strtod,
# snprintf): the config's floats, the files kiln writes, its messages
PLUGIN_COMMON_H += plugins/common/c_locale.h
# write_full.h: a whole pwrite (EINTR and short writes retried) for the
# records writer and kiln pack's token shards, which libkiln's
# kiln_pwrite_all (core/internal.h) does not reach
PLUGIN_COMMON_H += plugins/common/write_full.h
# utf8.h: the length of a well-formed UTF-8 sequence, U+FFFD otherwise, for
# metrics.jsonl's strings (core/train_log.c) and the CLI's JSON (cli/kiln.c)
PLUGIN_COMMON_H += plugins/common/utf8.h
# read_full.h: a whole pread that returns the count there was (EINTR and
# short reads retried), so that a file cut short under its reader is told
# from a failed read: the loaders' shards and libkiln's weights files
PLUGIN_COMMON_H += plugins/common/read_full.h
