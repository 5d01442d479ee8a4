/*
 * What queue depth 1 can reach on a set of links with no storage stack at
 * all: two bare programs exchanging the requests and answers a multipath
 * client and a target exchange for one request at a time. Each round moves
 * SIZE bytes split over the paths by weight (reads: one request per path
 * and its answer; writes: each path's share as requests of 64 KiB sent back
 * to back, then their acknowledgements, as braid sends a write), and the
 * next round starts only when every path is done. One thread per path, so
 * nothing one path does holds up another.
 *
 * bench/aggregate runs it beside braid's QD1 runs: when the machine, not
 * the links, limits a round (per-frame shaping on few CPUs), this shows how
 * far below the iperf3 limit queue depth 1 can get at all.
 *
 *   qd1floor serve ADDR:PORT...
 *   qd1floor read|write SECONDS SIZE PATH...
 *     PATH is LOCAL[%DEV]>REMOTE:PORT[=WEIGHT]
 *
 * The client prints one JSON line: MB/s, rounds and microseconds per round,
 * over SECONDS after one second of warm-up.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "fullio.h"

#define HEADER 16
#define WRITE_PIECE (64 * 1024)
#define MAX_PATHS 16
#define MAX_SECONDS 60

enum { OP_READ = 0, OP_WRITE = 1 };

static void die(const char *what) {
	perror(what);
	exit(1);
}

/* "ADDR:PORT" into a socket address; 0 if it is not one. */
static int parse_addr(const char *text, struct sockaddr_in *out) {
	char host[64];
	const char *colon = strrchr(text, ':');
	if (!colon || (size_t)(colon - text) >= sizeof host)
		return 0;
	memcpy(host, text, (size_t)(colon - text));
	host[colon - text] = 0;
	memset(out, 0, sizeof *out);
	out->sin_family = AF_INET;
	out->sin_port = htons((uint16_t)atoi(colon + 1));
	return inet_pton(AF_INET, host, &out->sin_addr) == 1;
}

static void nodelay(int fd) {
	int one = 1;
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

/* ---- the answering side */

static void *answer(void *arg) {
	int fd = (int)(intptr_t)arg;
	size_t cap = 0;
	char *data = NULL;
	char header[HEADER];
	while (take(fd, header, HEADER)) {
		uint32_t op, len;
		memcpy(&op, header, 4);
		memcpy(&len, header + 4, 4);
		if (len > cap) {
			free(data);
			cap = len;
			data = calloc(1, cap);
			if (!data)
				break;
		}
		int ok = op == OP_READ ? give(fd, header, HEADER) && give(fd, data, len)
				       : take(fd, data, len) && give(fd, header, HEADER);
		if (!ok)
			break;
	}
	free(data);
	close(fd);
	return NULL;
}

static void *listener(void *arg) {
	int l = (int)(intptr_t)arg;
	for (;;) {
		int fd = accept(l, NULL, NULL);
		if (fd < 0)
			continue;
		nodelay(fd);
		pthread_t t;
		if (pthread_create(&t, NULL, answer, (void *)(intptr_t)fd) == 0)
			pthread_detach(t);
		else
			close(fd);
	}
	return NULL;
}

static int serve(int argc, char **argv) {
	for (int i = 0; i < argc; i++) {
		struct sockaddr_in a;
		if (!parse_addr(argv[i], &a)) {
			fprintf(stderr, "qd1floor: %s is not ADDR:PORT\n", argv[i]);
			return 2;
		}
		int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
		setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
		if (l < 0 || bind(l, (struct sockaddr *)&a, sizeof a) || listen(l, 16))
			die(argv[i]);
		pthread_t t;
		if (pthread_create(&t, NULL, listener, (void *)(intptr_t)l))
			die("pthread_create");
	}
	for (;;)
		pause();
}

/* ---- the asking side */

struct path {
	int fd;
	uint32_t bytes; /* this path's share of every round */
	char *data;
};

static int op;
static volatile int stopping;
static pthread_barrier_t round_start, round_end;

/* One path's part of one round. */
static int exchange(struct path *p) {
	char header[HEADER] = {0};
	memcpy(header, &op, 4);
	if (op == OP_READ) {
		memcpy(header + 4, &p->bytes, 4);
		return give(p->fd, header, HEADER) && take(p->fd, header, HEADER) &&
		       take(p->fd, p->data, p->bytes);
	}
	uint32_t pieces = 0;
	for (uint32_t at = 0; at < p->bytes; at += WRITE_PIECE, pieces++) {
		uint32_t len = p->bytes - at < WRITE_PIECE ? p->bytes - at : WRITE_PIECE;
		memcpy(header + 4, &len, 4);
		if (!give(p->fd, header, HEADER) || !give(p->fd, p->data + at, len))
			return 0;
	}
	for (uint32_t i = 0; i < pieces; i++)
		if (!take(p->fd, header, HEADER))
			return 0;
	return 1;
}

static void *run_path(void *arg) {
	struct path *p = arg;
	for (;;) {
		pthread_barrier_wait(&round_start);
		if (stopping)
			return NULL;
		if (p->bytes && !exchange(p)) {
			fprintf(stderr, "qd1floor: the connection ended mid-round\n");
			exit(1);
		}
		pthread_barrier_wait(&round_end);
	}
}

/* "LOCAL[%DEV]>REMOTE:PORT[=WEIGHT]": a connected socket and its weight. */
static int dial(char *spec, double *weight) {
	char *gt = strchr(spec, '>');
	if (!gt)
		return -1;
	*gt = 0;
	char *remote = gt + 1, *eq = strchr(remote, '=');
	*weight = 1.0;
	if (eq) {
		*eq = 0;
		*weight = atof(eq + 1);
	}
	char *dev = strchr(spec, '%');
	if (dev)
		*dev++ = 0;
	struct sockaddr_in local, peer;
	char local_text[80];
	snprintf(local_text, sizeof local_text, "%s:0", spec);
	if (!parse_addr(local_text, &local) || !parse_addr(remote, &peer) || *weight <= 0)
		return -1;
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	if (fd < 0)
		die("socket");
	if (dev && setsockopt(fd, SOL_SOCKET, SO_BINDTODEVICE, dev, (socklen_t)strlen(dev)))
		die(dev);
	if (bind(fd, (struct sockaddr *)&local, sizeof local))
		die(spec);
	if (connect(fd, (struct sockaddr *)&peer, sizeof peer))
		die(remote);
	nodelay(fd);
	return fd;
}

static int ask(int argc, char **argv) {
	op = strcmp(argv[0], "write") == 0 ? OP_WRITE : OP_READ;
	double seconds = atof(argv[1]);
	long long size = atoll(argv[2]);
	int n = argc - 3;
	if (seconds <= 0 || seconds > MAX_SECONDS || size < 4096 || size > (1 << 30) || n < 1 ||
	    n > MAX_PATHS) {
		fprintf(stderr, "qd1floor: SECONDS in (0, %d], SIZE in [4096, 1 GiB], 1 to %d paths\n",
			MAX_SECONDS, MAX_PATHS);
		return 2;
	}
	static struct path paths[MAX_PATHS];
	double weight[MAX_PATHS], total = 0;
	for (int i = 0; i < n; i++) {
		paths[i].fd = dial(argv[3 + i], &weight[i]);
		if (paths[i].fd < 0) {
			fprintf(stderr, "qd1floor: %s is not LOCAL[%%DEV]>REMOTE:PORT[=WEIGHT]\n", argv[3 + i]);
			return 2;
		}
		total += weight[i];
	}
	/* Shares in whole 4 KiB blocks; what rounding leaves goes to the
	 * heaviest path, where a block costs the least time. */
	long long left = size;
	int heaviest = 0;
	for (int i = 0; i < n; i++) {
		paths[i].bytes = (uint32_t)((long long)((double)size * weight[i] / total) / 4096 * 4096);
		left -= paths[i].bytes;
		if (weight[i] > weight[heaviest])
			heaviest = i;
	}
	paths[heaviest].bytes += (uint32_t)left;
	pthread_barrier_init(&round_start, NULL, (unsigned)n + 1);
	pthread_barrier_init(&round_end, NULL, (unsigned)n + 1);
	for (int i = 0; i < n; i++) {
		paths[i].data = calloc(1, paths[i].bytes + 1);
		pthread_t t;
		if (!paths[i].data || pthread_create(&t, NULL, run_path, &paths[i]))
			die("path thread");
	}
	long rounds = 0;
	double t0 = now(), t = t0, warm = 1.0;
	for (int measuring = 0; measuring < 2; measuring++) {
		double until = (measuring ? seconds : warm);
		rounds = 0;
		t0 = now();
		do {
			pthread_barrier_wait(&round_start);
			pthread_barrier_wait(&round_end);
			rounds++;
		} while ((t = now()) - t0 < until);
	}
	stopping = 1;
	pthread_barrier_wait(&round_start);
	printf("{\"mb_s\": %.1f, \"rounds\": %ld, \"us_per_round\": %.0f, \"shares\": [",
	       (double)rounds * (double)size / (t - t0) / 1e6, rounds, (t - t0) / (double)rounds * 1e6);
	for (int i = 0; i < n; i++)
		printf("%s%u", i ? ", " : "", paths[i].bytes);
	printf("]}\n");
	return 0;
}

int main(int argc, char **argv) {
	if (argc >= 3 && strcmp(argv[1], "serve") == 0)
		return serve(argc - 2, argv + 2);
	if (argc >= 5 && (strcmp(argv[1], "read") == 0 || strcmp(argv[1], "write") == 0))
		return ask(argc - 1, argv + 1);
	fprintf(stderr, "usage: qd1floor serve ADDR:PORT...\n"
			"       qd1floor read|write SECONDS SIZE LOCAL[%%DEV]>REMOTE:PORT[=WEIGHT]...\n");
	return 2;
}
