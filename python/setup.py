# Builds memeff's PyTorch extension, memeff._C: the memeff library sources from ../src plus the
# torch bindings in csrc/, compiled by torch.utils.cpp_extension against the torch already
# installed (hence: pip install --no-build-isolation ./python). The C++ core stays torch-free.
#
# Environment knobs:
#   MEMEFF_CUDA=auto|1|0   build the CUDA backends (auto: when torch has CUDA and nvcc exists)
#   TORCH_CUDA_ARCH_LIST   GPU targets as torch reads them (e.g. "9.0a"); default sm_80 + sm_90a
#   MAX_JOBS               parallel compile jobs (torch's ninja build)
#   CXX, CC                the compilers (torch's defaults: c++, and nvcc's own host compiler)
import glob
import os
import re
import sys

from setuptools import find_packages, setup

try:
    import torch
    from torch.utils.cpp_extension import (CUDA_HOME, BuildExtension, CppExtension, CUDAExtension,
                                          include_paths)
except ImportError:  # pragma: no cover - the message is the point
    sys.exit("memeff's PyTorch extension builds against an installed torch: install torch first, "
             "then run `pip install --no-build-isolation ./python`.")

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def project_version() -> str:
    with open(os.path.join(ROOT, "CMakeLists.txt"), encoding="utf-8") as f:
        match = re.search(r"project\(\s*memeff\s+VERSION\s+([0-9.]+)", f.read())
    if not match:
        sys.exit("setup.py: could not read the project version from ../CMakeLists.txt")
    return match.group(1)


def nvcc_path():
    if CUDA_HOME is None:
        return None
    path = os.path.join(CUDA_HOME, "bin", "nvcc")
    return path if os.path.exists(path) else None


def build_with_cuda() -> bool:
    mode = os.environ.get("MEMEFF_CUDA", "auto").strip().lower()
    available = torch.version.cuda is not None and nvcc_path() is not None
    if mode in ("0", "off", "no", "false"):
        return False
    if mode in ("1", "on", "yes", "true"):
        if not available:
            sys.exit(f"MEMEFF_CUDA={mode} but torch.version.cuda={torch.version.cuda!r} and "
                     f"nvcc={nvcc_path()!r}: a CUDA build needs both")
        return True
    if mode != "auto":
        sys.exit(f"MEMEFF_CUDA: expected auto, 1 or 0, got {mode!r}")
    return available


def links_shared_libstdcxx(compiler: str) -> bool:
    """Whether `compiler` links C++ shared objects against libstdc++.so. A compiler that finds only
    libstdc++.a embeds a private copy of the C++ library in memeff._C, whose iostreams were never
    initialised in a process that loaded the shared one: the first std::ostream use crashes. (Seen
    on a machine whose CXX was a relocated g++ without its libstdc++.so.) Unknown -> True."""
    import subprocess
    try:
        found = subprocess.run([compiler, "-print-file-name=libstdc++.so"], capture_output=True,
                               text=True, check=True, timeout=60).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return True
    if found == "libstdc++.so":  # not found anywhere: the link would take libstdc++.a
        return False
    return not os.path.isabs(found) or os.path.exists(found)


def choose_compilers():
    """torch builds with $CXX (default c++) and hands $CC to nvcc as its host compiler. When $CXX
    would link libstdc++ statically, switch both to a compiler that links it as a shared library
    (saying so on stderr), or stop with the reason."""
    import shutil
    cxx = os.environ.get("CXX") or "c++"
    if links_shared_libstdcxx(cxx):
        return
    current = os.path.realpath(shutil.which(cxx) or cxx)
    for candidate in ("/usr/bin/g++", shutil.which("g++"), shutil.which("c++")):
        if not candidate or os.path.realpath(candidate) == current:
            continue
        if not os.path.exists(candidate) or not links_shared_libstdcxx(candidate):
            continue
        cc = os.path.join(os.path.dirname(candidate), "gcc")
        print(f"setup.py: CXX={cxx} finds no libstdc++.so and would link the C++ library "
              f"statically into memeff._C (which then crashes in iostreams); building with "
              f"CXX={candidate}" + (f" CC={cc}" if os.path.exists(cc) else "") + " instead",
              file=sys.stderr)
        os.environ["CXX"] = candidate
        if os.path.exists(cc):
            os.environ["CC"] = cc
        return
    sys.exit(f"setup.py: CXX={cxx} finds no libstdc++.so (`{cxx} -print-file-name=libstdc++.so`) "
             "and would link the C++ library statically into memeff._C, which crashes at run "
             "time; set CXX (and CC) to a compiler that links libstdc++ as a shared library")


def sources(*patterns):
    found = []
    for pattern in patterns:
        found += sorted(glob.glob(os.path.join(ROOT, pattern), recursive=True))
    return found


choose_compilers()
with_cuda = build_with_cuda()
version = project_version()

# Of the context-parallel layer (src/cp) only the cut and the schedule: the PyTorch ring moves its
# blocks with torch.distributed and merges them with torch ops (memeff/torch/context_parallel.py).
cxx_sources = sources("src/core/*.cpp", "src/cpu/*.cpp", "src/cp/partition.cpp") + [
    os.path.join(HERE, "csrc", "ops.cpp"),
    os.path.join(HERE, "csrc", "autograd.cpp"),
    os.path.join(HERE, "csrc", "cp_ops.cpp"),
    os.path.join(HERE, "csrc", "module.cpp"),
]
if not os.path.exists(os.path.join(ROOT, "src", "core", "dispatch.cpp")):
    sys.exit(f"setup.py: memeff's sources are not at {ROOT}/src; build from a checkout of the repo")

# torch's headers are not -Wextra clean: naming them with -isystem (which overrides torch's own
# -I for the same folders) keeps the warnings to memeff's code.
torch_system_includes = [f"-isystem{path}" for path in include_paths()]
cxx_flags = ["-O3", "-g0", "-std=c++20", "-fopenmp", "-Wall", "-Wextra", "-Wno-unknown-pragmas"]
cxx_flags += torch_system_includes
nvcc_flags = [
    "-O3",
    "-std=c++20",
    "--expt-relaxed-constexpr",
    # torch adds these to every nvcc call; memeff's kernels use the half/bf16 operators.
    "-U__CUDA_NO_HALF_OPERATORS__",
    "-U__CUDA_NO_HALF_CONVERSIONS__",
    "-U__CUDA_NO_BFLOAT16_CONVERSIONS__",
    "-U__CUDA_NO_HALF2_OPERATORS__",
]
arch_list = os.environ.get("TORCH_CUDA_ARCH_LIST")
if not arch_list:
    # The project's CMake default: Ampere and Hopper (sm_90a for the Hopper-only instructions).
    nvcc_flags += ["-gencode=arch=compute_80,code=sm_80", "-gencode=arch=compute_90a,code=sm_90a",
                   "-gencode=arch=compute_80,code=compute_80"]  # PTX for newer GPUs
if not arch_list or "9.0a" in arch_list:
    # The cuda_sm90 backend's kernels were compiled for sm_90a (else they are stubs it refuses).
    nvcc_flags += ["-DMEMEFF_CUDA_SM90A=1"]

define_macros = [("MEMEFF_VERSION", f'"{version}"')]
include_dirs = [os.path.join(ROOT, "include"), os.path.join(ROOT, "src"), os.path.join(HERE, "csrc")]

if with_cuda:
    define_macros.append(("MEMEFF_WITH_CUDA", "1"))
    all_sources = (cxx_sources + sources("src/cuda/**/*.cu", "src/cuda/**/*.cpp") + [
        os.path.join(HERE, "csrc", "ops_cuda.cpp"),
        os.path.join(HERE, "csrc", "rng_state.cu"),
    ])
    extension = CUDAExtension(
        name="memeff._C",
        sources=all_sources,
        include_dirs=include_dirs,
        define_macros=define_macros,
        libraries=["cublas", "gomp"],
        extra_compile_args={"cxx": cxx_flags, "nvcc": nvcc_flags},
        extra_link_args=["-fopenmp"],
    )
else:
    extension = CppExtension(
        name="memeff._C",
        sources=cxx_sources,
        include_dirs=include_dirs,
        define_macros=define_macros,
        extra_compile_args={"cxx": cxx_flags},
        extra_link_args=["-fopenmp"],
    )

print(f"memeff {version}: building the torch extension "
      f"{'with' if with_cuda else 'without'} CUDA ({len(extension.sources)} sources)",
      file=sys.stderr)

setup(
    name="memeff",
    version=version,
    description="memeff: fused attention with dropout, as PyTorch ops",
    packages=find_packages(include=["memeff", "memeff.*"]),
    ext_modules=[extension],
    cmdclass={"build_ext": BuildExtension},
    python_requires=">=3.9",
    zip_safe=False,
)
