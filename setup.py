"""Install ``aiter_gemm`` (runtime), ``gradlib`` (tuner) and ``benchmarks`` (the harness, ``python -m benchmarks.run``;
its raw results stay in the checkout); ``configs/`` ships as ``aiter_gemm/configs``."""

from setuptools import find_packages, setup

setup(
    name="aiter_gemm",
    version="0.1.0",
    description="Tuned-GEMM dispatch runtime and tuner for LLM inference (AITER-compatible configs)",
    python_requires=">=3.10",
    packages=find_packages(include=["aiter_gemm", "aiter_gemm.*", "gradlib", "gradlib.*", "benchmarks"])
    + ["aiter_gemm.configs"],
    package_dir={"aiter_gemm.configs": "configs"},
    package_data={"aiter_gemm.configs": ["*.csv", "*.json", "*/*.csv", "*/*.json", "*/*/*.json", "*/*/*.csv"],
                  # the C++ eager fast path's source, built after install (aiter_gemm/eager_ext.py)
                  "aiter_gemm": ["csrc/*.cpp", "csrc/*.h"]},
    install_requires=[
        "torch>=2.4",  # install the CPU or GPU build you want first (README); this range keeps it
        "triton>=3.0; platform_system == 'Linux'",
        "numpy",
        "pandas",
        "tqdm",
        "filelock",
    ],
    extras_require={
        # matplotlib: the benchmark suite's plots; setuptools: a test installs the package into a temp folder
        "test": ["pytest>=7", "ruff", "matplotlib", "ninja", "setuptools"],
        "ext": ["ninja"],  # torch's C++ extension builder needs it (aiter-gemm-build-ext); plus g++
        "cuda": ["nvmath-python>=1.0,<2"],  # cuBLASLt bindings; tested with 1.0.0
        "ray": ["ray>=2.9"],  # tested with 2.60.0; a ray:// client driver also needs ray[client]
        # examples/hf_decode.py (the checkout's, not installed) and op_tests/test_hf_patch.py; tested with 4.45.2,
        # 4.46.3, 5.17.0, 5.23.0
        "hf": ["transformers>=4.45"],
        # the tilelang backend of gemm_a8w8_blockscale (sm_90); kernels written and measured with 0.1.15, whose
        # lowering the CPU tests check (docs/tilelang.md: the offline pack for GPU machines)
        "tilelang": ["tilelang==0.1.15"],
    },
    entry_points={"console_scripts": ["gemm-tuner=gradlib.gemm_tuner:main",
                                      "aiter-gemm-build-ext=aiter_gemm.eager_ext:main"]},
)
