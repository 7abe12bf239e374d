/* Start one process the way snapshotd needs it, in a single posix_spawn call.
 *
 * glibc implements posix_spawn with clone(CLONE_VM | CLONE_VFORK), so the cost
 * does not grow with the parent's memory, and every step below runs in the
 * child between clone and exec:
 *   - fds 0, 1, 2 become copies of fd0, fd1, fd2 (which must all be >= 3);
 *   - every other descriptor is closed (closefrom(3)), whatever its flags;
 *   - the working directory is cwd (no shell needed);
 *   - the signal mask is empty and every signal has its default action, so a
 *     mask or an ignored SIGPIPE in the calling thread does not leak into git;
 *   - the child leads a new process group, so a timeout can kill the whole
 *     group, grandchildren included.
 * path is used as given (no PATH search). Returns 0 and stores the pid, or
 * returns an errno value (an exec or chdir failure in the child included).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <errno.h>
#include <signal.h>
#include <spawn.h>
#include <stddef.h>
#include <string.h>
#include <sys/types.h>

int snapshotd_spawn(const char *path, char *const argv[], char *const envp[],
                    const char *cwd, int fd0, int fd1, int fd2, int *pid_out);

int snapshotd_spawn(const char *path, char *const argv[], char *const envp[],
                    const char *cwd, int fd0, int fd1, int fd2, int *pid_out)
{
    posix_spawn_file_actions_t actions;
    posix_spawnattr_t attr;
    sigset_t mask, defaults;
    pid_t pid = -1;
    int err;

    if (path == NULL || argv == NULL || envp == NULL || pid_out == NULL)
        return EINVAL;
    if (fd0 < 3 || fd1 < 3 || fd2 < 3)
        return EBADF;

    err = posix_spawn_file_actions_init(&actions);
    if (err != 0)
        return err;
    err = posix_spawnattr_init(&attr);
    if (err != 0) {
        posix_spawn_file_actions_destroy(&actions);
        return err;
    }

    sigemptyset(&mask);
    /* Every signal back to SIG_DFL, glibc's internal ones (32, 33) included:
     * sigfillset leaves them out, and glibc's child then sets them to SIG_IGN,
     * which survives exec (an exec'd program would start with them ignored,
     * unlike one started by fork or vfork). The child sets its dispositions
     * with all signals blocked and nothing signals its new thread id, so
     * SIG_DFL is safe there. */
    memset(&defaults, 0xff, sizeof defaults);

    if ((err = posix_spawn_file_actions_adddup2(&actions, fd0, 0)) != 0)
        goto out;
    if ((err = posix_spawn_file_actions_adddup2(&actions, fd1, 1)) != 0)
        goto out;
    if ((err = posix_spawn_file_actions_adddup2(&actions, fd2, 2)) != 0)
        goto out;
    if ((err = posix_spawn_file_actions_addclosefrom_np(&actions, 3)) != 0)
        goto out;
    if (cwd != NULL && (err = posix_spawn_file_actions_addchdir_np(&actions, cwd)) != 0)
        goto out;

    if ((err = posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF
                                                   | POSIX_SPAWN_SETPGROUP)) != 0)
        goto out;
    if ((err = posix_spawnattr_setsigmask(&attr, &mask)) != 0)
        goto out;
    if ((err = posix_spawnattr_setsigdefault(&attr, &defaults)) != 0)
        goto out;
    if ((err = posix_spawnattr_setpgroup(&attr, 0)) != 0)
        goto out;

    err = posix_spawn(&pid, path, &actions, &attr, argv, envp);
    if (err == 0)
        *pid_out = (int)pid;

out:
    posix_spawnattr_destroy(&attr);
    posix_spawn_file_actions_destroy(&actions);
    return err;
}
