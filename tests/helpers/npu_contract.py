"""The torch_npu contract the NPU stand-in is checked against: two plain files from the torch_npu wheel.

No Ascend device exists where these tests run, so the NPU code paths run against the stand-in in
``tests/npu_standin``. Its operators are held to what torch_npu itself ships, not to what we
believe of it:

* ``torch_npu/csrc/aten/npu_native_functions_by_codegen.yaml``: every ``npu_*`` schema
  (argument names, types, defaults, return tuples);
* ``torch_npu/op_plugin/meta/_meta_registrations.py``: the ops' own shape and dtype rules.

The wheel is fetched from PyPI by name and version (``pip download --no-deps``: nothing installs,
nothing of it is imported), checked against a pinned SHA-256, and only those two files are kept,
under ``.cache/torch_npu_contract/<version>/``. Without network the tests that need it skip and
say why. ``python tests/helpers/npu_contract.py`` fetches it by hand.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository (this file: tests/helpers/npu_contract.py)
STANDIN = ROOT / "tests" / "npu_standin"

VERSION = "2.14.0"
WHEEL = f"torch_npu-{VERSION}-cp312-cp312-manylinux_2_28_x86_64.whl"
SHA256 = "e920a8cdd1aec09baaacba428144aff38cef889e09746360a4fed00b5de9c077"
FILES = (
    "torch_npu/csrc/aten/npu_native_functions_by_codegen.yaml",
    "torch_npu/op_plugin/meta/_meta_registrations.py",
)
ENV_DIR = "TORCH_NPU_CONTRACT_DIR"  # the stand-in reads the contract from here
DEFAULT_DIR = ROOT / ".cache" / "torch_npu_contract" / VERSION


def contract_dir() -> Path:
    return Path(os.environ.get(ENV_DIR) or DEFAULT_DIR)


def present(directory: Path | None = None) -> bool:
    directory = directory or contract_dir()
    return all((directory / f).is_file() for f in FILES) and (directory / "SHA256").is_file()


def fetch(directory: Path | None = None, timeout: int = 300) -> Path:
    """Download the pinned wheel, verify it, keep the two contract files. Raises RuntimeError with one line."""
    directory = directory or contract_dir()
    if present(directory):
        return directory
    with tempfile.TemporaryDirectory(prefix="torch_npu_wheel_") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
               "--python-version", "3.12", "--implementation", "cp", "--platform", "manylinux_2_28_x86_64",
               "-d", tmp, f"torch_npu=={VERSION}"]
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"pip download torch_npu=={VERSION} took over {timeout} s") from None
        wheel = Path(tmp) / WHEEL
        if out.returncode != 0 or not wheel.is_file():
            last = (out.stderr.strip().splitlines() or ["no wheel"])[-1]
            raise RuntimeError(f"pip download torch_npu=={VERSION} failed: {last}")
        digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
        if digest != SHA256:
            raise RuntimeError(f"{WHEEL} has SHA-256 {digest}, expected {SHA256}")
        staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=_mkdir(directory.parent)))
        staging.chmod(0o755)
        with zipfile.ZipFile(wheel) as zf:
            for name in FILES:
                target = staging / name
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(zf.read(name))
        (staging / "SHA256").write_text(f"{digest}  {WHEEL}\n")
        shutil.rmtree(directory, ignore_errors=True)
        os.replace(staging, directory)  # whole or absent, never half-written
    return directory


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


_state: dict = {}


def ensure() -> str | None:
    """Fetch once per process; None when the contract is there, else why it is not."""
    if "reason" not in _state:
        try:
            fetch()
            _state["reason"] = None
        except (RuntimeError, OSError) as exc:
            _state["reason"] = f"torch_npu {VERSION} contract unavailable ({exc})"
    return _state["reason"]


def standin_env(base: dict | None = None, **extra: str) -> dict:
    """Environment for a child process that imports the torch_npu stand-in; skips the test without the contract."""
    reason = ensure()
    if reason is not None:
        import pytest

        pytest.skip(reason)
    env = dict(os.environ if base is None else base)
    env.pop("ADAPTOR_BACKEND", None)  # the child detects the npu backend itself, unless told below
    env["PYTHONPATH"] = os.pathsep.join([str(STANDIN), str(ROOT)])
    env[ENV_DIR] = str(contract_dir())
    env.update(extra)
    return env


if __name__ == "__main__":
    try:
        print(fetch())
    except RuntimeError as exc:
        sys.exit(f"npu_contract: error: {exc}")
