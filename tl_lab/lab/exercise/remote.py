"""The learner's modules in a sandboxed process of their own; the graded tests, and their verdict, in ours.

`exercise check` runs each module's graded tests in a pytest process that never imports a line of the
learner's: there `tl_lab.<m>` (each learner module of the run) is a `RemoteModule`, and every use of it
(an attribute, a call, a method, an operator, `isinstance`) is a request over a pipe to a child process
(`serve`, started through `tl_lab.lab.exercise.sandbox`: bubblewrap, rlimits, its own process group) that
holds the learner's real modules and objects. What comes back is data (None, bools, numbers, strings,
bytes, tuples, lists, dicts, numpy arrays and scalars, paths, tl_lab's and Python's classes) or a handle
(`Remote`) to an object that stays in the child. The child's answers are parsed, never unpickled: nothing
it sends can run in the tests' process. Its exceptions come back as tl_lab's or Python's own types (any
other, SystemExit and KeyboardInterrupt included, as `LearnerError`), with the learner's file and line.

Memory the chapter hands out (`KvPool.slab` is a view of the pool's buffer that the caller writes into)
stays shared: an array the child returns is a view of a "root" array, mirrored here, and after each
request the child sends every root that changed, and before each request we send every mirror the tests
wrote into. Arrays we pass in are copies; the ones the learner's code changed are copied back.

Whatever the child's code does to itself (patching pytest, numpy, this module), it can change a test's
outcome only through its answers: the assertions run here. The child's first difference from the
reference is what `Difference` (tl_lab.lab.exercise.oracle) describes.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import io
import json
import operator
import os
import pickle
import struct
import sys
import threading
import traceback
import types
import weakref
from pathlib import Path, PosixPath, PurePosixPath

import numpy as np

__all__ = ["each", "Connection", "Remote", "RemoteClass", "RemoteModule", "RemoteFinder", "LearnerError", "LearnerGone",
           "ProtocolError", "serve"]

MAX_JSON = 64 << 20        # bytes of one answer's JSON
MAX_BLOB_TOTAL = 1 << 30   # bytes of one answer's arrays and bytes
MAX_BLOBS = 1 << 16
MAX_MIRRORED = 2 << 30     # bytes of the child's arrays mirrored here at once
MESSAGE_CHARS = 4000
_HEAD = struct.Struct("<QI")
_LEN = struct.Struct("<Q")
CALLS_KEPT = 200           # calls of a test logged for the failure report
CALL_BYTES = 8 << 20       # of one call's pickled arguments


def _holds_remote(x, depth: int = 0) -> bool:
    if isinstance(x, (Remote, RemoteModule)):
        return True
    if depth < 6 and isinstance(x, (list, tuple, set, frozenset)):
        return any(_holds_remote(v, depth + 1) for v in x)
    if depth < 6 and isinstance(x, dict):
        return any(_holds_remote(v, depth + 1) for v in x.values())
    return False


class ProtocolError(Exception):
    """The child's answer is not one we read: malformed, too large, or about something it never sent."""


class LearnerError(Exception):
    """An exception of the learner's code that is not one of tl_lab's or Python's ordinary ones (its own class,
    SystemExit, KeyboardInterrupt, ...): its type's name and message, and where it was raised (`learner_at`)."""


class LearnerGone(Exception):
    """The learner's process ended (it exited, was killed, or ran past the time limit): no more answers."""


# ---------------------------------------------------------------- framing (both sides)

def _send(w, head: bytes, blobs) -> None:
    w.write(_HEAD.pack(len(head), len(blobs)))
    w.write(head)
    for b in blobs:
        w.write(_LEN.pack(memoryview(b).nbytes))
    for b in blobs:
        w.write(b)
    w.flush()


def _read_exact(r, n: int) -> bytes:
    data = r.read(n)
    if data is None or len(data) != n:
        raise EOFError("the learner's process closed the pipe")
    return data


def _recv(r, max_head: int = MAX_JSON, max_total: int = MAX_BLOB_TOTAL) -> tuple[bytes, list[bytes]]:
    n_head, n_blobs = _HEAD.unpack(_read_exact(r, _HEAD.size))
    if n_head > max_head or n_blobs > MAX_BLOBS:
        raise ProtocolError(f"an answer of {n_head} bytes and {n_blobs} arrays: past the limits")
    head = _read_exact(r, n_head)
    lens = [_LEN.unpack(_read_exact(r, _LEN.size))[0] for _ in range(n_blobs)]
    if sum(lens) > max_total:
        raise ProtocolError(f"an answer of {sum(lens) / 1e6:.0f} MB of arrays: past the {max_total >> 20} MB limit")
    return head, [_read_exact(r, n) for n in lens]


# ---------------------------------------------------------------- the child: the learner's modules

_OPS = {
    "__eq__": operator.eq, "__ne__": operator.ne, "__lt__": operator.lt, "__le__": operator.le,
    "__gt__": operator.gt, "__ge__": operator.ge, "__len__": len, "__iter__": iter, "__next__": next,
    "__getitem__": operator.getitem, "__setitem__": operator.setitem, "__delitem__": operator.delitem,
    "__contains__": lambda o, x: x in o, "__bool__": bool, "__int__": int, "__float__": float,
    "__index__": operator.index, "__hash__": hash, "__repr__": repr, "__str__": str, "__format__": format,
    "__neg__": operator.neg, "__pos__": operator.pos, "__abs__": abs, "__invert__": operator.invert,
    "__add__": operator.add, "__radd__": lambda o, x: x + o, "__sub__": operator.sub, "__rsub__": lambda o, x: x - o,
    "__mul__": operator.mul, "__rmul__": lambda o, x: x * o, "__truediv__": operator.truediv,
    "__rtruediv__": lambda o, x: x / o, "__floordiv__": operator.floordiv, "__mod__": operator.mod,
    "__pow__": operator.pow, "__and__": operator.and_, "__or__": operator.or_, "__xor__": operator.xor,
    "__lshift__": operator.lshift, "__rshift__": operator.rshift, "__matmul__": operator.matmul,
    "__rmatmul__": lambda o, x: x @ o, "__reversed__": reversed, "__enter__": lambda o: o.__enter__(),
    "__exit__": lambda o, *a: o.__exit__(*a), "__array__": lambda o, *a: np.asarray(o, *a[:1]),
    "__dir__": dir,
}
_RESOLVABLE = ("builtins", "numpy", "tl_lab.")


def _root(a: np.ndarray) -> np.ndarray:
    r = a
    while isinstance(r.base, np.ndarray):
        r = r.base
    return r


def _bytes(a: np.ndarray) -> np.ndarray:
    """The bytes of `a` in C order, as a uint8 array (a view when `a` is C-contiguous; zero-size arrays too)."""
    return np.ascontiguousarray(a).reshape(-1).view(np.uint8)


def _digest(a: np.ndarray) -> bytes:
    return hashlib.blake2b(_bytes(a), digest_size=16).digest()


class _Server:
    def __init__(self, r, w, learner: set[str]):
        self.r, self.w, self.learner = r, w, learner
        self.objs: dict[int, object] = {}
        self.hids: dict[int, int] = {}
        self.roots: dict[int, np.ndarray] = {}
        self.rids: dict[int, int] = {}
        self.sent: dict[int, bytes] = {}
        self.next = 1
        self.files: set[str] = set()
        self.vals: list = []
        self.aids: dict[int, int] = {}  # id(array) -> its number: the same array returned twice is the same here
        self.arrays: weakref.WeakValueDictionary = weakref.WeakValueDictionary()

    # -- answers
    def _handle(self, x) -> int:
        hid = self.hids.get(id(x))
        if hid is None:
            hid, self.next = self.next, self.next + 1
            self.objs[hid], self.hids[id(x)] = x, hid
        return hid

    def _rid(self, root: np.ndarray) -> int:
        rid = self.rids.get(id(root))
        if rid is None or self.roots.get(rid) is not root:
            rid, self.next = self.next, self.next + 1
            self.roots[rid], self.rids[id(root)] = root, rid
        return rid

    def enc(self, x, blobs: list, depth: int = 0):
        if depth > 200:
            raise ValueError("an answer nested more than 200 deep")
        t = type(x)
        if t is float and x != x:  # NaN: its sign and payload bits, which JSON would lose
            return {"t": "nan", "v": struct.pack("<d", x).hex()}
        if x is None or t in (bool, str, int, float):
            return x
        if t is list and len(x) > 1 and isinstance(x[0], np.generic) and not x[0].dtype.hasobject \
                and x[0].dtype.fields is None and all(type(v) is type(x[0]) and v.dtype == x[0].dtype for v in x):
            blobs.append(np.array(x, dtype=x[0].dtype).tobytes())  # numpy scalars of one type: one blob, not one each
            return {"t": "nl", "d": x[0].dtype.str, "i": len(blobs) - 1}
        if t in (list, tuple, set, frozenset):
            return {"t": {list: "l", tuple: "t", set: "s", frozenset: "fs"}[t], "v": [self.enc(v, blobs, depth + 1) for v in x]}
        if t is dict:
            return {"t": "d", "k": [self.enc(k, blobs, depth + 1) for k in x], "v": [self.enc(v, blobs, depth + 1) for v in x.values()]}
        if t in (bytes, bytearray):
            blobs.append(bytes(x))
            return {"t": "b" if t is bytes else "ba", "i": len(blobs) - 1}
        if t is complex:
            return {"t": "c", "v": [x.real, x.imag]}
        if isinstance(x, np.ndarray) and not x.dtype.hasobject and x.dtype.fields is None:
            return self.enc_array(x)
        if isinstance(x, np.generic) and not x.dtype.hasobject and x.dtype.fields is None:
            blobs.append(np.asarray(x).tobytes())
            return {"t": "n", "d": x.dtype.str, "i": len(blobs) - 1}
        if t is np.dtype and x.fields is None:
            return {"t": "dt", "v": x.str}
        if t in (PosixPath, PurePosixPath):
            return {"t": "p", "v": str(x)}
        if t is slice:
            return {"t": "sl", "v": [self.enc(v, blobs, depth + 1) for v in (x.start, x.stop, x.step)]}
        if isinstance(x, type):
            mod, qual = getattr(x, "__module__", ""), getattr(x, "__qualname__", "")
            if isinstance(mod, str) and mod.startswith(_RESOLVABLE) and mod not in self.learner \
                    and not mod.startswith("tl_lab.lab.exercise") and "<" not in qual:
                try:
                    got = importlib.import_module(mod)
                    for part in qual.split("."):
                        got = getattr(got, part)
                    if got is x:
                        return {"t": "ref", "m": mod, "q": qual}
                except Exception:
                    pass
            return {"t": "h", "id": self._handle(x), "k": "c", "n": qual if isinstance(qual, str) else "?"}
        return {"t": "h", "id": self._handle(x), "k": "o", "n": type(x).__qualname__}

    def enc_array(self, a: np.ndarray) -> dict:
        root = _root(a)
        base = root.__array_interface__["data"][0]
        off = a.__array_interface__["data"][0] - base
        k = next((i for i, v in enumerate(self.vals) if _root(v) is root), None)
        if k is not None:  # one of the arrays the tests passed in (`out=`): theirs, not a copy
            return {"t": "va", "k": k, "o": off, "s": list(a.shape), "st": list(a.strides), "d": a.dtype.str}
        extent = sum((n - 1) * s for n, s in zip(a.shape, a.strides) if s > 0 and n) + a.itemsize
        low = sum((n - 1) * s for n, s in zip(a.shape, a.strides) if s < 0 and n)
        if (not root.flags.c_contiguous or root.dtype.hasobject or root.dtype.fields is not None
                or off + low < 0 or off + extent > root.nbytes):
            root = a = np.ascontiguousarray(a).copy()
            off = 0
        aid = self.aids.get(id(a))
        if aid is None or self.arrays.get(aid) is not a:
            aid, self.next = self.next, self.next + 1
            self.aids[id(a)] = aid
            try:
                self.arrays[aid] = a
            except TypeError:
                pass
        return {"t": "a", "r": self._rid(root), "o": off, "s": list(a.shape), "st": list(a.strides),
                "d": a.dtype.str, "w": bool(a.flags.writeable), "id": aid}

    def exc(self, e: BaseException) -> dict:
        at, tb = "", e.__traceback__
        while tb is not None:
            code = tb.tb_frame.f_code
            if code.co_filename in self.files:
                at = f"{code.co_filename}:{tb.tb_lineno} in {code.co_qualname}"
            tb = tb.tb_next
        if isinstance(e, SyntaxError) and e.filename in self.files:
            at = f"{e.filename}:{e.lineno}"
        t = type(e)
        text = "".join(traceback.format_exception(e))[-8000:]
        try:
            msg = str(e)[:MESSAGE_CHARS]
        except Exception:
            msg = "(its message raised)"
        return {"type": f"{t.__module__}.{t.__qualname__}", "msg": msg, "at": at, "tb": text}

    # -- requests
    def do(self, req):
        op = req[0]
        if op == "import":
            m = importlib.import_module(f"tl_lab.{req[1]}")
            f = getattr(m, "__file__", None)
            if isinstance(f, str):
                self.files.add(f)
            return {"file": f if isinstance(f, str) else None}
        if op == "modattr":
            return getattr(sys.modules[f"tl_lab.{req[1]}"], req[2])
        if op == "setmodattr":
            setattr(sys.modules[f"tl_lab.{req[1]}"], req[2], req[3])
            return None
        if op == "getattr":
            return getattr(req[1], req[2])
        if op == "setattr":
            setattr(req[1], req[2], req[3])
            return None
        if op == "call":
            return req[1](*req[2], **req[3])
        if op == "map":  # `each`: one call per argument, in order, the first exception ends it as the loop would
            return [req[1](a) for a in req[2]]
        if op == "op":
            return _OPS[req[1]](req[2], *req[3])
        if op == "subclass_new":
            _, file, modname, qual, args, kwargs = req
            mod = sys.modules.get(modname)
            if mod is None or getattr(mod, "__file__", None) != file:
                for p in (str(Path(file).parent), str(Path(file).parent.parent)):
                    if p not in sys.path:
                        sys.path.insert(0, p)
                spec = importlib.util.spec_from_file_location(modname, file)
                mod = importlib.util.module_from_spec(spec)
                sys.modules[modname] = mod
                spec.loader.exec_module(mod)
            cls = mod
            for part in qual.split("."):
                cls = getattr(cls, part)
            return cls(*args, **kwargs)
        if op == "replace":
            import dataclasses

            return dataclasses.replace(req[1], **req[2])
        if op == "isinstance":
            return isinstance(req[1], req[2])
        if op == "issubclass":
            return issubclass(req[1], req[2])
        raise ValueError(f"unknown request {op!r}")

    def loop(self) -> None:
        while True:
            try:
                head, blobs = _recv(self.r, 1 << 40, 1 << 40)
            except EOFError:
                return
            meta = json.loads(head)
            for hid in meta.get("free", ()):
                x = self.objs.pop(hid, None)
                if x is not None:
                    self.hids.pop(id(x), None)
            for rid, i in meta.get("push", ()):
                root = self.roots.get(rid)
                if root is not None and root.flags.writeable and root.nbytes == len(blobs[i]):
                    root.reshape(-1).view(np.uint8)[:] = np.frombuffer(blobs[i], np.uint8)
                    self.sent[rid] = _digest(root)
            for rid in meta.get("forget", ()):  # after the pushes: the tests' last writes count, then it is not theirs
                self.sent.pop(rid, None)
            vals = self.vals = pickle.loads(blobs[1])
            before = [_digest(v) for v in vals]
            dump = meta.get("dump")  # seconds: our stack into the stack pipe, shortly before the tests' time-out
            armed = isinstance(dump, (int, float)) and dump > 0 and _arm_stack(dump)
            out: list = []
            try:
                ran = True
                up = pickle.Unpickler(io.BytesIO(blobs[0]))
                up.persistent_load = self._load
                req = up.load()
                ran = not _plain_read(req)  # whether any code could have run (and written into a shared array)
                result = self.do(req)
                del req
                answer = {"ok": self.enc(result, out)}
                del result
            except BaseException as e:  # SystemExit and KeyboardInterrupt too: an answer, not our end
                out = []
                answer = {"exc": self.exc(e)}
                e = None
            if armed:
                _arm_stack(0)
            answer["cb"] = []
            for k, v in enumerate(vals):
                if _digest(v) != before[k]:
                    out.append(np.ascontiguousarray(v).tobytes())
                    answer["cb"].append([k, len(out) - 1])
            del vals
            self.vals = []
            answer["sync"], answer["detach"] = [], []
            for rid in list(self.roots):
                root = self.roots[rid]
                private = sys.getrefcount(root) <= 3  # the dict, root, the argument: nothing of the learner's holds it
                if rid in self.sent and (private or not root.flags.writeable or not ran):
                    d = self.sent[rid]  # nothing here can change it
                else:
                    d = _digest(root)
                if self.sent.get(rid) != d:
                    out.append(_bytes(root))
                    answer["sync"].append([rid, root.dtype.str, list(root.shape), len(out) - 1])
                if private:  # the tests' own array from now on, no longer shared
                    del self.roots[rid]
                    self.sent.pop(rid, None)
                    self.rids.pop(id(root), None)
                    answer["detach"].append(rid)
                else:
                    self.sent[rid] = d
                del root
            _send(self.w, json.dumps(answer).encode(), out)

    def _load(self, pid):
        kind = pid[0]
        if kind == "h":
            return self.objs[pid[1]]
        if kind == "m":
            return sys.modules[f"tl_lab.{pid[1]}"]
        if kind == "a":
            return self.vals[pid[1]]
        if kind == "mv":
            return memoryview(pid[1]).cast("B").cast(pid[2], pid[3]) if pid[2] != "B" else memoryview(pid[1])
        if kind == "v":
            _, rid, off, shape, strides, dtype = pid
            return np.ndarray(shape, np.dtype(dtype), buffer=self.roots[rid], offset=off, strides=strides)
        raise pickle.UnpicklingError(f"unknown persistent id {kind!r}")


def _arm_stack(seconds: float) -> bool:
    from tl_lab.lab.exercise.sandbox import arm_stack

    return arm_stack(seconds)


def _plain_read(req) -> bool:
    """A request that runs no code of anyone's: an attribute held in an object's (or module's) __dict__."""
    try:
        if req[0] == "modattr":
            return req[2] in vars(sys.modules[f"tl_lab.{req[1]}"])
        if req[0] == "getattr":
            obj, name = req[1], req[2]
            d = getattr(obj, "__dict__", None)
            if type(d) is not dict or name not in d:
                return False
            return not any(name in vars(k) and hasattr(vars(k)[name], "__set__") for k in type(obj).__mro__)
    except Exception:
        return False
    return False


def proxied(use) -> set[str]:
    """The modules a run keeps in the child: the learner's modules `use` and the ones they build on
    (DEPS). A borrowed reference (--ref-deps) runs in the child too, so that what comes back through
    a learner's module (model's QLinear from quant) is a handle of the class the tests see. The HARNESS a
    module's tests drive it through (the reference's runner for forward) runs there too: a forward pass is
    then one request, not one per layer and piece (each of which would copy the KV pool across)."""
    from tl_lab.lab.exercise.registry import DEPS, HARNESS

    use = list(use)
    return ({f"tl_lab.{m}" for m in use} | {f"tl_lab.{d}" for m in use for d in DEPS.get(m, ())}
            | {f"tl_lab.{h}" for m in use for h in HARNESS.get(m, ()) if h not in use})


def serve(rfd: int, wfd: int) -> None:
    """The child's loop: the workspace (TL_LAB_WORKSPACE, TL_LAB_EXERCISE_USE) active, answers until the pipe
    closes. The learner's prints go to this process's stdout and stderr, never into the answers' pipe."""
    from tl_lab.lab.exercise.registry import MODULES
    from tl_lab.lab.exercise.workspace import install_from_env

    install_from_env()
    use = [m for m in os.environ.get("TL_LAB_EXERCISE_USE", "").split(",") if m in MODULES]
    server = _Server(os.fdopen(rfd, "rb"), os.fdopen(wfd, "wb"), proxied(use))
    ws = os.environ.get("TL_LAB_WORKSPACE", "")
    if ws:  # the learner's files before their import: what one raises at import (or loops in) names its line
        server.files.update(os.path.join(ws, f"{m}.py") for m in use)
    server.loop()


# ---------------------------------------------------------------- the parent: the tests' side

_dead_conn = None


class Connection:
    """One child holding the learner's modules `use` of `workspace`, started sandboxed on first use."""

    def __init__(self, workspace: Path, use: list[str], module: str, timeout: float, log=None):
        self.workspace, self.use, self.module, self.timeout = Path(workspace), list(use), module, timeout
        self.proc = None
        self.dead = ""
        self.lock = threading.RLock()
        self.handles: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
        self.mirrors: dict[int, list] = {}  # rid -> [root array, digest]
        self.mirror_ids: dict[int, int] = {}
        self.freed: list[int] = []
        self.forget: list[int] = []
        self.files: dict[str, str] = {}
        self.log = log if log is not None else sys.stderr
        self.sandboxed = None
        self._detached: dict = {}
        self._vals: list = []
        self.arrays: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
        self.pieces: dict[int, str] = {}  # handle id -> "module.function" of a learner module's function
        self.calls: list[dict] | None = None  # the running test's calls of those functions (`record`), or None

    # -- the calls the tests made, for the failure report (tl_lab.lab.exercise.diagnose.from_calls)
    def request(self, *req):
        out = exc = None
        pre = None
        if self.calls is not None and req and req[0] == "call" and len(req) == 4:
            try:  # the arguments as given, before the call's copy-back; a Remote refuses: not kept
                pre = pickle.dumps((req[2], req[3]), protocol=pickle.HIGHEST_PROTOCOL)
            except Exception:  # noqa: BLE001
                pre = None
        try:
            out = self._request(*req)
        except BaseException as e:
            exc = e
        try:
            if req and req[0] == "map":
                self._record_map(req, out, exc)
            else:
                self._record(req, out, exc, pre)
        except Exception:  # noqa: BLE001: the log is for the report, never the verdict
            pass
        if exc is not None:
            raise exc
        return out

    def _record_map(self, req, out, exc) -> None:
        """`each`'s calls, logged as the loop's would be: each argument and its answer, up to CALLS_KEPT (the
        exception of the one that raised is not placed: the report then tries the piece on its own cases)."""
        if self.calls is None or exc is not None or not isinstance(out, list) or len(out) != len(req[2]):
            return
        for a, y in zip(req[2], out):
            if len(self.calls) >= CALLS_KEPT:
                return
            try:
                args = pickle.dumps(((a,), {}), protocol=pickle.HIGHEST_PROTOCOL)
            except Exception:  # noqa: BLE001
                return
            self._record(("call", req[1], (a,), {}), y, None, args)

    def _record(self, req, out, exc, args) -> None:
        """A learner module's function (`modattr` of the learner's module) called with plain arguments: the
        piece, the arguments (pickled here, before the call's copy-back), and the answer (plain data only) or
        the error. At most CALLS_KEPT calls a test; arguments of more than CALL_BYTES are not kept."""
        if req[0] == "modattr" and isinstance(out, Remote) and not isinstance(out, RemoteClass):
            self.pieces[object.__getattribute__(out, "_hid")] = f"{req[1]}.{req[2]}"
            return
        if self.calls is None or req[0] != "call" or not isinstance(req[1], Remote) or len(self.calls) >= CALLS_KEPT:
            return
        piece = self.pieces.get(object.__getattribute__(req[1], "_hid"))
        if piece is None or isinstance(exc, (LearnerGone, ProtocolError)):
            return
        if args is None or len(args) > CALL_BYTES or _holds_remote(out):
            return
        from tl_lab.lab.exercise.tries import encode

        if exc is not None:
            at = str(getattr(exc, "learner_at", "") or "")
            file, _, rest = at.partition(":")
            line = int(rest.split()[0]) if rest.split() and rest.split()[0].isdigit() else 0
            text = str(exc)
            name = type(exc).__name__
            if isinstance(exc, LearnerError):
                name, _, text = text.partition(": ")
                text = text[: -len(f" at {at}")] if at and text.endswith(f" at {at}") else text
            answer = ["raised", name, text[:400], file, line, [c.__name__ for c in type(exc).__mro__]]
        else:
            answer = encode(out)
        self.calls.append({"piece": piece, "args": args, "learner": answer})

    def record(self, on: bool) -> list[dict]:
        """Start (on) or stop the log of calls -> the calls logged since the last start."""
        got, self.calls = self.calls or [], ([] if on else None)
        return got

    # -- the child
    def start(self) -> None:
        from tl_lab.lab.exercise import sandbox
        from tl_lab.lab.exercise.workspace import ENV, ENV_USE, REPO_ROOT

        p2c_r, p2c_w = os.pipe()
        c2p_r, c2p_w = os.pipe()
        stack_r, stack_w = os.pipe()  # the child's stack, dumped shortly before a request's time-out (`_stuck_at`)
        cache = sandbox.numba_cache(self.workspace)
        writable = [cache]
        env = {k: v for k, v in os.environ.items() if not k.startswith(("TL_LAB_EXERCISE_", "PYTEST_"))}
        env.pop("TL_LAB_PITFALL", None)
        env.update({ENV: str(self.workspace), ENV_USE: ",".join(self.use), "NUMBA_CACHE_DIR": str(cache),
                    "PYTHONPATH": str(REPO_ROOT), "PYTHONDONTWRITEBYTECODE": "1", "TMPDIR": "/tmp",
                    sandbox.ENV_STACK: f"{stack_w} 0"})
        hide = [REPO_ROOT / ".git", REPO_ROOT / "tl_lab" / f"{self.module}.py"]
        argv = [sys.executable, "-c", "import sys; from tl_lab.lab.exercise.remote import serve; "
                                      f"serve({p2c_r}, {c2p_w})"]
        readable = []
        if os.environ.get("TL_LAB_EXERCISE_BASETEMP"):  # the tests' tmp_path: files they write for the learner's code
            readable.append(Path(os.environ["TL_LAB_EXERCISE_BASETEMP"]).parent)  # pytest makes basetemp anew
            readable[0].mkdir(parents=True, exist_ok=True)
        import subprocess

        self.proc = sandbox.spawn(argv, workspace=self.workspace, writable=writable, hide=hide, env=env, readable=readable,
                                  timeout=min(self.timeout * 50, 86400), cwd=self.workspace, stdin=subprocess.DEVNULL,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, pass_fds=(p2c_r, c2p_w, stack_w))
        os.close(stack_w)
        self._stack = bytearray()
        self._stack_thread = threading.Thread(target=sandbox._stack_reader, args=(stack_r, self._stack), daemon=True)
        self._stack_thread.start()
        # the learner's prints: at most OUTPUT_CAP bytes kept, in the file TL_LAB_EXERCISE_OUTPUT names (else stderr)
        self._output = threading.Thread(target=self._keep_output, daemon=True)
        self._output.start()
        self.sandboxed = self.proc.sandboxed
        os.close(p2c_r)
        os.close(c2p_w)
        self.w = os.fdopen(p2c_w, "wb")
        self.r = os.fdopen(c2p_r, "rb")

    def _keep_output(self) -> None:
        from tl_lab.lab.exercise.files import open_fresh
        from tl_lab.lab.exercise.sandbox import OUTPUT_CAP

        name = os.environ.get("TL_LAB_EXERCISE_OUTPUT", "")
        try:
            out = open_fresh(name) if name else None
        except OSError:
            out = None
        kept = dropped = 0
        stream = self.proc.stdout
        while True:
            try:
                chunk = stream.read1(65536)
            except (OSError, ValueError):
                break
            if not chunk:
                break
            room = OUTPUT_CAP - kept
            if room > 0:
                text = chunk[:room].decode("utf-8", "replace")
                (out.write(text) if out else sys.stderr.write(text))
                kept += min(room, len(chunk))
            dropped += max(0, len(chunk) - max(room, 0))
        tail = f"\n[... {dropped / 1e6:.1f} MB more not kept]\n" if dropped else ""
        if out:
            out.write(tail)
            out.close()
        elif tail:
            sys.stderr.write(tail)

    def close(self, why: str = "the check ended") -> None:
        from tl_lab.lab.exercise import sandbox

        if not self.dead:
            self.dead = why
        if self.proc is not None:
            for f in (getattr(self, "w", None), getattr(self, "r", None)):
                try:
                    f and f.close()
                except OSError:
                    pass
            sandbox.stop(self.proc)
            if getattr(self, "_output", None) is not None:
                self._output.join(timeout=5)

    # -- one request
    def _request(self, *req):
        with self.lock:
            if self.dead:
                raise LearnerGone(f"the learner's process is gone ({self.dead})")
            if self.proc is None:
                self.start()
            vals: list = []
            buf = io.BytesIO()
            p = pickle.Pickler(buf, protocol=pickle.HIGHEST_PROTOCOL)
            p.persistent_id = lambda obj: self._pid(obj, vals)
            try:
                p.dump(req)
            except (pickle.PicklingError, TypeError, AttributeError) as exc:
                raise TypeError(f"cannot pass this to the learner's code across the sandbox: {exc}") from None
            meta = {"free": self.freed[:], "forget": self.forget[:], "push": [], "dump": _dump_at()}
            self.freed.clear()
            self.forget.clear()
            blobs = [buf.getvalue(), pickle.dumps(vals, protocol=pickle.HIGHEST_PROTOCOL)]
            for rid in list(self.mirrors):
                m = self.mirrors[rid]
                arr = m[0]
                viewed = sys.getrefcount(arr) > 3  # the list m, arr, the argument: else no view of it is left here
                if (viewed or m[2]) and arr.flags.writeable and arr.nbytes:  # the tests' writes go back first
                    d = _digest(arr)
                    if d != m[1]:
                        m[1] = d
                        blobs.append(arr.reshape(-1).view(np.uint8).tobytes())
                        meta["push"].append([rid, len(blobs) - 1])
                m[2] = False  # no view handed out since this check (`dec` sets it)
                del m, arr
            try:
                _send(self.w, json.dumps(meta).encode(), blobs)
                head, got = _recv(self.r)
                answer = json.loads(head)
                if not isinstance(answer, dict):
                    raise ProtocolError("an answer that is not an object")
                for rid, dtype, shape, i in answer.get("sync", ()):
                    self._mirror(rid, dtype, shape, got[i])
                self._detached = {}
                for rid in answer.get("detach", ()):
                    m = self.mirrors.pop(rid, None)
                    if m is not None:
                        self._detached[rid] = m
                    if m is not None:
                        self.mirror_ids.pop(id(m[0]), None)
                for k, i in answer.get("cb", ()):
                    self._copy_back(vals[k], got[i])
            except BaseException as exc:  # a time-out (SIGALRM) included: the child is stuck or lying
                code = self.proc.poll()
                self.close(f"exit code {code}" if code is not None else f"{type(exc).__name__}: {exc}")
                if isinstance(exc, (EOFError, OSError)):
                    raise LearnerGone(f"the learner's process ended{'' if code is None else f' (exit code {code})'}"
                                      " (os._exit, a crash, or the memory limit?)") from None
                if isinstance(exc, (ProtocolError, ValueError, KeyError, IndexError, TypeError, struct.error)):
                    raise LearnerGone(f"the learner's process sent an answer we cannot read: {exc}") from None
                at = self._stuck_at()  # a time-out: where the learner's code was looping, from its stack
                if at and not getattr(exc, "learner_at", ""):
                    try:
                        exc.learner_at = at
                    except (AttributeError, TypeError):
                        pass
                raise
            self._vals = vals
            if "exc" in answer:
                raise self._exception(answer["exc"])
            try:
                return self.dec(answer.get("ok"), got)
            except (ProtocolError, ValueError, KeyError, IndexError, TypeError) as exc:
                self.close(f"a bad answer: {exc}")
                raise LearnerGone(f"the learner's process sent an answer we cannot read: {exc}") from None

    def _stuck_at(self) -> str:
        """"file:line in function" of the learner's innermost frame in the child's last stack dump (the child
        has ended: its pipe is read to the end), else ""."""
        from tl_lab.lab.exercise.sandbox import stuck_at

        t = getattr(self, "_stack_thread", None)
        if t is None:
            return ""
        t.join(timeout=2)
        files = {str(self.workspace / f"{m}.py") for m in self.use} | {f for f in self.files.values() if f}
        where = stuck_at(bytes(self._stack).decode("utf-8", "replace"), files)
        return f"{where[0]}:{where[1]} in {where[2]}" if where else ""

    def _pid(self, obj, vals):
        if isinstance(obj, Remote):
            return ("h", object.__getattribute__(obj, "_hid"))
        if isinstance(obj, RemoteModule):
            return ("m", obj.__name__.split(".", 1)[1])
        if isinstance(obj, np.ndarray):
            root = _root(obj)
            rid = self.mirror_ids.get(id(root))
            if rid is not None and self.mirrors.get(rid, [None])[0] is root:
                off = obj.__array_interface__["data"][0] - root.__array_interface__["data"][0]
                return ("v", rid, off, list(obj.shape), list(obj.strides), obj.dtype.str)
            if not obj.dtype.hasobject:
                vals.append(obj)
                return ("a", len(vals) - 1)
        if isinstance(obj, memoryview):
            return ("mv", obj.tobytes(), obj.format, obj.shape)
        return None

    def _mirror(self, rid, dtype, shape, data: bytes) -> None:
        dt = _dtype(dtype)
        shape = tuple(int(n) for n in shape)
        m = self.mirrors.get(rid)
        if m is None or m[0].dtype != dt or m[0].shape != shape:
            n = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
            if n != len(data):
                raise ProtocolError(f"array {rid}: {len(data)} bytes for shape {shape} of {dt}")
            if sum(x[0].nbytes for x in self.mirrors.values()) + n > MAX_MIRRORED:
                raise ProtocolError(f"more than {MAX_MIRRORED >> 20} MB of the learner's arrays at once")
            root = np.empty(shape, dt)
            if m is not None:
                self.mirror_ids.pop(id(m[0]), None)
            m = self.mirrors[rid] = [root, b"", False]
            self.mirror_ids[id(root)] = rid
        if m[0].nbytes != len(data):
            raise ProtocolError(f"array {rid}: {len(data)} bytes, not {m[0].nbytes}")
        m[0].reshape(-1).view(np.uint8)[:] = np.frombuffer(data, np.uint8)
        m[1] = _digest(m[0])

    @staticmethod
    def _copy_back(orig: np.ndarray, data: bytes) -> None:
        if orig.flags.writeable and orig.nbytes == len(data):
            np.copyto(orig, np.frombuffer(data, orig.dtype).reshape(orig.shape))

    def _exception(self, e: dict) -> BaseException:
        name, msg, at = str(e.get("type", "")), str(e.get("msg", ""))[:MESSAGE_CHARS], str(e.get("at", ""))[:500]
        mod, _, qual = name.rpartition(".")
        cls = None
        if mod in ("builtins",) or mod.startswith("tl_lab.errors") or mod.startswith("numpy"):
            try:
                got = importlib.import_module(mod)
                for part in qual.split("."):
                    got = getattr(got, part)
                if isinstance(got, type) and issubclass(got, Exception):
                    cls = got
            except Exception:
                cls = None
        if cls is None:
            where = f" at {at}" if at else ""
            err = LearnerError(f"{qual or name}: {msg}{where}")
        else:
            err = cls.__new__(cls)
            err.args = (msg,)
        err.learner_at = at
        err.learner_traceback = str(e.get("tb", ""))[-8000:]
        return err

    def dec(self, x, blobs):
        if x is None or type(x) in (bool, str, int, float):
            return x
        if type(x) is list:
            raise ProtocolError("a bare list")
        t = x["t"]
        if t in ("l", "t", "s", "fs"):
            items = [self.dec(v, blobs) for v in x["v"]]
            return {"l": list, "t": tuple, "s": set, "fs": frozenset}[t](items)
        if t == "d":
            return {self.dec(k, blobs): self.dec(v, blobs) for k, v in zip(x["k"], x["v"], strict=True)}
        if t == "b":
            return bytes(blobs[x["i"]])
        if t == "ba":
            return bytearray(blobs[x["i"]])
        if t == "nan":
            return struct.unpack("<d", bytes.fromhex(str(x["v"])))[0]
        if t == "c":
            return complex(float(x["v"][0]), float(x["v"][1]))
        if t == "n":
            return np.frombuffer(blobs[x["i"]], _dtype(x["d"]), count=1)[0]
        if t == "nl":
            dt = _dtype(x["d"])
            blob = blobs[x["i"]]
            if len(blob) % dt.itemsize:
                raise ProtocolError("a list of numpy scalars that is not whole")
            return list(np.frombuffer(blob, dt).copy())
        if t == "dt":
            return _dtype(x["v"])
        if t == "p":
            return Path(str(x["v"]))
        if t == "sl":
            return slice(*(self.dec(v, blobs) for v in x["v"]))
        if t == "a":
            m = self.mirrors.get(int(x["r"])) or self._detached.get(int(x["r"]))
            if m is None:
                raise ProtocolError(f"an array of root {x['r']}, never sent")
            aid = x.get("id")
            same = self.arrays.get(aid) if isinstance(aid, int) else None
            if same is not None and _root(same) is m[0]:
                m[2] = True
                return same
            m[2] = True
            a = np.ndarray(tuple(int(n) for n in x["s"]), _dtype(x["d"]), buffer=m[0], offset=int(x["o"]),
                           strides=tuple(int(s) for s in x["st"]))
            if not x.get("w", True):
                a.flags.writeable = False
            if isinstance(aid, int):
                self.arrays[aid] = a
            return a
        if t == "va":
            orig = self._vals[int(x["k"])]
            shape, strides, dt = tuple(int(n) for n in x["s"]), tuple(int(s) for s in x["st"]), _dtype(x["d"])
            if int(x["o"]) == 0 and shape == orig.shape and strides == orig.strides and dt == orig.dtype:
                return orig
            if orig.flags.c_contiguous:
                return np.ndarray(shape, dt, buffer=orig, offset=int(x["o"]), strides=strides)
            raise ProtocolError("a view of an argument that is not contiguous here")
        if t == "ref":
            mod, qual = str(x["m"]), str(x["q"])
            if not mod.startswith(_RESOLVABLE) or mod.startswith("tl_lab.lab.exercise") or mod in self.learner_names():
                raise ProtocolError(f"a class of {mod}")
            got = importlib.import_module(mod)
            for part in qual.split("."):
                got = getattr(got, part)
            if not isinstance(got, type):
                raise ProtocolError(f"{mod}.{qual} is not a class")
            return got
        if t == "h":
            hid = int(x["id"])
            h = self.handles.get(hid)
            if h is None:
                h = (RemoteClass if x.get("k") == "c" else Remote)._new(self, hid, str(x.get("n", "?"))[:200])
                self.handles[hid] = h
                if hid in self.freed:
                    self.freed.remove(hid)
            return h
        raise ProtocolError(f"an answer of kind {t!r}")

    def learner_names(self) -> set[str]:
        return proxied(self.use)


def each(fn, args) -> list:
    """[fn(a) for a in args]: a test's loop over many scalar calls. Where `fn` is the learner's, held in the
    sandboxed child (`exercise check`), the whole loop is one request, not one a call; the answers come back
    as data and are checked here, as the loop's would be."""
    args = list(args)
    if isinstance(fn, Remote):
        return object.__getattribute__(fn, "_conn").request("map", fn, args)
    return [fn(a) for a in args]


def _dump_at() -> float:
    """Seconds from now at which the child dumps its stack: a little before this process's alarm (the test's or
    the collection's time limit, `alarm.time_limit`), so that a request it never answers is said at its line;
    0 (none) when no alarm is set or this is not the main thread."""
    import signal

    if threading.current_thread() is not threading.main_thread():
        return 0.0
    left = signal.getitimer(signal.ITIMER_REAL)[0]
    return round(left - min(1.0, left / 4), 3) if left > 0 else 0.0


def subprocess_devnull():
    import subprocess

    return subprocess.DEVNULL


def _dtype(s) -> np.dtype:
    dt = np.dtype(str(s))
    if dt.hasobject or dt.fields is not None or dt.itemsize == 0 and dt.kind not in "SUV":
        raise ProtocolError(f"dtype {s!r}")
    return dt


class Remote:
    """An object of the learner's process, used here through requests (`Connection`)."""

    __slots__ = ("_conn", "_hid", "_name", "__weakref__")

    @classmethod
    def _new(cls, conn, hid, name):
        self = object.__new__(cls)
        object.__setattr__(self, "_conn", conn)
        object.__setattr__(self, "_hid", hid)
        object.__setattr__(self, "_name", name)
        return self

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__") and name not in ("__name__", "__qualname__", "__doc__",
                                                                            "__dataclass_fields__", "__members__"):
            raise AttributeError(name)
        return object.__getattribute__(self, "_conn").request("getattr", self, name)

    def __setattr__(self, name, value):
        object.__getattribute__(self, "_conn").request("setattr", self, name, value)

    def __call__(self, *args, **kwargs):
        return object.__getattribute__(self, "_conn").request("call", self, args, kwargs)

    def __del__(self):
        try:
            conn = object.__getattribute__(self, "_conn")
            conn.freed.append(object.__getattribute__(self, "_hid"))
        except Exception:
            pass

    def __array__(self, dtype=None, copy=None):
        a = object.__getattribute__(self, "_conn").request("op", "__array__", self, ())
        return a if dtype is None else a.astype(dtype)

    def __reduce_ex__(self, protocol):
        raise TypeError(f"the learner's {object.__getattribute__(self, '_name')} stays in the learner's process")


def _forward(name):
    def method(self, *args):
        return object.__getattribute__(self, "_conn").request("op", name, self, args)

    method.__name__ = name
    return method


for _n in _OPS:
    if _n not in ("__array__",):
        setattr(Remote, _n, _forward(_n))


class RemoteClass(Remote):
    """A class of the learner's: calling it makes an object there; `isinstance` asks there."""

    __slots__ = ()

    def __instancecheck__(self, obj):
        if not isinstance(obj, Remote):
            return False
        return bool(object.__getattribute__(self, "_conn").request("isinstance", obj, self))

    def __mro_entries__(self, bases):
        """A test's `class FixedU(Pcg32)`: a local class whose objects are made in the learner's process,
        from the test's own file (its methods call the learner's there)."""
        conn = object.__getattribute__(self, "_conn")

        class _Made:
            def __new__(cls, *args, **kwargs):
                mod = sys.modules[cls.__module__]
                return conn.request("subclass_new", mod.__file__, cls.__module__, cls.__qualname__, args, kwargs)

        return (_Made,)

    def __subclasscheck__(self, cls):
        if not isinstance(cls, Remote):
            return False
        return bool(object.__getattribute__(self, "_conn").request("issubclass", cls, self))


class RemoteModule(types.ModuleType):
    """`tl_lab.<m>` in the tests' process: each attribute asked of the learner's module in the child."""

    def __init__(self, name: str, conn: Connection, file: str | None):
        super().__init__(name)
        object.__setattr__(self, "_conn", conn)
        object.__setattr__(self, "__file__", file)

    def __getattr__(self, attr):
        if attr.startswith("__") and attr.endswith("__") and attr not in ("__all__",):
            raise AttributeError(attr)
        return object.__getattribute__(self, "_conn").request("modattr", self.__name__.split(".", 1)[1], attr)

    def __setattr__(self, attr, value):
        if attr.startswith("__"):
            return object.__setattr__(self, attr, value)
        object.__getattribute__(self, "_conn").request("setmodattr", self.__name__.split(".", 1)[1], attr, value)

    def __dir__(self):
        return list(object.__getattribute__(self, "_conn").request("op", "__dir__", self, ()))


def _install_replace() -> None:
    """`dataclasses.replace` of a learner's dataclass object (a test's `replace(cfg, quant=...)`) made there."""
    import dataclasses

    if getattr(dataclasses.replace, "_tl_remote", False):
        return
    plain = dataclasses.replace

    def replace(obj, /, **changes):
        if isinstance(obj, Remote):
            return object.__getattribute__(obj, "_conn").request("replace", obj, changes)
        return plain(obj, **changes)

    replace._tl_remote = True
    replace.__doc__ = plain.__doc__
    dataclasses.replace = replace


class RemoteFinder:
    """First on sys.meta_path in the tests' process: `tl_lab.<m>` for each learner module is a RemoteModule."""

    def __init__(self, conn: Connection):
        self.conn = conn
        _install_replace()

    def find_spec(self, fullname, path=None, target=None):
        import importlib.machinery

        if fullname.startswith("tl_lab.") and fullname.split(".", 1)[1] in self.proxied:
            return importlib.machinery.ModuleSpec(fullname, self)
        return None

    @property
    def proxied(self) -> set[str]:
        return {name.split(".", 1)[1] for name in proxied(self.conn.use)}

    def create_module(self, spec):
        m = spec.name.split(".", 1)[1]
        try:
            info = self.conn.request("import", m)
        except (LearnerError, LearnerGone, Exception) as exc:
            at = getattr(exc, "learner_at", "")
            tb = getattr(exc, "learner_traceback", "")
            raise ImportError(f"{at + ': ' if at else ''}tl_lab.{m} raised at import: "
                              f"{type(exc).__name__}: {exc}\n{tb}") from None
        file = info.get("file") if isinstance(info, dict) else None
        self.conn.files[m] = file
        return RemoteModule(spec.name, self.conn, file)

    def exec_module(self, module):
        pass
