/* plugins/cpu/fft16.h - 16 x 16 real 2-d DFTs of 16 planes at once, one
 * plane a lane of AVX-512 vectors (fft16.c), for fftconv.c's 16 x 16
 * transforms (the CNN's conv2).
 *
 * FFTW transforms one plane at a time, and its real-input codelets are
 * scalar: 0.33-0.39 us a 16 x 16 plane on the Zen 4 at its best plan
 * (FFTW_PATIENT, the planes interleaved or not), ~14% of the CNN's CPU
 * samples.  Here every arithmetic instruction works on 16 planes, and a
 * frequency's 16 values come out as one vector: the line
 * fftconv_planes.c stores into that frequency's matrix, with no transpose.
 *
 * Buffers are arrays of "lines", 16 floats each, 64-byte aligned; lane p
 * of every line belongs to plane p.  The functions are pure (no state,
 * any thread) and need AVX-512F: call them only when cpu_fft16_ok().
 * They give FFTW's results to rounding (the same definitions; other
 * roundings: tests/check_cpu_fft16.c bounds the difference), and the
 * same bits on every call, whatever the thread. */
#ifndef KILN_CPU_FFT16_H
#define KILN_CPU_FFT16_H

/* Lines a buffer holds: the planes (n1 n2 = 256), the spectra (nf = 16 x
 * 9 = 144 complex, a line of real parts then a line of imaginary parts
 * each). */
enum { FFT16_PLANE_LINES = 256, FFT16_SPEC_LINES = 288 };

/* 1 when this build and this CPU run fft16.c (AVX-512F); 0 otherwise. */
int cpu_fft16_ok(void);

/* The forward real-to-complex transform of 16 planes: x[(r 16 + q) 16 +
 * p] = element (r, q) of plane p, rows r >= h (h <= 16) zero and not
 * read; out[(2 k) 16 + p], out[(2 k + 1) 16 + p] = the real and imaginary
 * parts of plane p's frequency k = k1 9 + k2 (k1 < 16, k2 <= 8: FFTW's
 * r2c order), sum over r, q of x(r, q) e^(-2 pi i (k1 r + k2 q) / 16),
 * unnormalised.  x and out do not overlap. */
void cpu_fft16_r2c(const float *x, int h, float *out);

/* The inverse, complex-to-real, of 16 spectra in `in` (out's layout
 * above; overwritten): z[(r 16 + q) 16 + p] = sum over all 256
 * frequencies of the Hermitian spectrum those 144 are half of,
 * e^(+2 pi i (k1 r + k2 q) / 16): 256 times the plane, as FFTW's c2r.
 * As FFTW, the columns k2 = 0 and 8 are taken as Hermitian: after the
 * transforms along k1, their imaginary parts are not read. */
void cpu_fft16_c2r(float *in, float *z);

#endif
