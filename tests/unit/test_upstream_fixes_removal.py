"""Every patch that works around an upstream defect says when it can be removed.

Each module under ``patches/upstream_fixes/`` (found on disk, so a module added there later is
checked without being listed here) and each module in :data:`OTHER_FIXES` has a docstring paragraph
starting ``Remove when:``. It gives the condition under which the patch is no longer needed and
where upstream stands: the release, commit, pull request or issue that fixes it, or the version
(megatron-core 0.19.2, a Megatron-LM commit) against which it was found still unfixed. Docstrings
are read with ``ast``; nothing is imported.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
UPSTREAM_FIXES = ROOT / "patches" / "upstream_fixes"

#: Modules elsewhere in patches/ that work around an upstream defect or CUDA/NCCL-only assumption.
#: Not listed, being backend support rather than fixes: device/allow_no_cuda.py (upstream's
#: documented opt-out), device/cpu_device.py and device/npu_device.py.
OTHER_FIXES = (
    "patches/device/all_to_all_split_sizes.py",
    "patches/device/gloo_uneven_collectives.py",
    "patches/device/optimizer_tensor_type_names.py",
    "patches/device/device_agnostic_clip_grads.py",
    "patches/checkpoint/safe_torch_load.py",
    "patches/checkpoint/safetensors_format.py",
    "patches/fsdp2/torch_fsdp2.py",
    "patches/fsdp2/sharded_checkpoint.py",
    "patches/models/mla.py",
    "patches/multimodal/vision_tower_norms.py",
    "patches/fusions/cross_entropy.py",
)

MARKER = "Remove when:"
#: Where upstream stands: a GitHub issue or pull request, a released version, or a commit.
UPSTREAM_REFERENCE = re.compile(
    r"https://github\.com/[\w.-]+/[\w.-]+/(?:issues|pull)/\d+"
    r"|\b(?:megatron-core|torch) \d+\.\d+(?:\.\d+)?\b"
    r"|\b[0-9a-f]{8,40}\b"
)
#: The condition itself: the words of the paragraph's first sentence after the marker.
MIN_CONDITION_WORDS = 8


def removal_paragraph(doc: str) -> str | None:
    """The docstring paragraph that starts with ``Remove when:``, joined into one line."""
    for paragraph in re.split(r"\n\s*\n", doc):
        if paragraph.lstrip().startswith(MARKER):
            return " ".join(paragraph.split())
    return None


def removal_problems(doc: str) -> list[str]:
    """What the docstring's ``Remove when:`` paragraph lacks; empty when it is complete."""
    paragraph = removal_paragraph(doc)
    if paragraph is None:
        return [f"no paragraph starting {MARKER!r}"]
    problems = []
    condition = re.split(r"(?<=[.;])\s", paragraph[len(MARKER):].strip(), maxsplit=1)[0]
    if len(condition.split()) < MIN_CONDITION_WORDS:
        problems.append(f"no condition after {MARKER!r}: {condition!r}")
    if not UPSTREAM_REFERENCE.search(paragraph):
        problems.append("names no upstream issue, pull request, version or commit")
    return problems


def _docstring(path: Path) -> str:
    return ast.get_docstring(ast.parse(path.read_text(), filename=str(path))) or ""


def _upstream_fix_modules() -> list[str]:
    return sorted(str(p.relative_to(ROOT)) for p in UPSTREAM_FIXES.glob("*.py") if p.name != "__init__.py")


def test_upstream_fixes_are_found_on_disk():
    found = _upstream_fix_modules()
    assert "patches/upstream_fixes/resume_rng_state.py" in found, found
    assert not set(found) & set(OTHER_FIXES), "upstream_fixes/ modules are found on disk; do not list them"


@pytest.mark.parametrize("module", _upstream_fix_modules() + list(OTHER_FIXES))
def test_patch_says_when_it_can_be_removed(module):
    path = ROOT / module
    assert path.is_file(), f"{module} is listed in OTHER_FIXES but does not exist"
    problems = removal_problems(_docstring(path))
    assert not problems, (
        f"{module}: {'; '.join(problems)}. Add a docstring paragraph '{MARKER} <the upstream change "
        f"that makes this patch unnecessary>', with the upstream release, commit, pull request or "
        f"issue that fixes it, or the version it is still unfixed in and any open issue or PR"
    )


@pytest.mark.parametrize("doc, expected", [
    ("Fixes a thing upstream gets wrong.\n\nNo removal condition here.", "no paragraph"),
    ("Fixes a thing.\n\nRemove when: fixed. Not fixed in megatron-core 0.19.2.", "no condition"),
    ("Fixes a thing.\n\nRemove when: ``f`` stops asserting that every tensor is on CUDA.",
     "names no upstream"),
])
def test_an_incomplete_paragraph_is_reported(doc, expected):
    problems = removal_problems(doc)
    assert any(expected in p for p in problems), problems


def test_a_complete_paragraph_passes():
    doc = ("Fixes a thing.\n\nRemove when: ``f`` stops asserting that every tensor is on CUDA. Not fixed\n"
           "as of megatron-core 0.19.2; https://github.com/NVIDIA/Megatron-LM/issues/1 is open.\n")
    assert removal_problems(doc) == []
