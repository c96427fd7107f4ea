"""A megatron-core other than the one the patches target stops with one line naming it."""
from __future__ import annotations

import pytest

from adaptor.version import SUPPORTED_MEGATRON_CORE, check_megatron_version


def test_other_version_is_one_line_naming_the_supported_one(capsys):
    with pytest.raises(SystemExit) as exc:
        check_megatron_version(found="0.18.0")
    assert exc.value.code != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].startswith("megatron-adaptor: error:")
    assert "0.18.0" in err[0] and f"megatron-core=={SUPPORTED_MEGATRON_CORE}" in err[0]


def test_supported_version_passes():
    check_megatron_version(found=SUPPORTED_MEGATRON_CORE)
    assert SUPPORTED_MEGATRON_CORE == "0.19.2"
