// CPU lab (not built by default): how many 512-bit vpdpbusd one core retires per second, the
// bound of the int8 dot kernels (src/backend/cpu/int8_dot.cpp), and a dependent-add clock.
// Build and run: gcc -O2 -march=native tools/lab/vnni_throughput.c -o /tmp/vnni && /tmp/vnni
#include <immintrin.h>
#include <stdio.h>
#include <time.h>

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(void) {
  // Four dependent 1-cycle adds a loop trip: trips x 4 / seconds approximates the clock.
  const long trips = 2000000000L;
  long x = 0;
  double t0 = now();
  for (long i = 0; i < trips; i++) {
    __asm__ volatile("add $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\tadd $1, %0" : "+r"(x));
  }
  double t1 = now();
  printf("dependent adds: %.2f G/s (about the clock)\n", 4.0 * trips / (t1 - t0) / 1e9);

  // 12 independent accumulators: enough to cover the instruction's latency, so the loop is
  // bound by throughput. Each instruction is 64 u8 x s8 products.
  __m512i acc[12];
  for (int j = 0; j < 12; j++) acc[j] = _mm512_set1_epi32(j);
  __m512i u = _mm512_set1_epi8(3), s = _mm512_set1_epi8(5);
  const long rounds = 200000000L;
  t0 = now();
  for (long i = 0; i < rounds; i++) {
    for (int j = 0; j < 12; j++) acc[j] = _mm512_dpbusd_epi32(acc[j], u, s);
    __asm__ volatile("" : "+v"(u), "+v"(s));  // keeps the operands from being hoisted
  }
  t1 = now();
  int sum = 0;
  for (int j = 0; j < 12; j++) sum += _mm512_reduce_add_epi32(acc[j]);
  const double per_s = 12.0 * rounds / (t1 - t0);
  printf("vpdpbusd zmm: %.2f G/s = %.0f G int8 products/s (checksum %d)\n", per_s / 1e9,
         per_s * 64 / 1e9, sum);
  return 0;
}
