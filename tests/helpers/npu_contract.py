"""The torch_npu contract the NPU stand-in is checked against: two plain files of the torch_npu wheel, kept here.

No Ascend device exists where these tests run, so the NPU code paths run against the stand-in in
``tests/npu_standin``. Its operators are held to what torch_npu itself ships, not to what we
believe of it:

* ``torch_npu/csrc/aten/npu_native_functions_by_codegen.yaml``: every ``npu_*`` schema
  (argument names, types, defaults, return tuples);
* ``torch_npu/op_plugin/meta/_meta_registrations.py``: the ops' own shape and dtype rules.

Both are kept, unchanged, in ``tests/npu_standin/contract/<version>/`` with the wheel's LICENSE
(torch_npu is BSD-3-Clause) and ``SHA256``: the wheel's checksum and each kept file's. A test that
runs the stand-in verifies the files against it first and fails, never skips, when one is missing
or differs: the proof depends on no download, and runs on the files the wheel ships or not at all.

``python tests/helpers/npu_contract.py`` verifies them; ``--refresh`` downloads the pinned wheel
(``pip download --no-deps``: nothing installs, nothing of it is imported), checks its SHA-256 and
extracts the files again.
"""
from __future__ import annotations

import argparse
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
WHEEL_SHA256 = "e920a8cdd1aec09baaacba428144aff38cef889e09746360a4fed00b5de9c077"
# kept file -> its name inside the wheel
MEMBERS = {
    "torch_npu/csrc/aten/npu_native_functions_by_codegen.yaml": "torch_npu/csrc/aten/npu_native_functions_by_codegen.yaml",
    "torch_npu/op_plugin/meta/_meta_registrations.py": "torch_npu/op_plugin/meta/_meta_registrations.py",
    "LICENSE": f"torch_npu-{VERSION}.dist-info/licenses/LICENSE",
}
SUMS = "SHA256"
ENV_DIR = "TORCH_NPU_CONTRACT_DIR"  # the stand-in reads the contract from here
CONTRACT_DIR = STANDIN / "contract" / VERSION


def contract_dir() -> Path:
    return Path(os.environ.get(ENV_DIR) or CONTRACT_DIR)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _read_sums(directory: Path) -> dict[str, str]:
    sums = {}
    for line in (directory / SUMS).read_text().splitlines():
        digest, _, name = line.partition("  ")
        sums[name] = digest
    return sums


def verify(directory: Path | None = None) -> str | None:
    """None when ``directory`` holds the pinned wheel's files unchanged, else one line saying what is wrong."""
    directory = directory or contract_dir()
    where = f"torch_npu {VERSION} contract in {directory}"
    if not (directory / SUMS).is_file():
        return f"{where}: {SUMS} is missing"
    sums = _read_sums(directory)
    if sums.get(WHEEL) != WHEEL_SHA256:
        return f"{where}: {SUMS} records wheel {sums.get(WHEEL)}, not the pinned {WHEEL} {WHEEL_SHA256}"
    for name in MEMBERS:
        path = directory / name
        if not path.is_file():
            return f"{where}: {name} is missing"
        if name not in sums:
            return f"{where}: {SUMS} has no checksum for {name}"
        if _sha256(path) != sums[name]:
            return f"{where}: {name} has SHA-256 {_sha256(path)}, {SUMS} records {sums[name]}"
    return None


def refresh(directory: Path | None = None, timeout: int = 300) -> Path:
    """Download the pinned wheel, verify it, extract the kept files and their checksums. Raises RuntimeError with one line."""
    directory = directory or contract_dir()
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
        digest = _sha256(wheel)
        if digest != WHEEL_SHA256:
            raise RuntimeError(f"{WHEEL} has SHA-256 {digest}, expected {WHEEL_SHA256}")
        directory.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=directory.parent))
        staging.chmod(0o755)
        lines = [f"{digest}  {WHEEL}"]
        with zipfile.ZipFile(wheel) as zf:
            for name, member in MEMBERS.items():
                target = staging / name
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(zf.read(member))
                lines.append(f"{_sha256(target)}  {name}")
        (staging / SUMS).write_text("\n".join(lines) + "\n")
        shutil.rmtree(directory, ignore_errors=True)
        os.replace(staging, directory)  # whole or absent, never half-written
    return directory


def standin_env(base: dict | None = None, **extra: str) -> dict:
    """Environment for a child process that imports the torch_npu stand-in; fails the test when the
    contract files are not the pinned wheel's."""
    reason = verify()
    if reason is not None:
        import pytest

        pytest.fail(f"{reason} (python tests/helpers/npu_contract.py --refresh extracts them again)", pytrace=False)
    env = dict(os.environ if base is None else base)
    env.pop("ADAPTOR_BACKEND", None)  # the child detects the npu backend itself, unless told below
    env["PYTHONPATH"] = os.pathsep.join([str(STANDIN), str(ROOT)])
    env[ENV_DIR] = str(contract_dir())
    env.update(extra)
    return env


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--refresh", action="store_true",
                        help=f"download torch_npu {VERSION} from PyPI, check its pinned SHA-256, extract the files again")
    args = parser.parse_args(argv)
    if args.refresh:
        try:
            refresh()
        except RuntimeError as exc:
            print(f"npu_contract: error: {exc}", file=sys.stderr)
            return 2
    reason = verify()
    if reason is not None:
        print(f"npu_contract: error: {reason}", file=sys.stderr)
        return 2
    print(f"{contract_dir()}: torch_npu {VERSION}'s files, as its wheel (SHA-256 {WHEEL_SHA256}) ships them")
    return 0


if __name__ == "__main__":
    sys.exit(main())
