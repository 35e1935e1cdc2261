"""The sandbox child's bootstrap: its directory's tmpfs, the host's socket directories hidden,
limits, every capability dropped, Landlock, the seccomp filter, then the user's script (see
sandbox.py). In the sandbox's namespaces the bootstrap is their PID 1: it makes the mounts,
drops its capabilities, makes itself non-dumpable (no /proc/1/mem, environ or maps for its
children), forks the process that runs the code, and applies Landlock and the filter to itself
too; the code starts once PID 1 carries them.

This file's own text is what the child runs (``python -I -c STUB conf``, after _seccomp.py's
text), so it imports only the standard library; in the parent it only provides
:func:`landlock_abi`. Landlock is called through ``ctypes`` syscalls (no binding in the standard
library): ``landlock_create_ruleset`` 444, ``landlock_add_rule`` 445,
``landlock_restrict_self`` 446 (the same numbers on x86-64 and arm64).
"""

import ctypes
import errno
import json
import os
import resource
import sys

if __name__ != "__main__":  # in the child, _seccomp.py's text precedes this file's
    from grpo_dist.envs._seccomp import install_filter

_CREATE, _ADD_RULE, _RESTRICT = 444, 445, 446
_VERSION_FLAG = 1  # LANDLOCK_CREATE_RULESET_VERSION
_RULE_PATH_BENEATH = 1
_PR_SET_NO_NEW_PRIVS, _PR_SET_DUMPABLE, _PR_CAPBSET_DROP, _PR_CAP_AMBIENT = 38, 4, 24, 47
_CAP_AMBIENT_CLEAR_ALL, _CAPABILITY_VERSION_3 = 4, 0x20080522
# filesystem rights (ABI 1, then REFER in 2, TRUNCATE in 3, IOCTL_DEV in 5)
EXECUTE, WRITE_FILE, READ_FILE, READ_DIR, REMOVE_DIR, REMOVE_FILE = (1 << b for b in range(6))
MAKE_ALL = sum(1 << b for b in range(6, 13))  # char, dir, reg, sock, fifo, block, sym
REFER, TRUNCATE, IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15
NET_BIND_TCP, NET_CONNECT_TCP = 1 << 0, 1 << 1  # ABI 4
SCOPE_ABSTRACT_UNIX, SCOPE_SIGNAL = 1 << 0, 1 << 1  # ABI 6
_MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_BIND, _MS_REC = 2, 4, 8, 4096, 16384
# what the interpreter may read besides its own installation (and exec: the loader, the libraries)
SYSTEM_EXEC_DIRS = ("/lib", "/lib64", "/usr/lib", "/usr/lib64", "/usr/local/lib")
SYSTEM_READ_DIRS = ("/usr/share/zoneinfo",)
SYSTEM_READ_FILES = ("/etc/ld.so.cache", "/etc/localtime", "/dev/urandom", "/dev/random", "/dev/zero")


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


def mount_dir_tmpfs(path: str, size_mb: int, inodes: int) -> None:
    """Mount a private tmpfs of ``size_mb`` MiB and ``inodes`` files over ``path`` (needs this
    process's own user and mount namespace). Raises OSError if the kernel refuses."""
    opts = f"size={size_mb}m,nr_inodes={inodes},mode=0700".encode()
    if _libc().mount(b"tmpfs", path.encode(), b"tmpfs", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, opts) != 0:
        raise OSError(ctypes.get_errno(), f"mount tmpfs on {path}")


def hide_dirs(dirs: list, keep: list) -> None:
    """Mount an empty tmpfs over each of ``dirs`` (where sockets live: /tmp, /run, /dev/shm...;
    needs this process's own mount namespace), then bind each path of ``keep`` that lay beneath
    one of them (the working directory, the Python installation) back at its own name, so only
    what the code needs stays in view. Raises OSError if the kernel refuses."""
    libc = _libc()

    def beneath(p, d):
        return p == d or p.startswith(d.rstrip("/") + "/")

    held = [(p, os.open(p, os.O_PATH | os.O_CLOEXEC)) for p in keep
            if os.path.exists(p) and any(beneath(p, d) for d in dirs)]
    for d in dirs:
        if libc.mount(b"tmpfs", d.encode(), b"tmpfs", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC,
                      b"size=1m,nr_inodes=1024,mode=0755") != 0:
            raise OSError(ctypes.get_errno(), f"mount tmpfs on {d}")
    for p, fd in held:
        if os.path.isdir(f"/proc/self/fd/{fd}"):
            os.makedirs(p, exist_ok=True)
        else:
            os.makedirs(os.path.dirname(p), exist_ok=True)
            open(p, "a").close()
        if libc.mount(f"/proc/self/fd/{fd}".encode(), p.encode(), None, _MS_BIND | _MS_REC, None) != 0:
            raise OSError(ctypes.get_errno(), f"bind {p} back after hiding its parent")
        os.close(fd)


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def drop_capabilities() -> None:
    """Drop every capability of this process for good (after the mounts, which needed them):
    no_new_privs (an exec grants nothing, root's included), the bounding set where this process
    may change it, the ambient, inheritable, permitted and effective sets. Raises OSError if any
    capability remains."""
    libc = _libc()
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
    try:
        with open("/proc/sys/kernel/cap_last_cap", encoding="ascii") as f:
            last = int(f.read())
    except (OSError, ValueError):
        last = 63
    for cap in range(last + 1):  # EPERM without CAP_SETPCAP (a user's process): no_new_privs covers exec then
        libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0)
    libc.prctl(_PR_CAP_AMBIENT, _CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    if libc.capset(ctypes.byref(_CapHeader(_CAPABILITY_VERSION_3, 0)), (_CapData * 2)()) != 0:
        raise OSError(ctypes.get_errno(), "capset")
    with open("/proc/self/status", encoding="ascii") as f:
        kept = [ln.split(":")[0] for ln in f if ln.startswith(("CapInh", "CapPrm", "CapEff", "CapAmb"))
                and int(ln.split()[1], 16)]
    if kept:
        raise OSError(errno.EPERM, f"capabilities kept: {' '.join(kept)}")


def restrict(workdir: str, abi: int, read_dirs: list, read_files: list) -> None:
    """Landlock on this process and its children: writes only beneath ``workdir`` (and to
    /dev/null); reads only beneath it, ``read_dirs`` (and the system's library directories, with
    execution), ``read_files``, /proc/self and a few /dev and /etc files; no TCP (ABI >= 4); no
    signals or abstract sockets outside (ABI >= 6). Paths that do not exist are skipped.
    Raises OSError if the kernel refuses."""
    libc = _libc()
    write = WRITE_FILE | REMOVE_DIR | REMOVE_FILE | MAKE_ALL | (REFER if abi >= 2 else 0) | (TRUNCATE if abi >= 3 else 0)
    fs = write | EXECUTE | READ_FILE | READ_DIR | (IOCTL_DEV if abi >= 5 else 0)
    fields = [fs]
    if abi >= 4:
        fields.append(NET_BIND_TCP | NET_CONNECT_TCP)
    if abi >= 6:
        fields.append(SCOPE_ABSTRACT_UNIX | SCOPE_SIGNAL)
    attr = (ctypes.c_uint64 * len(fields))(*fields)
    ruleset = libc.syscall(_CREATE, ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr)), ctypes.c_uint32(0))
    if ruleset < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset")
    dev_null = WRITE_FILE | READ_FILE | (TRUNCATE if abi >= 3 else 0)
    rules = [(workdir, write | READ_FILE | READ_DIR), ("/dev/null", dev_null), ("/proc/self", READ_FILE | READ_DIR)]
    rules += [(p, READ_FILE | READ_DIR | EXECUTE) for p in SYSTEM_EXEC_DIRS]
    rules += [(p, READ_FILE | READ_DIR) for p in SYSTEM_READ_DIRS]
    rules += [(p, READ_FILE | READ_DIR | EXECUTE) for p in read_dirs]
    rules += [(p, READ_FILE) for p in list(SYSTEM_READ_FILES) + list(read_files)]
    for path, rights in rules:
        try:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except FileNotFoundError:
            continue
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


def _refuse(wall: str, e: OSError) -> None:
    sys.stderr.write(f"sandbox: {wall} could not be applied ({e}); not running the code\n")
    sys.exit(125)


def _walls(conf: dict) -> None:
    if conf["landlock_abi"] >= 1:
        try:
            restrict(conf["workdir"], conf["landlock_abi"], conf["read_dirs"], conf["read_files"])
        except OSError as e:
            _refuse("Landlock", e)
    if conf["seccomp"]:
        try:
            install_filter(conf.get("process_rules"))
        except OSError as e:
            _refuse("the seccomp filter", e)


def _main() -> None:
    conf = json.loads(sys.argv[1])
    init = os.getpid() == 1  # PID 1 of the sandbox's own namespaces (unshare)
    work = conf["workdir"]
    path = os.path.join(work, "main.py")
    with open(path, encoding="utf-8") as f:
        source = f.read()
    if (conf["dir_tmpfs"] or conf.get("hide_dirs")) and not init:  # a mount here would land on the host's
        _refuse("the directory's tmpfs", OSError(errno.EPERM, "not in the sandbox's own mount namespace"))
    if conf["dir_tmpfs"]:  # the directory's total size: a tmpfs of dir_mb over it, private to this mount namespace
        try:
            mount_dir_tmpfs(work, conf["dir_mb"], conf["dir_files"])
            with open(path, "w", encoding="utf-8") as f:
                f.write(source)
        except OSError as e:
            _refuse("the directory's tmpfs", e)
    if conf.get("hide_dirs"):
        try:
            hide_dirs(conf["hide_dirs"], [work] + conf["read_dirs"] + conf["read_files"] + conf["keep"])
        except OSError as e:
            _refuse("hiding the host's socket directories", e)
    os.chdir(work)
    mib = 1 << 20
    for res, value in ((resource.RLIMIT_CPU, (conf["cpu_s"], conf["cpu_s"] + 1)),
                       (resource.RLIMIT_AS, (conf["memory_mb"] * mib,) * 2),
                       (resource.RLIMIT_FSIZE, (conf["file_mb"] * mib,) * 2),
                       (resource.RLIMIT_NOFILE, (conf["open_files"],) * 2),
                       (resource.RLIMIT_CORE, (0, 0))):
        resource.setrlimit(res, value)
    try:
        drop_capabilities()
    except OSError as e:
        _refuse("dropping capabilities", e)
    if init:  # a PID namespace's init ignores signals it has no handler for (SIGXCPU): the code runs as its child
        _libc().prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)
        ready, walled = os.pipe()
        pid = os.fork()
        if pid:
            os.close(ready)
            _walls(conf)  # on a refusal PID 1 exits, and the namespace's processes with it
            os.write(walled, b"1")
            os.close(walled)
            code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
            os._exit(128 - code if code < 0 else code)
        os.close(walled)
        _libc().prctl(_PR_SET_DUMPABLE, 1, 0, 0, 0)
    _walls(conf)
    if init:  # the code starts once PID 1 carries the walls
        if os.read(ready, 1) != b"1":
            os._exit(125)
        os.close(ready)
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
