"""Writes the code-scorer sandbox's seccomp filter, as BPF, to standard output.

Run by ``adapters.members.isolation`` with the sandbox's Python (libseccomp's binding, ``python3-seccomp``);
standard library and ``seccomp`` only. The one rule: allow what an ordinary Python program does, refuse
with EPERM what only an escape needs. What it refuses: docs/design-notes.md.
"""

from __future__ import annotations

import errno
import sys

import seccomp

# Refused outright (EPERM). Names the running kernel does not know are skipped.
DENIED = (
    # watching or changing other processes
    "ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_open", "pidfd_getfd",
    "pidfd_send_signal", "kill", "tkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo",
    # namespaces and the file-system tree
    "setns", "unshare", "mount", "umount2", "pivot_root", "chroot", "move_mount", "open_tree",
    "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr", "name_to_handle_at",
    "open_by_handle_at",
    # kernel code, kernel state, and kernel attack surface no scorer needs
    "bpf", "perf_event_open", "userfaultfd", "io_uring_setup", "io_uring_enter",
    "io_uring_register", "keyctl", "add_key", "request_key", "init_module", "finit_module",
    "delete_module", "kexec_load", "kexec_file_load", "reboot", "swapon", "swapoff", "acct",
    "quotactl", "syslog", "lookup_dcookie", "fanotify_init", "personality", "setdomainname",
    "sethostname", "settimeofday", "clock_settime", "clock_adjtime", "adjtimex", "vhangup",
    # kernel objects that outlive the process that made them (until the sandbox's IPC namespace
    # ends): System V shared memory, semaphores and message queues, POSIX message queues
    "shmget", "semget", "msgget", "mq_open",
)

# clone() flags that would make a namespace; clone3 cannot be filtered by its flags (they sit
# in a struct), so it answers ENOSYS and the C library falls back to clone().
NAMESPACE_FLAGS = (0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000,
                   0x40000000, 0x00000080)  # NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET, NEWTIME


def build() -> seccomp.SyscallFilter:
    f = seccomp.SyscallFilter(defaction=seccomp.ALLOW)
    deny = seccomp.ERRNO(errno.EPERM)
    for name in DENIED:
        try:
            f.add_rule(deny, name)
        except (RuntimeError, ValueError, OSError):
            pass  # not a system call on this architecture or kernel
    for flag in NAMESPACE_FLAGS:
        f.add_rule(deny, "clone", seccomp.Arg(0, seccomp.MASKED_EQ, flag, flag))
    f.add_rule(seccomp.ERRNO(errno.ENOSYS), "clone3")
    # No sockets at all: there is no network, and a unix socket can carry descriptors past the
    # end of the call that made them (SCM_RIGHTS in a cycle the kernel collects only later).
    no_family = seccomp.ERRNO(errno.EAFNOSUPPORT)
    f.add_rule(no_family, "socket")
    f.add_rule(no_family, "socketpair")
    # Limits, priorities and CPU placement of this process only (pid/who 0): a call must not
    # lower the supervisor's limits or priority for the calls after it.
    for name, arg in (("prlimit64", 0), ("setpriority", 1), ("sched_setscheduler", 0), ("sched_setparam", 0),
                      ("sched_setaffinity", 0), ("sched_setattr", 0), ("ioprio_set", 1)):
        try:
            f.add_rule(deny, name, seccomp.Arg(arg, seccomp.NE, 0))
        except (RuntimeError, ValueError, OSError):
            pass  # not a system call on this architecture or kernel
    return f


if __name__ == "__main__":
    build().export_bpf(sys.stdout.buffer)
