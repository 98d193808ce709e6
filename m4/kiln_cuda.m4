dnl m4/kiln_cuda.m4 - the CUDA device's probe (plugins/cuda): the toolkit,
dnl the GPU architectures to compile for, cuDNN.
dnl
dnl nvcc compiles kiln's kernels (plugins/cuda/*.cu) for the architectures of
dnl --with-cuda-arch (SASS for each, plus PTX of the newest so later GPUs can
dnl JIT it); cudart is linked statically (it is C++: -lstdc++), so loading
dnl kiln-cuda.so needs neither libcudart.so nor a driver, and cuBLASLt shared
dnl with an rpath to the toolkit's library directory.
dnl
dnl KILN_CUDA: --with-cuda, --with-cuda-arch, the `cuda` plugin (KILN_PLUGIN,
dnl configure.ac) and the HAVE_CUDNN conditional.  Sets and substitutes NVCC,
dnl NVCC_GENCODE, CUDA_MIN_ARCH, CUDA_CPPFLAGS, CUDA_LIBS, CUDA_LDFLAGS;
dnl sets CUDA_HOME and CUDA_LIBDIR (NCCL's probe looks there) and cuda_note,
dnl the line configure's summary prints.
AC_DEFUN([KILN_CUDA], [
AC_ARG_WITH([cuda],
  [AS_HELP_STRING([--with-cuda=PATH], [CUDA toolkit root (default: /usr/local/cuda when it is there; --without-cuda: do not build the CUDA device)])],
  [], [with_cuda=auto])
AC_ARG_WITH([cuda-arch],
  [AS_HELP_STRING([--with-cuda-arch=LIST], [GPU compute capabilities to build for, comma-separated (default: 90, Hopper)])],
  [], [with_cuda_arch=90])
KILN_PLUGIN([cuda], [CUDA device (needs the CUDA toolkit: nvcc, cudart, cuBLASLt)], [
  _KILN_CUDA_TOOLKIT
  AS_IF([test -z "$why_cuda"], [
    _KILN_CUDA_ARCH
    CUDA_CPPFLAGS="-isystem $CUDA_HOME/include"
    CUDA_LIBS="$CUDA_LIBDIR/libcudart_static.a -L$CUDA_LIBDIR -lcublasLt -lstdc++ -lrt -ldl -lpthread"
    CUDA_LDFLAGS="-Wl,-rpath,$CUDA_LIBDIR"
    _KILN_CUDNN])
  AC_SUBST([NVCC])
  AC_SUBST([NVCC_GENCODE])
  AC_SUBST([CUDA_MIN_ARCH])
  AC_SUBST([CUDA_CPPFLAGS])
  AC_SUBST([CUDA_LIBS])
  AC_SUBST([CUDA_LDFLAGS])
])
AM_CONDITIONAL([HAVE_CUDNN], [test "x$build_cuda" = xyes -a "x$have_cudnn" = xyes])
AS_IF([test "x$with_cuda" != xauto -a "x$with_cuda" != xno -a -n "$why_cuda"],
  [AC_MSG_ERROR([--with-cuda=$with_cuda given but: $why_cuda])])
AS_IF([test "x$build_cuda" = xyes],
  [cuda_note=" (toolkit $CUDA_HOME; GPU code for compute capability $with_cuda_arch, PTX for the newest$cudnn_note)"])
])

dnl _KILN_CUDA_TOOLKIT: CUDA_HOME, NVCC, CUDA_LIBDIR (static cudart) and
dnl cuBLASLt; why_cuda says what is missing.
AC_DEFUN([_KILN_CUDA_TOOLKIT], [
  AS_CASE([$with_cuda], [yes|auto], [CUDA_HOME=/usr/local/cuda], [CUDA_HOME=$with_cuda])
  AS_IF([test "x$with_cuda" = xno], [why_cuda="disabled by --without-cuda"],
    [test ! -d "$CUDA_HOME"], [why_cuda="no CUDA toolkit at $CUDA_HOME (--with-cuda=PATH)"])
  AS_IF([test -z "$why_cuda"], [
    AC_PATH_PROG([NVCC], [nvcc], [], [$CUDA_HOME/bin])
    AS_IF([test -z "$NVCC"], [why_cuda="nvcc not found in $CUDA_HOME/bin"])])
  AS_IF([test -z "$why_cuda"], [
    CUDA_LIBDIR=
    for d in "$CUDA_HOME/lib64" "$CUDA_HOME/lib" "$CUDA_HOME/targets/x86_64-linux/lib"; do
      AS_IF([test -z "$CUDA_LIBDIR" -a -f "$d/libcudart_static.a"], [CUDA_LIBDIR=$d])
    done
    AS_IF([test -z "$CUDA_LIBDIR"], [why_cuda="libcudart_static.a not found under $CUDA_HOME"])])
  AS_IF([test -z "$why_cuda"], [
    kiln_save_CPPFLAGS=$CPPFLAGS
    kiln_save_LIBS=$LIBS
    CPPFLAGS="$CPPFLAGS -I$CUDA_HOME/include"
    dnl the cache would keep a previous --with-cuda's answer: ask each time
    AS_UNSET([ac_cv_header_cuda_runtime_api_h])
    AS_UNSET([ac_cv_header_cublasLt_h])
    AS_UNSET([ac_cv_lib_cublasLt_cublasLtCreate])
    AC_CHECK_HEADER([cuda_runtime_api.h], [], [why_cuda="cuda_runtime_api.h not found in $CUDA_HOME/include"])
    AS_IF([test -z "$why_cuda"], [
      AC_CHECK_HEADER([cublasLt.h], [], [why_cuda="cublasLt.h not found in $CUDA_HOME/include"])])
    AS_IF([test -z "$why_cuda"], [
      AC_CHECK_LIB([cublasLt], [cublasLtCreate], [:],
        [why_cuda="libcublasLt not found in $CUDA_LIBDIR"], [-L$CUDA_LIBDIR])])
    CPPFLAGS=$kiln_save_CPPFLAGS
    LIBS=$kiln_save_LIBS])
])

dnl _KILN_CUDA_ARCH: NVCC_GENCODE, CUDA_MIN_ARCH from --with-cuda-arch (an
dnl error for a list item that is not a compute capability like 90 or 90a).
AC_DEFUN([_KILN_CUDA_ARCH], [
    NVCC_GENCODE=
    CUDA_MIN_ARCH=
    cuda_max_arch=
    for a in `echo "$with_cuda_arch" | tr ',' ' '`; do
      AS_CASE([$a], [@<:@1-9@:>@@<:@0-9@:>@|@<:@1-9@:>@@<:@0-9@:>@a|@<:@1-9@:>@@<:@0-9@:>@@<:@0-9@:>@|@<:@1-9@:>@@<:@0-9@:>@@<:@0-9@:>@a], [],
        [AC_MSG_ERROR([--with-cuda-arch: '$a' is not a compute capability like 90 or 80])])
      NVCC_GENCODE="$NVCC_GENCODE -gencode arch=compute_$a,code=sm_$a"
      n=`echo "$a" | tr -d a`
      AS_IF([test -z "$CUDA_MIN_ARCH" || test "$n" -lt "$CUDA_MIN_ARCH"], [CUDA_MIN_ARCH=$n])
      AS_IF([test -z "$cuda_max_arch" || test "$n" -gt "`echo $cuda_max_arch | tr -d a`"], [cuda_max_arch=$a])
    done
    AS_IF([test -z "$cuda_max_arch"], [AC_MSG_ERROR([--with-cuda-arch is empty])])
    NVCC_GENCODE="$NVCC_GENCODE -gencode arch=compute_$cuda_max_arch,code=compute_$cuda_max_arch"
])

dnl _KILN_CUDNN: cuDNN 9 (the graph API: convolutions); without it the plugin
dnl still builds, refusing convolutions (batch norm and pooling are kiln's
dnl kernels).  Sets have_cudnn and cudnn_note; with cuDNN, adds it to
dnl CUDA_LIBS and KILN_HAVE_CUDNN to CUDA_CPPFLAGS.
AC_DEFUN([_KILN_CUDNN], [
    kiln_save_CPPFLAGS=$CPPFLAGS
    kiln_save_LIBS=$LIBS
    CPPFLAGS="$CPPFLAGS -I$CUDA_HOME/include"
    AS_UNSET([ac_cv_header_cudnn_graph_h])
    AS_UNSET([ac_cv_lib_cudnn_cudnnBackendCreateDescriptor])
    have_cudnn=no
    AC_CHECK_HEADER([cudnn_graph.h],
      [AC_CHECK_LIB([cudnn], [cudnnBackendCreateDescriptor], [have_cudnn=yes],
        [why_cudnn="libcudnn not found in $CUDA_LIBDIR"], [-L$CUDA_LIBDIR])],
      [why_cudnn="cudnn_graph.h (cuDNN 9) not found in $CUDA_HOME/include"])
    CPPFLAGS=$kiln_save_CPPFLAGS
    LIBS=$kiln_save_LIBS
    AS_IF([test "x$have_cudnn" = xyes],
      [CUDA_LIBS="-L$CUDA_LIBDIR -lcudnn $CUDA_LIBS"
       CUDA_CPPFLAGS="$CUDA_CPPFLAGS -DKILN_HAVE_CUDNN=1"
       cudnn_note="; cuDNN: convolutions"],
      [cudnn_note="; no cuDNN ($why_cudnn): convolutions refused"])
])
