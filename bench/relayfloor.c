/*
 * What relaying a write costs with no storage stack at all: the part of
 * `braid attach`'s work for a large WRITE that no engine can avoid. A
 * feeder writes 1 MiB payloads into a Unix socket (the local client's
 * side), the relay takes each one off it and sends it on to a loopback
 * TCP socket (a path), and a sink reads and drops it (the target). The
 * relay moves each payload one of four ways:
 *
 *   copy      read() into one of 64 buffers, write() to the TCP socket:
 *             two copies, what attach does today
 *   vmsplice  read() into a buffer, vmsplice() its pages into a pipe and
 *             splice() the pipe into the TCP socket (the lending trial)
 *   splice    splice() the Unix socket into a pipe and the pipe into the
 *             TCP socket: no copy in the relay, and nothing kept
 *   tee       as splice, and tee() each piece into a pipe held for later
 *             (32 of them, reused in turn, emptied before reuse): the
 *             "tee design", where the replay window keeps a payload as
 *             page references until a FLUSH covers it
 *
 *   relayfloor copy|vmsplice|splice|tee [MIB]
 *
 * MIB (default 4096, at most 65536) is how much is moved. It prints one
 * line: the relay's and the sink's CPU seconds per GiB (user + system) and
 * MiB/s over the whole transfer.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fullio.h"

#define CHUNK (1 << 20)
#define BUFFERS 64
#define HELD 32

enum mode { COPY, VMSPLICE, SPLICE, TEE };

static void die(const char *what) {
	perror(what);
	exit(1);
}

static double cpu_seconds(const struct rusage *ru) {
	return (double)ru->ru_utime.tv_sec + (double)ru->ru_utime.tv_usec / 1e6 +
	       (double)ru->ru_stime.tv_sec + (double)ru->ru_stime.tv_usec / 1e6;
}

/* Moves n bytes from pipe p into socket s. */
static void drain_into(int p, int s, size_t n) {
	while (n) {
		ssize_t k = splice(p, NULL, s, NULL, n, SPLICE_F_MOVE | SPLICE_F_MORE);
		if (k <= 0)
			die("splice into the socket");
		n -= (size_t)k;
	}
}

/* Duplicates n bytes at the head of pipe p into pipe held, leaving p. */
static void keep(int p, int held, size_t n) {
	while (n) {
		ssize_t k = tee(p, held, n, 0);
		if (k <= 0)
			die("tee into the held pipe");
		n -= (size_t)k;
	}
}

/* Empties a held pipe (nonblocking read end), as a FLUSH would. */
static void release(int held, int devnull) {
	while (splice(held, NULL, devnull, NULL, CHUNK, SPLICE_F_NONBLOCK) > 0) {
	}
}

static int pipe_of(size_t size, int flags, int fds[2]) {
	if (pipe2(fds, flags) != 0)
		return 0;
	return fcntl(fds[1], F_SETPIPE_SZ, (int)size) >= 0;
}

/* The sink: reads everything, then reports its own CPU on `report`. */
static void sink(int listener, int report) {
	int c = accept(listener, NULL, NULL);
	if (c < 0)
		die("accept");
	char *buf = malloc(CHUNK);
	if (!buf)
		die("malloc");
	while (read(c, buf, CHUNK) > 0) {
	}
	struct rusage ru;
	getrusage(RUSAGE_SELF, &ru);
	double cpu = cpu_seconds(&ru);
	if (write(report, &cpu, sizeof cpu) != sizeof cpu)
		die("report");
	exit(0);
}

static void feeder(int sock, size_t chunks) {
	char *buf = malloc(CHUNK);
	if (!buf)
		die("malloc");
	memset(buf, 0x5a, CHUNK);
	for (size_t i = 0; i < chunks; i++)
		if (!give(sock, buf, CHUNK))
			die("feeder write");
	exit(0);
}

static void relay(enum mode mode, int from, int to, size_t chunks) {
	int pipe_fds[2];
	if (mode != COPY && !pipe_of(CHUNK, 0, pipe_fds))
		die("the relay's pipe");
	int held[HELD][2];
	int devnull = open("/dev/null", O_WRONLY);
	if (devnull < 0)
		die("/dev/null");
	if (mode == TEE)
		for (int i = 0; i < HELD; i++)
			if (!pipe_of(CHUNK, O_NONBLOCK, held[i]))
				die("a held pipe (see /proc/sys/fs/pipe-user-pages-soft)");
	char *bufs[BUFFERS];
	for (int i = 0; i < BUFFERS; i++)
		if (!(bufs[i] = aligned_alloc(4096, CHUNK)))
			die("aligned_alloc");
	for (size_t i = 0; i < chunks; i++) {
		char *buf = bufs[i % BUFFERS];
		if (mode == COPY) {
			if (!take(from, buf, CHUNK) || !give(to, buf, CHUNK))
				die("copy");
		} else if (mode == VMSPLICE) {
			if (!take(from, buf, CHUNK))
				die("read");
			for (size_t at = 0; at < CHUNK;) {
				struct iovec v = {buf + at, CHUNK - at};
				ssize_t k = vmsplice(pipe_fds[1], &v, 1, 0);
				if (k <= 0)
					die("vmsplice");
				drain_into(pipe_fds[0], to, (size_t)k);
				at += (size_t)k;
			}
		} else {
			int *h = held[i % HELD];
			if (mode == TEE)
				release(h[0], devnull);
			for (size_t at = 0; at < CHUNK;) {
				ssize_t k = splice(from, NULL, pipe_fds[1], NULL, CHUNK - at,
						   SPLICE_F_MOVE);
				if (k <= 0)
					die("splice from the Unix socket");
				if (mode == TEE)
					keep(pipe_fds[0], h[1], (size_t)k);
				drain_into(pipe_fds[0], to, (size_t)k);
				at += (size_t)k;
			}
		}
	}
}

int main(int argc, char **argv) {
	static const char *names[] = {"copy", "vmsplice", "splice", "tee"};
	int mode = -1;
	for (int i = 0; argc >= 2 && i < 4; i++)
		if (strcmp(argv[1], names[i]) == 0)
			mode = i;
	long mib = argc >= 3 ? atol(argv[2]) : 4096;
	if (mode < 0 || argc > 3 || mib < 1 || mib > 65536) {
		fprintf(stderr, "usage: relayfloor copy|vmsplice|splice|tee [MIB, 1 to 65536]\n");
		return 2;
	}
	int unix_pair[2];
	if (socketpair(AF_UNIX, SOCK_STREAM, 0, unix_pair) != 0)
		die("socketpair");
	int listener = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in addr = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t len = sizeof addr;
	if (listener < 0 || bind(listener, (void *)&addr, sizeof addr) != 0 ||
	    getsockname(listener, (void *)&addr, &len) != 0 || listen(listener, 1) != 0)
		die("listen on loopback");
	int report[2];
	if (pipe(report) != 0)
		die("pipe");
	pid_t sink_pid = fork();
	if (sink_pid == 0)
		sink(listener, report[1]);
	pid_t feeder_pid = fork();
	if (feeder_pid == 0)
		feeder(unix_pair[0], (size_t)mib);
	close(unix_pair[0]);
	int path = socket(AF_INET, SOCK_STREAM, 0);
	if (path < 0 || connect(path, (void *)&addr, sizeof addr) != 0)
		die("connect");
	double start = now();
	relay((enum mode)mode, unix_pair[1], path, (size_t)mib);
	double wall = now() - start;
	struct rusage ru;
	getrusage(RUSAGE_SELF, &ru);
	shutdown(path, SHUT_WR);
	double sink_cpu = 0;
	if (read(report[0], &sink_cpu, sizeof sink_cpu) != sizeof sink_cpu)
		die("the sink's report");
	waitpid(sink_pid, NULL, 0);
	waitpid(feeder_pid, NULL, 0);
	double gib = (double)mib / 1024;
	printf("%-8s relay %.3f s/GiB  sink %.3f s/GiB  %.0f MiB/s\n", names[mode],
	       cpu_seconds(&ru) / gib, sink_cpu / gib, (double)mib / wall);
	return 0;
}
