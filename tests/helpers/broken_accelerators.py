"""Accelerator packages that are installed but broken, built in a test's directory for a fresh process's path.

Each fails the way the real one does on a misconfigured host, through the same mechanism, with nothing
of torch replaced:

* :func:`torch_npu_missing_libhccl`: a ``torch_npu`` whose C extension ``torch_npu/_C`` is a real shared
  object linked against ``libhccl.so``, which is not on the loader's path (CANN's ``set_env.sh`` not
  sourced), so ``import torch_npu`` raises the dynamic loader's own ``ImportError``.
* :func:`torch_npu_failing_device_query`: a ``torch_npu`` that imports and registers ``torch.npu`` (and
  the ``npu`` device name), whose ``is_available()``/``device_count()`` raise ``RuntimeError`` as the
  runtime does when the Ascend driver and CANN versions do not match.
* :func:`torch_npu_counting_no_device`: a ``torch_npu`` whose ``device_count()`` answers 0 without raising,
  as torch_npu's does when ``aclrtGetDeviceCount`` fails, and whose ``torch.npu.init()`` raises.
* :func:`nvml_reporting_one_gpu`: a ``libnvidia-ml.so.1`` (the NVIDIA driver's management library, which
  torch's ``device_count()`` asks before CUDA starts) reporting one GPU on a host without the CUDA
  driver ``libcuda.so.1``: a GPU the driver shows that CUDA cannot start. Put its directory on
  ``LD_LIBRARY_PATH``.

The shared objects need a C compiler, which the suite has anyway (inductor compiles C++ on CPU).
"""
from __future__ import annotations

import importlib.machinery
import shutil
import subprocess
from pathlib import Path

#: What the loader says when ``torch_npu._C`` needs CANN's collective library and cannot find it.
MISSING_LIBHCCL = "libhccl.so: cannot open shared object file: No such file or directory"
#: The device-query failure of :func:`torch_npu_failing_device_query`.
DEVICE_QUERY_ERROR = "aclrtGetDeviceCount failed, error code 507033: the driver and CANN versions do not match"
#: The ``torch.npu.init()`` failure of :func:`torch_npu_counting_no_device`.
INIT_ERROR = "aclrtSetDevice failed, error code 507033: the driver and CANN versions do not match"


def _cc() -> str:
    compiler = shutil.which("cc") or shutil.which("gcc")
    assert compiler, "a C compiler (cc or gcc) is needed to build the broken accelerator libraries"
    return compiler


def _shared_object(out: Path, source: str, *link: str) -> Path:
    src = out.with_name(out.name.split(".")[0] + "_src.c")
    src.write_text(source)
    subprocess.run([_cc(), "-shared", "-fPIC", "-o", str(out), str(src), *link], check=True, capture_output=True)
    src.unlink()
    return out


def torch_npu_missing_libhccl(root: Path) -> Path:
    """``root/torch_npu`` whose extension cannot load; returns ``root`` (for PYTHONPATH)."""
    package = root / "torch_npu"
    package.mkdir(parents=True)
    cann = root.parent / f"{root.name}_cann_lib"  # where CANN's libraries would be; removed after linking
    cann.mkdir()
    _shared_object(cann / "libhccl.so", "int HcclGetRankSize(void *comm, unsigned *size) { *size = 1; return 0; }\n")
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    _shared_object(package / f"_C{suffix}",
                   "int HcclGetRankSize(void *comm, unsigned *size);\n"
                   "void *PyInit__C(void) { unsigned n; HcclGetRankSize(0, &n); return 0; }\n",
                   f"-L{cann}", "-lhccl")
    shutil.rmtree(cann)
    (package / "__init__.py").write_text("import torch\n\nfrom torch_npu import _C  # noqa: F401  linked against libhccl.so\n")
    return root


def torch_npu_failing_device_query(root: Path) -> Path:
    """``root/torch_npu`` that imports and registers ``torch.npu`` whose device query raises; returns ``root``."""
    package = root / "torch_npu"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(
        "import sys\nimport types\n\nimport torch\n\n"
        "torch.utils.rename_privateuse1_backend('npu')\n"
        "npu = types.ModuleType('torch_npu.npu')\n\n\n"
        "def _query(*args, **kwargs):\n"
        f"    raise RuntimeError({DEVICE_QUERY_ERROR!r})\n\n\n"
        "npu.is_available = npu.device_count = _query\n"
        "sys.modules['torch_npu.npu'] = npu\n"
        "torch.npu = npu\n"
    )
    return root


def torch_npu_counting_no_device(root: Path) -> Path:
    """``root/torch_npu`` that imports, counts no device and fails to initialise; returns ``root``."""
    package = root / "torch_npu"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(
        "import sys\nimport types\n\nimport torch\n\n"
        "torch.utils.rename_privateuse1_backend('npu')\n"
        "npu = types.ModuleType('torch_npu.npu')\n"
        "npu.is_available = lambda: False\n"
        "npu.device_count = lambda: 0\n\n\n"
        "def init():\n"
        f"    raise RuntimeError({INIT_ERROR!r})\n\n\n"
        "npu.init = init\n"
        "sys.modules['torch_npu.npu'] = npu\n"
        "torch.npu = npu\n"
    )
    return root


def nvml_reporting_one_gpu(directory: Path) -> Path:
    """``directory/libnvidia-ml.so.1`` that initialises and counts one GPU; returns ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    _shared_object(directory / "libnvidia-ml.so.1",
                   "int nvmlInit(void) { return 0; }\nint nvmlInit_v2(void) { return 0; }\n"
                   "int nvmlShutdown(void) { return 0; }\n"
                   "int nvmlDeviceGetCount_v2(unsigned *n) { *n = 1; return 0; }\n"
                   "int nvmlDeviceGetCount(unsigned *n) { *n = 1; return 0; }\n")
    return directory
