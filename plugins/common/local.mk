# plugins/common: code that more than one plugin (and the core) uses, kept
# once.  Headers of inline helpers, listed in each user's _SOURCES:
#   describe.h   tensor and op descriptions for error messages
#   conv_geom.h  convolution and pooling output sizes (C and CUDA)
PLUGIN_COMMON_H =
# The communicators' shared pieces, compiled into each of them (hidden there:
# only kiln_plugin_init is exported): the collective watchdog and the
# /dev/shm rounds of kiln-mpi and kiln-gloo.
PLUGIN_COMM_COMMON = plugins/common/watchdog.c plugins/common/watchdog.h \
	plugins/common/shmcoll.c plugins/common/shmcoll.h plugins/common/half.h
