"""The sandbox child's system-call filter: a small seccomp BPF program installed through ctypes.

Like _landlock.py, this file's own text runs in the child (it precedes _landlock.py's in the
bootstrap), so it imports only the standard library. The filter, for x86-64 and arm64 only:

* another architecture's calling convention (32-bit syscalls on x86-64) kills the process, and
  x32 system calls fail;
* these fail with EPERM: ptrace, process_vm_readv/writev, kcmp, pidfd_getfd (other processes'
  memory); mount, umount2, pivot_root, chroot, the new mount API (open_tree, move_mount,
  fsopen, fsconfig, fsmount, fspick, mount_setattr), unshare, setns, and clone with any
  CLONE_NEW* flag (no new namespaces, no way out of the directory's tmpfs); bpf,
  perf_event_open, userfaultfd, io_uring_setup/enter/register (io_uring's operations would
  bypass this filter); keyctl, add_key, request_key; kexec_load, kexec_file_load,
  init_module, finit_module, delete_module, reboot, swapon, swapoff, acct, quotactl, syslog,
  fanotify_init, lookup_dcookie, open_by_handle_at, name_to_handle_at, iopl, ioperm;
* clone3 fails with ENOSYS (its flags sit behind a pointer a filter cannot read; glibc then
  falls back to clone, whose flags are checked); so does clone with CLONE_PARENT (a child
  handed to the sandbox's parent) and process_madvise (another process's memory);
* no socket reaches past the process tree: socket() fails for every family (AF_UNIX included:
  a pathname or abstract Unix socket is a door to whatever listens outside, Ray's raylet,
  D-Bus, docker.sock), and so do connect() and bind(); socketpair() succeeds for a connected
  AF_UNIX SOCK_STREAM pair only (asyncio's self-pipe; a datagram pair could ``sendto`` a path).

With ``own_pid`` (no PID namespace: every process of the user is in reach, by its pid), calls
that act on another process succeed only on this process (0 or ``own_pid``): prlimit64,
setpriority and ioprio_set (``PRIO_PROCESS`` / ``IOPRIO_WHO_PROCESS`` only), sched_setaffinity,
sched_setscheduler, sched_setparam, sched_setattr, migrate_pages, move_pages; setsid and setpgid
fail (every process it starts stays in the process group the wall-clock kill ends); kill(-1)
fails. With ``signals`` as well (Landlock older than ABI 6: nothing else scopes signals), every
way to signal another process fails: kill except to ``own_pid``, 0 (its own process group) and
-``own_pid`` (the same, when it leads its session); tkill, tgkill, rt_sigqueueinfo and
rt_tgsigqueueinfo except to ``own_pid`` (``signal.raise_signal`` and ``pthread_kill`` within the
process work); pidfd_send_signal; fcntl F_SETOWN / F_SETOWN_EX and ioctl FIOSETOWN / SIOCSPGRP
(whose SIGIO would go to the owner). The price: the code's own children cannot be signalled
(``Popen.kill`` raises PermissionError; ``os.kill(0, sig)`` reaches the whole group), nor can a
process the code starts signal itself by its own pid. pidfd_open stays allowed: a pidfd only
waits, and everything that acts through one (pidfd_send_signal, pidfd_getfd, setns,
process_madvise) is refused. Only an argument's low 32 bits are compared: pids and commands are
ints, which the kernel truncates alike.

Not filtered: everything else, among it the file system calls (Landlock's job), ioctl, prctl,
personality and memory mapping.
"""

import ctypes
import os
import platform

_EPERM, _ENOSYS = 1, 38
_RET_ALLOW, _RET_KILL_PROCESS, _RET_ERRNO = 0x7FFF0000, 0x80000000, 0x00050000
_LD_ABS_W, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06
_NR, _ARCH, _ARG0, _ARG1 = 0, 4, 16, 24  # offsets in struct seccomp_data (little-endian: args' low 32 bits)
_AND_K = 0x54  # BPF_ALU | BPF_AND | BPF_K
_SOCK_STREAM, _SOCK_TYPE_MASK = 1, 0xF  # the type's low bits; SOCK_CLOEXEC / SOCK_NONBLOCK sit above
_PR_SET_NO_NEW_PRIVS, _PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 38, 22, 2
_AF_UNIX = 1
_X32_BIT = 0x40000000
_CLONE_NEW = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000
_CLONE_PARENT = 0x00008000

# name: (x86-64, arm64); None where the architecture has no such call
_DENIED = {
    "ptrace": (101, 117), "process_vm_readv": (310, 270), "process_vm_writev": (311, 271), "kcmp": (312, 272),
    "pidfd_getfd": (438, 438), "mount": (165, 40), "umount2": (166, 39), "pivot_root": (155, 41),
    "chroot": (161, 51), "open_tree": (428, 428), "move_mount": (429, 429), "fsopen": (430, 430),
    "fsconfig": (431, 431), "fsmount": (432, 432), "fspick": (433, 433), "mount_setattr": (442, 442),
    "unshare": (272, 97), "setns": (308, 268), "bpf": (321, 280), "perf_event_open": (298, 241),
    "userfaultfd": (323, 282), "io_uring_setup": (425, 425), "io_uring_enter": (426, 426),
    "io_uring_register": (427, 427), "keyctl": (250, 219), "add_key": (248, 217), "request_key": (249, 218),
    "kexec_load": (246, 104), "kexec_file_load": (320, 294), "init_module": (175, 105),
    "finit_module": (313, 273), "delete_module": (176, 106), "reboot": (169, 142), "swapon": (167, 224),
    "swapoff": (168, 225), "acct": (163, 89), "quotactl": (179, 60), "syslog": (103, 116),
    "fanotify_init": (300, 262), "lookup_dcookie": (212, 18), "open_by_handle_at": (304, 265),
    "name_to_handle_at": (303, 264), "iopl": (172, None), "ioperm": (173, None), "process_madvise": (440, 440),
}
_CLONE, _CLONE3, _SOCKET, _SOCKETPAIR = (56, 220), (435, 435), (41, 198), (53, 199)
_CONNECT, _BIND = (42, 203), (49, 200)
# without a PID namespace: calls whose argument 0 names a process (0: the caller)
_SELF_ONLY = {"prlimit64": (302, 261), "sched_setparam": (142, 118), "sched_setscheduler": (144, 119),
              "sched_setaffinity": (203, 122), "sched_setattr": (314, 274), "migrate_pages": (256, 238),
              "move_pages": (279, 239)}
_WHO_ONLY = {"setpriority": ((141, 140), 0), "ioprio_set": ((251, 30), 1)}  # (which, who): which = one process
_SESSIONS = {"setsid": (112, 157), "setpgid": (109, 154)}
_KILL, _PIDFD_SEND_SIGNAL = (62, 129), (424, 424)
_TO_THREADS = {"tkill": (200, 130), "tgkill": (234, 131), "rt_sigqueueinfo": (129, 138),
               "rt_tgsigqueueinfo": (297, 240)}  # argument 0: the thread (group) signalled
_FCNTL, _IOCTL = (72, 25), (16, 29)
_F_SETOWN, _F_SETOWN_EX, _FIOSETOWN, _SIOCSPGRP = 8, 15, 0x8901, 0x8902
# AUDIT_ARCH_X86_64, AUDIT_ARCH_AARCH64, and each one's column in the tables above
_ARCHES = {"x86_64": (0xC000003E, 0), "amd64": (0xC000003E, 0), "aarch64": (0xC00000B7, 1), "arm64": (0xC00000B7, 1)}


def seccomp_supported() -> bool:
    """Whether this kernel filters system calls with an errno action, on an architecture the
    filter knows."""
    try:
        with open("/proc/sys/kernel/seccomp/actions_avail", encoding="ascii") as f:
            actions = f.read().split()
    except OSError:
        return False
    return "errno" in actions and "kill_process" in actions and platform.machine().lower() in _ARCHES


class _Insn(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class _Prog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_Insn))]


def _arg_in(nr: int, arg: int, values, allow: bool) -> list[tuple[int, int, int, int]]:
    """For system call ``nr``: if argument ``arg`` is one of ``values``, allow the call (``allow``)
    or refuse it; otherwise the opposite."""
    values = [v & 0xFFFFFFFF for v in values]
    hit, miss = (_RET_ALLOW, _RET_ERRNO | _EPERM) if allow else (_RET_ERRNO | _EPERM, _RET_ALLOW)
    body = [(_LD_ABS_W, 0, 0, _ARG0 + 8 * arg)] + [(_JEQ, len(values) - i, 0, v) for i, v in enumerate(values)]
    body += [(_RET, 0, 0, miss), (_RET, 0, 0, hit)]
    return [(_JEQ, 0, len(body), nr)] + body


def _process_rules(col: int, own_pid: int, own_group: bool, signals: bool) -> list[tuple[int, int, int, int]]:
    """What this process may do to others without a PID namespace (the module's docstring)."""
    errno, me = _RET_ERRNO | _EPERM, (0, own_pid)
    p = []
    for nrs in _SELF_ONLY.values():
        p += _arg_in(nrs[col], 0, me, allow=True)
    for nrs, one_process in _WHO_ONLY.values():  # which == one process, and who == this one
        p += [(_JEQ, 0, 7, nrs[col]), (_LD_ABS_W, 0, 0, _ARG0), (_JEQ, 0, 3, one_process),
              (_LD_ABS_W, 0, 0, _ARG0 + 8), (_JEQ, 2, 0, 0), (_JEQ, 1, 0, own_pid), (_RET, 0, 0, errno),
              (_RET, 0, 0, _RET_ALLOW)]
    for nrs in _SESSIONS.values():
        p += [(_JEQ, 0, 1, nrs[col]), (_RET, 0, 0, errno)]
    if not signals:
        return p + _arg_in(_KILL[col], 0, (-1,), allow=False)
    p += _arg_in(_KILL[col], 0, (own_pid, 0, -own_pid) if own_group else (own_pid,), allow=True)
    for nrs in _TO_THREADS.values():
        p += _arg_in(nrs[col], 0, (own_pid,), allow=True)
    p += [(_JEQ, 0, 1, _PIDFD_SEND_SIGNAL[col]), (_RET, 0, 0, errno)]
    p += _arg_in(_FCNTL[col], 1, (_F_SETOWN, _F_SETOWN_EX), allow=False)
    return p + _arg_in(_IOCTL[col], 1, (_FIOSETOWN, _SIOCSPGRP), allow=False)


def filter_program(machine: str | None = None, own_pid: int | None = None, own_group: bool = False,
                   signals: bool = False) -> list[tuple[int, int, int, int]]:
    """The BPF program as (code, jt, jf, k) instructions; ``own_pid`` adds the rules for a
    sandbox without a PID namespace (``own_group``: it leads its session, so its process group
    holds only its own processes; ``signals``: refuse signals to others too)."""
    arch, col = _ARCHES[(machine or platform.machine()).lower()]
    errno = _RET_ERRNO | _EPERM
    p = [(_LD_ABS_W, 0, 0, _ARCH), (_JEQ, 1, 0, arch), (_RET, 0, 0, _RET_KILL_PROCESS), (_LD_ABS_W, 0, 0, _NR)]
    if col == 0:  # x32 system calls
        p += [(_JGE, 0, 1, _X32_BIT), (_RET, 0, 0, errno)]
    for nrs in _DENIED.values():
        if nrs[col] is not None:
            p += [(_JEQ, 0, 1, nrs[col]), (_RET, 0, 0, errno)]
    p += [(_JEQ, 0, 1, _CLONE3[col]), (_RET, 0, 0, _RET_ERRNO | _ENOSYS)]
    # clone: no CLONE_NEW* flag (arg 0 on both architectures)
    p += [(_JEQ, 0, 4, _CLONE[col]), (_LD_ABS_W, 0, 0, _ARG0), (_JSET, 0, 1, _CLONE_NEW | _CLONE_PARENT),
          (_RET, 0, 0, errno), (_RET, 0, 0, _RET_ALLOW)]
    for nrs in (_SOCKET, _CONNECT, _BIND):
        p += [(_JEQ, 0, 1, nrs[col]), (_RET, 0, 0, errno)]
    # socketpair: a connected AF_UNIX stream pair only
    p += [(_JEQ, 0, 7, _SOCKETPAIR[col]), (_LD_ABS_W, 0, 0, _ARG0), (_JEQ, 0, 4, _AF_UNIX), (_LD_ABS_W, 0, 0, _ARG1),
          (_AND_K, 0, 0, _SOCK_TYPE_MASK), (_JEQ, 0, 1, _SOCK_STREAM), (_RET, 0, 0, _RET_ALLOW), (_RET, 0, 0, errno)]
    if own_pid is not None:
        p += _process_rules(col, own_pid, own_group, signals)
    return p + [(_RET, 0, 0, _RET_ALLOW)]


def install_filter(process_rules: str | None = None) -> None:
    """Install the filter on this process (and everything it starts); sets no_new_privs.
    ``process_rules`` (no PID namespace): "limits", or "signals" for those and the signals.
    Raises OSError if the kernel refuses."""
    own = os.getpid()
    prog = filter_program(own_pid=own if process_rules else None, own_group=os.getsid(0) == own,
                          signals=process_rules == "signals")
    insns = (_Insn * len(prog))(*[_Insn(*i) for i in prog])
    fprog = _Prog(len(prog), insns)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
    if libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()) + ": prctl(PR_SET_SECCOMP)")
