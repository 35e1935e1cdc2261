"""The sandbox child's bootstrap: limits, Landlock, then the user's script (see sandbox.py).

This file's own text is what the child runs (``python -I -c STUB conf``), so it imports only
the standard library; in the parent it only provides :func:`landlock_abi`. Landlock is called
through ``ctypes`` syscalls (no binding in the standard library): ``landlock_create_ruleset``
444, ``landlock_add_rule`` 445, ``landlock_restrict_self`` 446 (the same numbers on x86-64 and
arm64).
"""

import ctypes
import json
import os
import resource
import sys

_CREATE, _ADD_RULE, _RESTRICT = 444, 445, 446
_VERSION_FLAG = 1  # LANDLOCK_CREATE_RULESET_VERSION
_RULE_PATH_BENEATH = 1
_PR_SET_NO_NEW_PRIVS = 38
# filesystem rights (ABI 1, then REFER in 2, TRUNCATE in 3)
WRITE_FILE, REMOVE_DIR, REMOVE_FILE = 1 << 1, 1 << 4, 1 << 5
MAKE_ALL = sum(1 << b for b in range(6, 13))  # char, dir, reg, sock, fifo, block, sym
REFER, TRUNCATE = 1 << 13, 1 << 14
NET_BIND_TCP, NET_CONNECT_TCP = 1 << 0, 1 << 1  # ABI 4
SCOPE_ABSTRACT_UNIX, SCOPE_SIGNAL = 1 << 0, 1 << 1  # ABI 6


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def landlock_abi() -> int:
    """The kernel's Landlock ABI version (0: none)."""
    try:
        v = _libc().syscall(_CREATE, None, ctypes.c_size_t(0), ctypes.c_uint32(_VERSION_FLAG))
    except (OSError, AttributeError):
        return 0
    return max(0, int(v))


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def restrict_writes(workdir: str, abi: int) -> None:
    """Writes only beneath ``workdir`` (and to /dev/null); no TCP (ABI >= 4); no signals or
    abstract sockets outside (ABI >= 6). Raises OSError if the kernel refuses."""
    libc = _libc()
    fs = WRITE_FILE | REMOVE_DIR | REMOVE_FILE | MAKE_ALL
    fs |= REFER if abi >= 2 else 0
    fs |= TRUNCATE if abi >= 3 else 0
    fields = [fs]
    if abi >= 4:
        fields.append(NET_BIND_TCP | NET_CONNECT_TCP)
    if abi >= 6:
        fields.append(SCOPE_ABSTRACT_UNIX | SCOPE_SIGNAL)
    attr = (ctypes.c_uint64 * len(fields))(*fields)
    ruleset = libc.syscall(_CREATE, ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr)), ctypes.c_uint32(0))
    if ruleset < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset")
    file_rights = WRITE_FILE | (TRUNCATE if abi >= 3 else 0)
    for path, rights in ((workdir, fs), ("/dev/null", file_rights)):
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        try:
            rule = _PathBeneath(rights, fd)
            if libc.syscall(_ADD_RULE, ruleset, _RULE_PATH_BENEATH, ctypes.byref(rule), ctypes.c_uint32(0)) != 0:
                raise OSError(ctypes.get_errno(), f"landlock_add_rule {path}")
        finally:
            os.close(fd)
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
    if libc.syscall(_RESTRICT, ruleset, ctypes.c_uint32(0)) != 0:
        raise OSError(ctypes.get_errno(), "landlock_restrict_self")
    os.close(ruleset)


def _main() -> None:
    conf = json.loads(sys.argv[1])
    if os.getpid() == 1:  # a PID namespace's init ignores signals it has no handler for (SIGXCPU): run as its child
        pid = os.fork()
        if pid:
            code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
            os._exit(128 - code if code < 0 else code)
    work = conf["workdir"]
    os.chdir(work)
    mib = 1 << 20
    for res, value in ((resource.RLIMIT_CPU, (conf["cpu_s"], conf["cpu_s"] + 1)),
                       (resource.RLIMIT_AS, (conf["memory_mb"] * mib,) * 2),
                       (resource.RLIMIT_FSIZE, (conf["file_mb"] * mib,) * 2),
                       (resource.RLIMIT_NOFILE, (conf["open_files"],) * 2),
                       (resource.RLIMIT_CORE, (0, 0))):
        resource.setrlimit(res, value)
    if conf["landlock_abi"] >= 1:
        try:
            restrict_writes(work, conf["landlock_abi"])
        except OSError as e:
            sys.stderr.write(f"sandbox: Landlock could not be applied ({e}); not running the code\n")
            sys.exit(125)
    path = os.path.join(work, "main.py")
    with open(path, encoding="utf-8") as f:
        source = f.read()
    sys.argv = [path]
    sys.path[0] = work
    try:
        exec(compile(source, path, "exec"), {"__name__": "__main__", "__file__": path, "__builtins__": __builtins__})
    except SystemExit:
        raise
    except BaseException as e:  # the script's traceback, without this bootstrap's frame
        import traceback

        traceback.print_exception(type(e), e, e.__traceback__.tb_next)
        sys.exit(1)
