"""Builds the devrt Python package: CMake builds libdevrt_c.so (target devrt_c, Release, CUDA when a
toolkit is found), which is copied into the package next to its modules.

    python3 -m pip install --no-build-isolation .
    python3 -m pip wheel --no-build-isolation .

Environment: DEVRT_CMAKE_ARGS, extra arguments for the CMake configure step (split like a shell
command line, e.g. "-DDEVRT_CUDA=OFF"); CMAKE_BUILD_PARALLEL_LEVEL, the number of build jobs
(default: every CPU); CMAKE_GENERATOR, the generator (default: Ninja where installed).
The CMake build tree is build/pip/cmake, reused by later builds.
"""

import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

from setuptools import Command, Distribution, setup
from setuptools.command.build_ext import build_ext

try:
    from setuptools.command.build import build
except ImportError:  # setuptools < 62
    from distutils.command.build import build

try:
    from setuptools.command.bdist_wheel import bdist_wheel  # setuptools >= 70.1
except ImportError:
    try:
        from wheel.bdist_wheel import bdist_wheel
    except ImportError:
        bdist_wheel = None

ROOT = Path(__file__).resolve().parent
BUILD_DIR = ROOT / "build" / "pip"
LIBRARY = "libdevrt_c.so"


def cmake_version():
    text = (ROOT / "CMakeLists.txt").read_text()
    m = re.search(r"project\(\s*devrt\s+VERSION\s+([0-9][0-9.]*)", text)
    if not m:
        raise RuntimeError("devrt: no project(devrt VERSION ...) in CMakeLists.txt")
    return m.group(1)


class BinaryDistribution(Distribution):
    """Holds a native library: installed into platlib, with a platform wheel."""

    def has_ext_modules(self):
        return True


class devrt_build(build):
    """setuptools' own staging trees go under build/pip too, beside the CMake tree."""

    def initialize_options(self):
        super().initialize_options()
        self.build_base = str(BUILD_DIR / "setuptools")


class cmake_build_ext(build_ext):
    """Configures and builds the devrt_c target, then copies libdevrt_c.so into the package."""

    def run(self):
        cmake = shutil.which("cmake")
        if cmake is None:
            raise RuntimeError("devrt: cmake (3.25 or newer) is needed to build libdevrt_c.so")
        tree = BUILD_DIR / "cmake"
        tree.mkdir(parents=True, exist_ok=True)
        configure = [cmake, "-S", str(ROOT), "-B", str(tree)]
        # A generator is chosen once, when the tree is made.
        if not (tree / "CMakeCache.txt").exists() and not os.environ.get("CMAKE_GENERATOR") and shutil.which("ninja"):
            configure += ["-G", "Ninja"]
        configure += [
            "-DCMAKE_BUILD_TYPE=Release",
            "-DDEVRT_STATIC_DEPS=ON",  # loads on machines without Boost, fmt, spdlog
            "-DDEVRT_BUILD_TESTS=OFF",
            "-DDEVRT_BUILD_BENCHMARKS=OFF",
            "-DDEVRT_BUILD_EXAMPLES=OFF",
            "-DDEVRT_WARNINGS_AS_ERRORS=OFF",  # another compiler's new warnings must not stop an install
        ]
        configure += shlex.split(os.environ.get("DEVRT_CMAKE_ARGS", ""))
        jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL") or str(os.cpu_count() or 1)
        self._run(configure)
        self._run([cmake, "--build", str(tree), "--target", "devrt_c", "--parallel", jobs])

        built = tree / "runtime" / LIBRARY
        if not built.is_file():
            raise RuntimeError(f"devrt: the build made no {built}")
        for dest in self._destinations():
            dest.mkdir(parents=True, exist_ok=True)
            shutil.copy2(built, dest / LIBRARY)

    def _destinations(self):
        if self.inplace:  # editable install: beside the sources
            return [ROOT / "python" / "devrt"]
        return [Path(self.build_lib) / "devrt"]

    def _run(self, cmd):
        print("devrt:", " ".join(shlex.quote(c) for c in cmd), flush=True)
        subprocess.check_call(cmd, cwd=ROOT)

    def get_outputs(self):
        return [str(d / LIBRARY) for d in self._destinations()]

    def get_source_files(self):
        return []


cmdclass = {"build": devrt_build, "build_ext": cmake_build_ext}

if bdist_wheel is not None:

    class devrt_bdist_wheel(bdist_wheel):
        """Tagged py3-none-<platform>: the library is loaded by ctypes, so any CPython 3 on this
        platform can use it, but only on this platform."""

        def finalize_options(self):
            super().finalize_options()
            self.root_is_pure = False

        def get_tag(self):
            _, _, plat = super().get_tag()
            return "py3", "none", plat

    cmdclass["bdist_wheel"] = devrt_bdist_wheel

else:

    class no_bdist_wheel(Command):
        """Says what is missing instead of setuptools' "invalid command 'bdist_wheel'"."""

        user_options = []

        def initialize_options(self):
            pass

        def finalize_options(self):
            raise SystemExit(
                "error: devrt: building a wheel (pip install, pip wheel) with this setuptools needs the "
                "'wheel' package: apt-get install python3-wheel, or pip install wheel, or setuptools >= 70.1")

        def run(self):
            self.finalize_options()

    cmdclass["bdist_wheel"] = no_bdist_wheel

setup(version=cmake_version(), distclass=BinaryDistribution, cmdclass=cmdclass)
