"""NPU backend, checked against the torch_npu STAND-IN in tests/npu_standin.

No Ascend NPU is available here: these tests prove that with torch_npu
present the adaptor picks the ``npu`` backend and hccl, and that Megatron's
CUDA calls arrive at torch.npu with the right arguments. They do not prove
anything about Ascend kernels themselves.
"""
from __future__ import annotations

import json

import pytest

from helpers.npu_contract import standin_env
from helpers.processes import run_child
from helpers.prefetch import prefetched

CHILD = r"""
import json, sys, torch
import torch_npu
assert torch_npu.__version__.endswith("+standin")
sys.argv = ["pretrain_gpt.py", "--num-layers", "2"]
import adaptor
from adaptor import bootstrap, run_state
from megatron.core.tensor_parallel import random as mp_random
from megatron.training import arguments as margs
from adaptor.device_redirect import cuda_index

facts = {"backend": run_state.backend().name, "dist": run_state.backend().dist_backend}
torch_npu.calls.clear()
torch.cuda.set_device(1)
facts["current_device"] = torch.cuda.current_device()
facts["available"] = torch.cuda.is_available()
torch.cuda.manual_seed(7)  # the current device's generator only, as torch_npu documents
facts["rng_per_device"] = [torch.equal(torch.npu.get_rng_state(1), mp_random._get_cuda_rng_state()),
                           torch.equal(torch.npu.get_rng_state(0), torch.npu.get_rng_state(1))]
state = mp_random._get_cuda_rng_state()
mp_random._set_cuda_rng_state(state)
t = torch.ones(2).cuda(non_blocking=True)
torch.nn.Linear(2, 2).cuda()
facts["calls"] = [[n, [str(a) for a in args], {k: str(v) for k, v in kw.items()}] for n, args, kw in torch_npu.calls]

from adaptor import device_redirect
mapper = device_redirect.make_mapper("npu")
facts["mapped"] = [str(mapper(d)) for d in ("cuda", "cuda:1", 0, torch.device("cuda", 2), "cpu", "meta")]

parser = margs.add_megatron_arguments(__import__("argparse").ArgumentParser())
args = parser.parse_args([])
for f in run_state.registry().enabled(run_state.context()):
    f.set_defaults(args, run_state.context())
facts["defaults"] = {k: getattr(args, k) for k in ("distributed_backend", "transformer_impl", "gradient_accumulation_fusion")}
facts["features"] = [f.name for f in run_state.registry().enabled(run_state.context())]
print("FACTS" + json.dumps(facts))
"""


@prefetched
def child():
    """One subprocess for all checks: importing megatron costs ~10 s here."""
    env = standin_env()
    env.pop("ADAPTOR_BACKEND", None)
    out = run_child(CHILD, env=env, timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    line = next(l for l in out.stdout.splitlines() if l.startswith("FACTS"))
    return json.loads(line[5:]), out.stdout


def test_npu_backend_maps_cuda_calls_to_torch_npu(child):
    facts, stdout = child
    assert facts["backend"] == "npu" and facts["dist"] == "hccl"
    assert "backend=npu (detected)" in stdout
    assert "npu_device" in facts["features"] and "cpu_device" not in facts["features"]
    names = [c[0] for c in facts["calls"]]
    # torch.cuda.set_device(1) reached torch.npu.set_device with the same index.
    assert ["set_device", ["1"], {}] in facts["calls"]
    # The stand-in keeps a current device index, as torch_npu does: set_device(1) makes it 1.
    assert facts["current_device"] == 1 and "current_device" in names
    # Megatron's RNG tracker reads the current device's generator; device 0 kept its own state.
    assert facts["rng_per_device"] == [True, False]
    assert facts["available"] is True
    # The TP RNG tracker reads and writes the NPU generator.
    assert "get_rng_state" in names and "set_rng_state" in names
    # .cuda() on tensors and modules became .npu(), keeping non_blocking.
    assert ["Tensor.npu", ["None"], {"non_blocking": "True"}] in facts["calls"]
    assert "Module.npu" in names


def test_npu_device_arguments_and_defaults(child):
    facts, _ = child
    assert facts["mapped"] == ["npu", "npu:1", "npu:0", "npu:2", "cpu", "meta"]
    assert facts["defaults"] == {
        "distributed_backend": "hccl",
        "transformer_impl": "local",
        "gradient_accumulation_fusion": False,
    }
