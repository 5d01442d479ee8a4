/*
 * Whole-buffer socket I/O and a monotonic clock for the bare benchmark
 * programs (bench/roundtrip.c, bench/qd1floor.c): each is one file built by
 * gcc alone, so what they share lives here, not in a library.
 */
#ifndef BRAID_BENCH_FULLIO_H
#define BRAID_BENCH_FULLIO_H

#include <stddef.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

/* Reads exactly n bytes into buf; 0 at end of stream or on an error. */
static inline int take(int fd, char *buf, size_t n) {
	for (size_t got = 0; got < n;) {
		ssize_t r = read(fd, buf + got, n - got);
		if (r <= 0)
			return 0;
		got += (size_t)r;
	}
	return 1;
}

/* Writes all n bytes of buf; 0 on an error. */
static inline int give(int fd, const char *buf, size_t n) {
	for (size_t sent = 0; sent < n;) {
		ssize_t w = write(fd, buf + sent, n - sent);
		if (w <= 0)
			return 0;
		sent += (size_t)w;
	}
	return 1;
}

/* Seconds on the monotonic clock. */
static inline double now(void) {
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

#endif
