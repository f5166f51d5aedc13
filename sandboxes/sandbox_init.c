/*
 * patchgym's local sandbox init: pid 1 of a local sandbox's namespaces (inside bubblewrap, its
 * mounts, cgroups and rlimits already in place), it runs each command it is sent.
 *
 * Why C: an idle sandbox should cost the host next to nothing, and a host should hold thousands.
 * The Python init it replaces (sandbox_init.py, still the fallback where no C compiler is) held
 * about 8.5 MiB of private memory idle and took about 40 ms of a core to start; this one holds
 * about 100 KiB and starts in a millisecond. It is compiled once per host from this file and
 * command_server.h (init_process.py), and mounted read-only into every sandbox.
 *
 * The host talks to it over its stdin and stdout with the Docker command server's messages
 * (command_server.h, sandboxes/wire.py):
 *
 *   exec   X: script, timeout seconds, output limit, environment ("K=V\0...") -> exit code, timed
 *          out, duration, total bytes, cpu seconds, head, tail. The command runs as this process's
 *          user (bubblewrap's), with this process's environment and the request's on top. After it,
 *          every other process of the namespace is killed and reaped, and what a command could
 *          leave without a process is removed: /dev/shm's files and System V IPC objects (the
 *          namespaces outlive the command, so these would otherwise reach the next one).
 *   read / write   R: path -> its bytes; W: path, bytes. A file of the workspace, /testbed (its
 *          tmpfs and overlay exist only in the sandbox's mount namespace): the path must resolve
 *          inside it (symlinks followed as os.path.realpath does, then checked), its last component
 *          may not be a symlink, only regular files are opened (a FIFO never blocks the init).
 *   ping   P: answers with its pid.
 *
 * Commands cannot signal or trace it: init of a pid namespace ignores signals it has no handler
 * for, and it makes itself non-dumpable. It ends when the host closes its stdin.
 *
 *   sandbox_init [PIDS_CGROUP]    the sandbox's pids cgroup directory, for the fork-bomb watchdog
 */
#define _GNU_SOURCE
#include "command_server.h"

static char bash[PATH_MAX] = "/bin/bash";

/* What a command could leave without a process: the namespaces outlive it. */
static void clear_leftovers(void) {
    clear_directory("/dev/shm");
    clear_sysv_ipc(NULL);
}

static const struct exec_config COMMANDS = {bash, NULL, NULL, clear_leftovers};

/* bash on PATH, looked up once (a PATH search would cost every command failed execs). */
static void find_bash(void) {
    const char *path = getenv("PATH");
    char dirs[8192];
    snprintf(dirs, sizeof dirs, "%s", path ? path : "");
    char *save = NULL;
    for (char *dir = strtok_r(dirs, ":", &save); dir; dir = strtok_r(NULL, ":", &save)) {
        char candidate[PATH_MAX];
        if (snprintf(candidate, sizeof candidate, "%s/bash", dir) >= (int)sizeof candidate) continue;
        if (access(candidate, X_OK) == 0) {
            snprintf(bash, sizeof bash, "%s", candidate);
            return;
        }
    }
}

static void do_exec_command(const struct field *f) {
    do_exec(f, &COMMANDS);
}

int main(int argc, char **argv) {
    if (getpid() != 1) {
        fprintf(stderr, "patchgym's sandbox init must be pid 1 of the sandbox's pid namespace\n");
        return 2;
    }
    prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
    /* Free memory goes back to the kernel at once: no trim threshold, no growing mmap threshold. */
    mallopt(M_MMAP_THRESHOLD, 64 * 1024);
    mallopt(M_TRIM_THRESHOLD, 64 * 1024);
    signal(SIGPIPE, SIG_IGN);
    snprintf(pids_cgroup, sizeof pids_cgroup, "%s", argc > 1 ? argv[1] : ""); /* "": no watchdog */
    find_bash();
    greet();
    static const struct op OPS[] = {{'X', 4, do_exec_command}, {'R', 1, do_read}, {'W', 2, do_write},
                                    {'P', 0, do_ping}, {0, 0, NULL}};
    return serve(OPS);
}
