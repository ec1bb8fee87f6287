/*
 * How fast a relay that ends one TCP connection and opens another can move bytes on this machine,
 * against the same bytes sent straight: the floor under the egress gateway's throughput, measured
 * apart from the server (docs/benchmarks.md, "Egress").
 *
 * Three processes on loopback: a sender writes SIZE MiB, a reader counts them; in `splice` and
 * `sockmap` modes a relay sits between them (the sender dials the relay, the relay dials the
 * reader). The reader prints the throughput from its first byte to its last.
 *
 *   cc -O2 -o /tmp/relay_floor bench/relay_floor.c
 *   /tmp/relay_floor direct|splice|sockmap [SIZE_MIB, default 1024]
 *
 * `splice` is the gateway's relay: socket → pipe → socket, 1 MiB pipe (PIPE=bytes to change it;
 * LOWAT=bytes sets SO_RCVLOWAT on the socket it reads). `sockmap` attaches a hand-written
 * SK_SKB stream-verdict program to a SOCKMAP, each socket's data redirected to the other's
 * egress (needs root). The sender waits 300 ms before writing so that both sockets are in the map
 * before any data arrives: data queued before is not run through the verdict.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/bpf.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define CHUNK (1 << 20)
enum { READER_PORT = 7001, RELAY_PORT = 7002 };

static void die(const char *what) {
    perror(what);
    exit(1);
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static struct sockaddr_in loopback(int port) {
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    return a;
}

static int listen_on(int port) {
    int s = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    struct sockaddr_in a = loopback(port);
    setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(s, (struct sockaddr *)&a, sizeof a) || listen(s, 16))
        die("listen");
    return s;
}

static int dial(int port) {
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = loopback(port);
    for (int tries = 0; tries < 100; tries++) {
        if (!connect(s, (struct sockaddr *)&a, sizeof a))
            return s;
        usleep(20000);
    }
    die("connect");
    return -1;
}

static long env_long(const char *name, long otherwise) {
    const char *value = getenv(name);
    return value ? atol(value) : otherwise;
}

static void relay_splice(int from, int to) {
    int pipe_fds[2];
    int size = (int)env_long("PIPE", CHUNK), lowat = (int)env_long("LOWAT", 0);
    if (pipe(pipe_fds))
        die("pipe");
    fcntl(pipe_fds[0], F_SETPIPE_SZ, size);
    if (lowat)
        setsockopt(from, SOL_SOCKET, SO_RCVLOWAT, &lowat, sizeof lowat);
    for (;;) {
        ssize_t in = splice(from, NULL, pipe_fds[1], NULL, size, SPLICE_F_MOVE);
        if (in <= 0)
            return;
        while (in > 0) {
            ssize_t out = splice(pipe_fds[0], NULL, to, NULL, in, SPLICE_F_MOVE);
            if (out <= 0)
                die("splice out");
            in -= out;
        }
    }
}

static long bpf(int cmd, union bpf_attr *attr) { return syscall(SYS_bpf, cmd, attr, sizeof *attr); }

static int map_create(int type, int key, int value, int entries) {
    union bpf_attr a = {0};
    a.map_type = type;
    a.key_size = key;
    a.value_size = value;
    a.max_entries = entries;
    int fd = (int)bpf(BPF_MAP_CREATE, &a);
    if (fd < 0)
        die("map create");
    return fd;
}

static void map_put(int map, const void *key, const void *value) {
    union bpf_attr a = {0};
    a.map_fd = map;
    a.key = (unsigned long)key;
    a.value = (unsigned long)value;
    a.flags = BPF_ANY;
    if (bpf(BPF_MAP_UPDATE_ELEM, &a))
        die("map update");
}

#define INSN(c, d, s, o, i) ((struct bpf_insn){.code = (c), .dst_reg = (d), .src_reg = (s), .off = (o), .imm = (i)})

/* peer_of: socket cookie → index of the other socket in `sockets`. */
static void relay_sockmap(int a_fd, int b_fd) {
    int peer_of = map_create(BPF_MAP_TYPE_HASH, 8, 4, 64);
    int sockets = map_create(BPF_MAP_TYPE_SOCKMAP, 4, 4, 64);
    struct bpf_insn program[] = {
        INSN(BPF_ALU64 | BPF_MOV | BPF_X, 6, 1, 0, 0),                /* r6 = skb */
        INSN(BPF_JMP | BPF_CALL, 0, 0, 0, BPF_FUNC_get_socket_cookie), /* r0 = cookie */
        INSN(BPF_STX | BPF_MEM | BPF_DW, 10, 0, -8, 0),                /* stack[-8] = r0 */
        INSN(BPF_LD | BPF_IMM | BPF_DW, 1, BPF_PSEUDO_MAP_FD, 0, peer_of),
        INSN(0, 0, 0, 0, 0),
        INSN(BPF_ALU64 | BPF_MOV | BPF_X, 2, 10, 0, 0),
        INSN(BPF_ALU64 | BPF_ADD | BPF_K, 2, 0, 0, -8),                /* r2 = &cookie */
        INSN(BPF_JMP | BPF_CALL, 0, 0, 0, BPF_FUNC_map_lookup_elem),
        INSN(BPF_JMP | BPF_JEQ | BPF_K, 0, 0, 7, 0),                   /* no peer: pass */
        INSN(BPF_LDX | BPF_MEM | BPF_W, 3, 0, 0, 0),                   /* r3 = peer index */
        INSN(BPF_LD | BPF_IMM | BPF_DW, 2, BPF_PSEUDO_MAP_FD, 0, sockets),
        INSN(0, 0, 0, 0, 0),
        INSN(BPF_ALU64 | BPF_MOV | BPF_X, 1, 6, 0, 0),
        INSN(BPF_ALU64 | BPF_MOV | BPF_K, 4, 0, 0, 0),                 /* flags 0: egress */
        INSN(BPF_JMP | BPF_CALL, 0, 0, 0, BPF_FUNC_sk_redirect_map),
        INSN(BPF_JMP | BPF_EXIT, 0, 0, 0, 0),
        INSN(BPF_ALU64 | BPF_MOV | BPF_K, 0, 0, 0, SK_PASS),
        INSN(BPF_JMP | BPF_EXIT, 0, 0, 0, 0),
    };
    static char log[65536];
    union bpf_attr a = {0};
    a.prog_type = BPF_PROG_TYPE_SK_SKB;
    a.insns = (unsigned long)program;
    a.insn_cnt = sizeof program / sizeof program[0];
    a.license = (unsigned long)"GPL";
    a.log_buf = (unsigned long)log;
    a.log_size = sizeof log;
    a.log_level = 1;
    int prog = (int)bpf(BPF_PROG_LOAD, &a);
    if (prog < 0) {
        fprintf(stderr, "%s\n", log);
        die("program load");
    }
    memset(&a, 0, sizeof a);
    a.target_fd = sockets;
    a.attach_bpf_fd = prog;
    a.attach_type = BPF_SK_SKB_STREAM_VERDICT;
    if (bpf(BPF_PROG_ATTACH, &a))
        die("attach");
    unsigned long long a_cookie, b_cookie;
    socklen_t len = sizeof a_cookie;
    if (getsockopt(a_fd, SOL_SOCKET, SO_COOKIE, &a_cookie, &len) ||
        getsockopt(b_fd, SOL_SOCKET, SO_COOKIE, &b_cookie, &len))
        die("SO_COOKIE");
    unsigned a_index = 0, b_index = 1;
    map_put(peer_of, &a_cookie, &b_index);
    map_put(peer_of, &b_cookie, &a_index);
    map_put(sockets, &a_index, &a_fd);
    map_put(sockets, &b_index, &b_fd);
    struct pollfd hangup = {.fd = a_fd, .events = POLLRDHUP};
    poll(&hangup, 1, -1);
    sleep(1);
}

int main(int argc, char **argv) {
    if (argc < 2 || (strcmp(argv[1], "direct") && strcmp(argv[1], "splice") && strcmp(argv[1], "sockmap"))) {
        fprintf(stderr, "usage: %s direct|splice|sockmap [SIZE_MIB]\n", argv[0]);
        return 2;
    }
    const char *mode = argv[1];
    long total = (argc > 2 ? atol(argv[2]) : 1024) << 20;
    int direct = !strcmp(mode, "direct");
    setpgid(0, 0);
    int reader_listener = listen_on(READER_PORT);
    int relay_listener = direct ? -1 : listen_on(RELAY_PORT);
    if (fork() == 0) {
        int s = dial(direct ? READER_PORT : RELAY_PORT);
        char *chunk = malloc(CHUNK);
        memset(chunk, 'x', CHUNK);
        usleep(300000);
        for (long sent = 0; sent < total;) {
            ssize_t n = write(s, chunk, CHUNK);
            if (n <= 0)
                die("write");
            sent += n;
        }
        pause();
    }
    if (!direct && fork() == 0) {
        int client = accept(relay_listener, NULL, NULL);
        int upstream = dial(READER_PORT);
        if (!strcmp(mode, "splice"))
            relay_splice(client, upstream);
        else
            relay_sockmap(client, upstream);
        pause();
    }
    int s = accept(reader_listener, NULL, NULL);
    char *buffer = malloc(CHUNK);
    long got = 0;
    double start = 0;
    while (got < total) {
        ssize_t n = read(s, buffer, CHUNK);
        if (n <= 0)
            die("read");
        if (!start)
            start = now();
        got += n;
    }
    double seconds = now() - start;
    printf("%s: %ld MiB in %.3f s = %.0f MB/s\n", mode, got >> 20, seconds, got / seconds / 1e6);
    fflush(stdout);
    signal(SIGTERM, SIG_IGN);
    kill(0, SIGTERM);
    return 0;
}
