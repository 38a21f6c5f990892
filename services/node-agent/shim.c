/* The worker shim ("gpusched-shim"): one small process per worker, between the node-agent
 * and the workload, that ends the workload on its own when the node's lease runs out.
 * The agent spawns it with posix_spawn (shim_process.py); the package build, or
 * deploy/setup.sh in a checkout, compiles it beside shim_process.py.
 *
 *   gpusched-shim [--lease PATH] --kill-wait S --status PATH [--poll S]
 *                 [--cwd DIR] [--output PATH] [--written-fd N] -- CMD ARGS...
 *
 * - --cwd DIR: the worker's folder, made (with its parents) and entered first; an
 *   earlier run's status file in it is removed before anything starts.
 * - --output PATH: the file (made, or appended to) that the shim's and its workload's
 *   stdout and stderr go to, opened once the folder is entered.
 * - Starts CMD in a new session (its own process group, whose id is its pid) with the
 *   shim's environment, every signal at its default and none blocked.
 * - Writes the status file (JSON, replaced atomically) right after the start:
 *   shim_pid, pid, pgid, command, lease, kill_wait, poll, boot_id, shim_start,
 *   started_at, pid_start; at the end it adds ended_at, exit_code, signal, fenced,
 *   reason (exit_code is the workload's code, null when a signal ended it; signal is
 *   that signal or 0). A workload that cannot start gets pid null and exit code 127.
 * - --written-fd N: a pipe on which the workload's pid (nothing when it did not start)
 *   is written once the first status is, then closed, so the agent reads no file.
 * - SIGTERM or SIGINT to the shim: SIGTERM to the workload's group, SIGKILL to the group
 *   --kill-wait seconds later if it is still there.
 * - Fencing: the shim reads the lease (lease.py: an expiry in epoch seconds as text)
 *   and sleeps until that expiry or --poll, whichever is sooner (the agent may renew or
 *   revoke it meanwhile). Once the clock passes the expiry it stops the group the same
 *   way and marks the end fenced. Hence the bound the scheduler relies on to place the
 *   job elsewhere:  a workload never runs past  lease expiry + kill_wait + poll  (plus
 *   the moment the kernel takes to deliver SIGKILL). A lease that has already expired
 *   when the shim starts means the workload never starts.
 * - When the workload's leader exits, whatever is left of its group is stopped the same
 *   way; the shim exits once the whole group is gone, with a code that mirrors the
 *   workload's (128 + signal when a signal ended it). Bad arguments: exit code 2, with
 *   the field named on stderr.
 *
 * The shim depends on nothing from the agent once started: in its own session it keeps
 * working (and fencing) when the agent is frozen (SIGSTOP) or killed. It makes itself
 * the child subreaper, so the workload's orphaned children are reaped here and never
 * linger as zombies that would look like a live group. A process that leaves the group
 * (its own setsid) escapes the shim; containing that takes a cgroup. Linux only (prctl,
 * /proc). Tests: tests/unit/node_agent/test_shim.py and test_shim_process.py. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define EXIT_NOT_STARTED 127
#define EXIT_USAGE 2

extern char **environ;

static volatile sig_atomic_t term_requested;

struct shim {
    char **command;
    const char *status_path, *lease, *cwd, *output;
    double kill_wait, poll;
    int written_fd;
    char boot_id[64];
    long long shim_start;             /* -1: unknown */
    /* the status, as it grows */
    int started, has_pid_start, ended, fenced, killed, leader_reaped, exit_code, signal;
    pid_t pid;
    long long pid_start;
    double started_at, ended_at, kill_at;   /* kill_at < 0: no kill pending */
    char why_stopped[96], reason[256];
};

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void on_term(int sig) { (void)sig; term_requested = 1; }
static void on_child(int sig) { (void)sig; }

/* --- small readers ----------------------------------------------------------------- */
static ssize_t read_small(const char *path, char *buf, size_t size) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t n = read(fd, buf, size - 1);
    close(fd);
    if (n >= 0)
        buf[n] = 0;
    return n;
}

/* The lease's expiry (lease.py: a decimal float as text); 0 when missing or garbled. */
static double read_expiry(const char *path) {
    char buf[65], *end;
    if (read_small(path, buf, sizeof buf) <= 0 || strpbrk(buf, "xXpP"))
        return 0.0;
    errno = 0;
    double value = strtod(buf, &end);
    if (end == buf || errno == ERANGE)
        return 0.0;
    while (*end == ' ' || *end == '\n' || *end == '\t' || *end == '\r')
        end++;
    return *end || !isfinite(value) ? 0.0 : value;
}

/* A process's start in clock ticks since boot (field 22 of /proc/PID/stat); -1 if gone. */
static long long proc_start(pid_t pid) {
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    if (read_small(path, buf, sizeof buf) <= 0)
        return -1;
    char *p = strrchr(buf, ')');
    if (!p)
        return -1;
    p += 2;                           /* the state letter: field 3 */
    for (int field = 3; field < 22; field++) {
        p = strchr(p, ' ');
        if (!p)
            return -1;
        p++;
    }
    return strtoll(p, NULL, 10);
}

/* --- the status file (JSON, replaced atomically) --------------------------------- */
struct out { char *buf; size_t len, cap; };

static void put(struct out *o, const char *s, size_t n) {
    if (o->len + n + 1 > o->cap) {
        o->cap = (o->len + n + 1) * 2;
        o->buf = realloc(o->buf, o->cap);
        if (!o->buf)
            _exit(1);
    }
    memcpy(o->buf + o->len, s, n);
    o->len += n;
}

static void puts_(struct out *o, const char *s) { put(o, s, strlen(s)); }

/* Length of the valid UTF-8 sequence at s (0: not one). */
static int utf8_len(const unsigned char *s) {
    int n = s[0] >= 0xf0 && s[0] <= 0xf4 ? 4 : s[0] >= 0xe0 ? 3 : s[0] >= 0xc2 && s[0] < 0xe0 ? 2 : 0;
    for (int i = 1; i < n; i++)
        if ((s[i] & 0xc0) != 0x80)
            return 0;
    return n;
}

static void put_string(struct out *o, const char *s) {
    if (!s) {
        puts_(o, "null");
        return;
    }
    puts_(o, "\"");
    for (const unsigned char *p = (const unsigned char *)s; *p;) {
        char esc[8];
        if (*p == '"' || *p == '\\') {
            esc[0] = '\\', esc[1] = *p, esc[2] = 0;
            puts_(o, esc), p++;
        } else if (*p < 0x20 || *p == 0x7f) {
            snprintf(esc, sizeof esc, "\\u%04x", *p);
            puts_(o, esc), p++;
        } else if (*p < 0x80) {
            put(o, (const char *)p, 1), p++;
        } else {
            int n = utf8_len(p);
            if (n)
                put(o, (const char *)p, n), p += n;
            else   /* not UTF-8: the replacement character, so the file stays valid JSON */
                puts_(o, "\\ufffd"), p++;
        }
    }
    puts_(o, "\"");
}

/* The shortest decimal that reads back as the same double, always with a '.' or an
 * exponent (so JSON readers see a float, as Python's json writes it). */
static void put_float(struct out *o, double v) {
    char buf[40];
    for (int digits = 15; digits <= 17; digits++) {
        snprintf(buf, sizeof buf, "%.*g", digits, v);
        if (strtod(buf, NULL) == v)
            break;
    }
    if (!strpbrk(buf, ".eEn"))
        strcat(buf, ".0");
    puts_(o, buf);
}

static void put_key(struct out *o, const char *key) {
    puts_(o, o->len > 1 ? ", \"" : "\"");
    puts_(o, key);
    puts_(o, "\": ");
}

static void put_int(struct out *o, long long v) {
    char buf[24];
    snprintf(buf, sizeof buf, "%lld", v);
    puts_(o, buf);
}

static void write_status(struct shim *s) {
    struct out o = {0};
    puts_(&o, "{");
    put_key(&o, "shim_pid"), put_int(&o, getpid());
    put_key(&o, "pid");
    if (s->pid > 0) put_int(&o, s->pid); else puts_(&o, "null");
    put_key(&o, "pgid");
    if (s->pid > 0) put_int(&o, s->pid); else puts_(&o, "null");
    put_key(&o, "command"), puts_(&o, "[");
    for (char **arg = s->command; *arg; arg++) {
        if (arg != s->command)
            puts_(&o, ", ");
        put_string(&o, *arg);
    }
    puts_(&o, "]");
    put_key(&o, "lease"), put_string(&o, s->lease);
    put_key(&o, "kill_wait"), put_float(&o, s->kill_wait);
    put_key(&o, "poll"), put_float(&o, s->poll);
    put_key(&o, "boot_id"), put_string(&o, s->boot_id);
    put_key(&o, "shim_start");
    if (s->shim_start >= 0) put_int(&o, s->shim_start); else puts_(&o, "null");
    put_key(&o, "started_at");
    if (s->started) put_float(&o, s->started_at); else puts_(&o, "null");
    if (s->has_pid_start) {
        put_key(&o, "pid_start");
        if (s->pid_start >= 0) put_int(&o, s->pid_start); else puts_(&o, "null");
    }
    if (s->ended) {
        put_key(&o, "ended_at"), put_float(&o, s->ended_at);
        put_key(&o, "exit_code");
        if (s->signal) puts_(&o, "null"); else put_int(&o, s->exit_code);
        put_key(&o, "signal"), put_int(&o, s->signal);
        put_key(&o, "fenced"), puts_(&o, s->fenced ? "true" : "false");
        put_key(&o, "reason"), put_string(&o, s->reason);
    }
    puts_(&o, "}");
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.%d.tmp", s->status_path, (int)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    if (fd < 0) {
        perror("gpusched-shim: status file");
        free(o.buf);
        return;
    }
    for (size_t done = 0; done < o.len;) {
        ssize_t n = write(fd, o.buf + done, o.len - done);
        if (n < 0 && errno != EINTR)
            break;
        done += n > 0 ? (size_t)n : 0;
    }
    close(fd);
    if (rename(tmp, s->status_path) < 0)
        perror("gpusched-shim: status file");
    free(o.buf);
}

/* The first status is written: tell the agent the workload's pid (nothing: not started). */
static void tell_written(struct shim *s) {
    write_status(s);
    if (s->written_fd < 0)
        return;
    char buf[24];
    int n = s->pid > 0 ? snprintf(buf, sizeof buf, "%d", (int)s->pid) : 0;
    if (n > 0 && write(s->written_fd, buf, n) < 0) {
        /* the agent went: it reads the status file on its own */
    }
    close(s->written_fd);
    s->written_fd = -1;
}

/* --- the workload ------------------------------------------------------------------ */
static void not_started(struct shim *s, const char *reason, int fenced) {
    s->started = 0, s->ended = 1, s->ended_at = now();
    s->exit_code = EXIT_NOT_STARTED, s->signal = 0, s->fenced = fenced;
    snprintf(s->reason, sizeof s->reason, "%s", reason);
    tell_written(s);
}

/* Start CMD in a session of its own (a group whose id is its pid), with the default
 * signal handling and no signal blocked; 0 when it could not. */
static int start(struct shim *s) {
    double expiry = s->lease ? read_expiry(s->lease) : INFINITY, at = now();
    char reason[sizeof s->reason];
    if (at > expiry) {
        snprintf(reason, sizeof reason, "not started: lease expired at %.3f", expiry);
        not_started(s, reason, 1);
        return 0;
    }
    posix_spawnattr_t attr;
    sigset_t all, none;
    sigfillset(&all);
    sigemptyset(&none);
    posix_spawnattr_init(&attr);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSID | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK);
    posix_spawnattr_setsigdefault(&attr, &all);
    posix_spawnattr_setsigmask(&attr, &none);
    int err = posix_spawnp(&s->pid, s->command[0], NULL, &attr, s->command, environ);
    posix_spawnattr_destroy(&attr);
    if (err) {
        s->pid = 0;
        snprintf(reason, sizeof reason, "cannot start: [Errno %d] %s: '%s'", err, strerror(err), s->command[0]);
        not_started(s, reason, 0);
        return 0;
    }
    s->started = 1, s->started_at = at;
    s->has_pid_start = 1, s->pid_start = proc_start(s->pid);
    tell_written(s);
    return 1;
}

static void signal_group(pid_t pgid, int sig) { kill(-pgid, sig); }

static int group_alive(pid_t pgid) { return kill(-pgid, 0) == 0 || errno == EPERM; }

/* Collect every ended child: the leader's status, and orphans adopted as subreaper. */
static void reap(struct shim *s) {
    int status;
    pid_t child;
    while ((child = waitpid(-1, &status, WNOHANG)) > 0) {
        if (child != s->pid)
            continue;
        s->leader_reaped = 1;
        if (WIFSIGNALED(status))
            s->exit_code = 0, s->signal = WTERMSIG(status);
        else
            s->exit_code = WEXITSTATUS(status), s->signal = 0;
    }
}

static void stop(struct shim *s, const char *why, double at) {
    snprintf(s->why_stopped, sizeof s->why_stopped, "%s", why);
    s->kill_at = at + s->kill_wait;
    signal_group(s->pid, SIGTERM);
}

static void check_stop(struct shim *s, double at, double expiry) {
    char why[sizeof s->why_stopped];
    if (s->why_stopped[0])
        return;
    if (term_requested) {
        stop(s, "stopped on request", at);
    } else if (at > expiry) {
        s->fenced = 1;
        snprintf(why, sizeof why, "fenced: lease expired at %.3f", expiry);
        stop(s, why, at);
    } else if (s->leader_reaped) {
        stop(s, "rest of its process group stopped", at);
    }
}

static double timeout_s(struct shim *s, double at, double expiry) {
    double timeout = s->why_stopped[0] ? s->poll : fmin(s->poll, expiry - at);
    if (s->kill_at >= 0 && !s->killed)
        timeout = fmin(timeout, s->kill_at - at);
    return fmax(0.0, timeout);
}

/* Wait up to ``seconds`` for a signal (SIGCHLD, SIGTERM, SIGINT), blocked outside this
 * wait so none is lost between a check and the sleep. */
static void sleep_for_signal(double seconds, const sigset_t *open) {
    struct timespec ts = {(time_t)seconds, (long)((seconds - floor(seconds)) * 1e9)};
    ppoll(NULL, 0, &ts, open);
}

static int finish(struct shim *s) {
    char end[96];
    if (s->signal)
        snprintf(end, sizeof end, "killed by signal %d", s->signal);
    else
        snprintf(end, sizeof end, "exited with code %d", s->exit_code);
    if (s->killed)
        snprintf(end + strlen(end), sizeof end - strlen(end), " (SIGKILL after kill-wait %gs)", s->kill_wait);
    if (s->why_stopped[0])
        snprintf(s->reason, sizeof s->reason, "%s; %s", s->why_stopped, end);
    else
        snprintf(s->reason, sizeof s->reason, "%s", end);
    s->ended = 1, s->ended_at = now();
    write_status(s);
    return s->signal ? 128 + s->signal : s->exit_code;
}

static int run(struct shim *s) {
    sigset_t handled, open;
    sigemptyset(&handled);
    sigaddset(&handled, SIGCHLD), sigaddset(&handled, SIGTERM), sigaddset(&handled, SIGINT);
    sigprocmask(SIG_BLOCK, &handled, &open);
    sigdelset(&open, SIGCHLD), sigdelset(&open, SIGTERM), sigdelset(&open, SIGINT);
    struct sigaction child = {.sa_handler = on_child}, term = {.sa_handler = on_term};
    sigaction(SIGCHLD, &child, NULL);
    sigaction(SIGTERM, &term, NULL);
    sigaction(SIGINT, &term, NULL);
    signal(SIGPIPE, SIG_IGN);         /* a gone agent's pipe must not end the shim */
    prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);   /* orphans come here, not to init */
    if (!start(s))
        return EXIT_NOT_STARTED;
    for (;;) {
        reap(s);
        if (s->leader_reaped && !group_alive(s->pid))
            break;
        double at = now();
        /* one look at the lease per turn: renewals only move it later; a revoke is seen
         * at the next turn, at most ``poll`` away */
        double expiry = s->lease && !s->why_stopped[0] ? read_expiry(s->lease) : INFINITY;
        check_stop(s, at, expiry);
        if (s->kill_at >= 0 && !s->killed && at >= s->kill_at) {
            s->killed = 1;
            signal_group(s->pid, SIGKILL);
            continue;
        }
        sleep_for_signal(timeout_s(s, at, expiry), &open);
    }
    return finish(s);
}

/* --- arguments ----------------------------------------------------------------------- */
static int usage(const char *message, const char *value) {
    fprintf(stderr, "usage: gpusched-shim [--lease PATH] --kill-wait S --status PATH [--poll S] "
                    "[--cwd DIR] [--output PATH] [--written-fd N] -- CMD ARGS...\ngpusched-shim: error: %s", message);
    if (value)
        fprintf(stderr, ", got '%s'", value);
    fputc('\n', stderr);
    return EXIT_USAGE;
}

static int seconds(const char *text, double *out, int strict) {
    char *end;
    errno = 0;
    double value = strtod(text, &end);
    if (end == text || *end || errno == ERANGE || !isfinite(value) || value < 0 || (strict && value == 0))
        return 0;
    *out = value;
    return 1;
}

static int parse(struct shim *s, int argc, char **argv) {
    int have_kill_wait = 0;
    s->poll = 0.1, s->written_fd = -1, s->kill_at = -1, s->shim_start = -1;
    int i = 1;
    for (; i < argc && strcmp(argv[i], "--") != 0; i += 2) {
        const char *name = argv[i], *value = i + 1 < argc ? argv[i + 1] : NULL;
        if (!value)
            return usage("a value is missing after", name);
        if (!strcmp(name, "--lease")) {
            s->lease = value;
        } else if (!strcmp(name, "--status")) {
            s->status_path = value;
        } else if (!strcmp(name, "--cwd")) {
            s->cwd = value;
        } else if (!strcmp(name, "--output")) {
            s->output = value;
        } else if (!strcmp(name, "--kill-wait")) {
            if (!seconds(value, &s->kill_wait, 0))
                return usage("--kill-wait must be >= 0", value);
            have_kill_wait = 1;
        } else if (!strcmp(name, "--poll")) {
            if (!seconds(value, &s->poll, 1))
                return usage("--poll must be > 0", value);
        } else if (!strcmp(name, "--written-fd")) {
            char *end;
            long fd = strtol(value, &end, 10);
            if (end == value || *end || fd < 0 || fcntl((int)fd, F_GETFD) < 0)
                return usage("--written-fd must be an open file descriptor", value);
            s->written_fd = (int)fd;
            fcntl(s->written_fd, F_SETFD, FD_CLOEXEC);   /* the workload must not hold it */
        } else {
            return usage("unknown argument", name);
        }
    }
    if (!have_kill_wait || !s->status_path)
        return usage("--kill-wait and --status are required", NULL);
    if (i + 1 >= argc)
        return usage("command: nothing to run after '--'", NULL);
    s->command = argv + i + 1;
    return 0;
}

/* Make ``path`` and its parents (mkdir -p). */
static int make_dirs(char *path) {
    for (char *p = path + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = 0;
        int err = mkdir(path, 0777) < 0 && errno != EEXIST;
        *p = '/';
        if (err)
            return -1;
    }
    return mkdir(path, 0777) < 0 && errno != EEXIST ? -1 : 0;
}

int main(int argc, char **argv) {
    static struct shim s;
    int code = parse(&s, argc, argv);
    if (code)
        return code;
    if (s.cwd) {                      /* the worker's folder: made here, not by the agent */
        char *dir = strdup(s.cwd);
        if (!dir || make_dirs(dir) < 0 || chdir(s.cwd) < 0) {
            fprintf(stderr, "gpusched-shim: cannot enter %s: %s\n", s.cwd, strerror(errno));
            return 1;
        }
        free(dir);
    }
    if (s.output) {                   /* the workload's stdout and stderr, and the shim's */
        int fd = open(s.output, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0640);
        if (fd < 0 || dup2(fd, STDOUT_FILENO) < 0 || dup2(fd, STDERR_FILENO) < 0) {
            fprintf(stderr, "gpusched-shim: cannot open %s: %s\n", s.output, strerror(errno));
            return 1;
        }
        close(fd);
    }
    if (unlink(s.status_path) < 0 && errno != ENOENT) {   /* an earlier run's: never read as ours */
        fprintf(stderr, "gpusched-shim: cannot remove an earlier status file: %s\n", strerror(errno));
        return 1;
    }
    char boot[64];
    if (read_small("/proc/sys/kernel/random/boot_id", boot, sizeof boot) > 0) {
        boot[strcspn(boot, "\n")] = 0;
        snprintf(s.boot_id, sizeof s.boot_id, "%s", boot);
    }
    s.shim_start = proc_start(getpid());
    return run(&s);
}
