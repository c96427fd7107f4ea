"""The torch_npu contract files kept in the repository are the pinned wheel's, and its proof cannot vanish.

* ``tests/npu_standin/contract/<version>`` verifies against its SHA256 file (the wheel's checksum
  and each file's); one changed byte, a missing file or another wheel's checksum is one line naming
  it, and a test that would run the stand-in on such files fails.
* A test of a module that runs the stand-in is marked ``backend_contract`` (tests/conftest.py), and
  its skip is reported as a failure; a skip elsewhere stays a skip. Checked in a pytest child that
  loads tests/conftest.py, as the suite does.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from helpers import npu_contract
from helpers.paths import ROOT, TESTS


def test_the_kept_files_are_the_pinned_wheels():
    assert npu_contract.verify(npu_contract.CONTRACT_DIR) is None
    sums = (npu_contract.CONTRACT_DIR / npu_contract.SUMS).read_text()
    assert f"{npu_contract.WHEEL_SHA256}  {npu_contract.WHEEL}" in sums
    assert "Redistribution and use in source and binary forms" in (npu_contract.CONTRACT_DIR / "LICENSE").read_text()


@pytest.fixture
def copy(tmp_path):
    target = tmp_path / npu_contract.VERSION
    shutil.copytree(npu_contract.CONTRACT_DIR, target)
    return target


def test_a_changed_byte_is_named(copy):
    meta = copy / "torch_npu/op_plugin/meta/_meta_registrations.py"
    data = bytearray(meta.read_bytes())
    data[-2] ^= 1
    meta.write_bytes(bytes(data))
    reason = npu_contract.verify(copy)
    assert reason and "_meta_registrations.py has SHA-256" in reason and "\n" not in reason, reason


def test_a_missing_file_or_another_wheel_is_named(copy):
    sums = copy / npu_contract.SUMS
    sums.write_text(sums.read_text().replace(npu_contract.WHEEL_SHA256, "0" * 64))
    assert "not the pinned" in npu_contract.verify(copy)
    shutil.copy(npu_contract.CONTRACT_DIR / npu_contract.SUMS, sums)
    (copy / "LICENSE").unlink()
    assert npu_contract.verify(copy).endswith("LICENSE is missing")


def test_the_stand_in_is_not_run_on_other_files(copy, monkeypatch):
    (copy / "torch_npu/csrc/aten/npu_native_functions_by_codegen.yaml").write_text("custom: []\n")
    monkeypatch.setenv(npu_contract.ENV_DIR, str(copy))
    with pytest.raises(pytest.fail.Exception, match="npu_native_functions_by_codegen.yaml has SHA-256"):
        npu_contract.standin_env()


def test_a_skipped_contract_test_fails_the_run(tmp_path):
    (tmp_path / "test_contract_module.py").write_text(textwrap.dedent("""
        import pytest
        from helpers.npu_contract import standin_env

        def test_skips():
            pytest.skip("the stand-in could not start")
    """))
    (tmp_path / "test_other_module.py").write_text(textwrap.dedent("""
        import pytest

        def test_skips():
            pytest.skip("an optional library is missing")
    """))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), str(ROOT)]), "ADAPTOR_TEST_COLD": "1"}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "conftest",
                           "-rfs", str(tmp_path)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "1 failed, 1 skipped" in out, out
    assert "a backend contract test may not be skipped: Skipped: the stand-in could not start" in out, out
    assert "SKIPPED [1] test_other_module.py" in out, out
