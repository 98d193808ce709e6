# plugins/mpi: the Open MPI communicator (docs/distributed.md).
if BUILD_MPI
pkglib_LTLIBRARIES += plugins/kiln-mpi.la
plugins_kiln_mpi_la_SOURCES = plugins/mpi/mpi.c plugins/mpi/mpi_comm.h plugins/mpi/mpi_jobs.c \
	plugins/mpi/mpi_now.c plugins/mpi/mpi_shm.c plugins/mpi/mpi_watch.c $(PLUGIN_COMM_COMMON)
plugins_kiln_mpi_la_CFLAGS = $(AM_CFLAGS) $(PLUGIN_CFLAGS) $(MPI_CFLAGS)
plugins_kiln_mpi_la_LDFLAGS = $(PLUGIN_LDFLAGS)
plugins_kiln_mpi_la_LIBADD = $(MPI_LIBS)
endif
