"""The parallel layout checked before anything is built (adaptor.preflight.parallel_layout), rule by rule.

The same checks end real runs in one line: tests/e2e/test_bad_input.py (test_layout_not_dividing_world_size).
"""
from __future__ import annotations

import argparse

import pytest

from adaptor.errors import ArgumentError
from adaptor.preflight.parallel_layout import check_parallel_layout


def layout(world=4, tp=1, pp=1, cp=1, ep=1, etp=None, instances=1) -> argparse.Namespace:
    return argparse.Namespace(world_size=world, tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
                              context_parallel_size=cp, expert_model_parallel_size=ep,
                              expert_tensor_parallel_size=etp, num_distributed_optimizer_instances=instances,
                              num_attention_heads=8, group_query_attention=False, num_query_groups=None)


@pytest.mark.parametrize("sizes", [dict(instances=2), dict(instances=4), dict(instances=2, ep=2),
                                   dict(world=8, cp=2, instances=4), dict(world=8, tp=2, etp=1, ep=4, instances=2)])
def test_layouts_megatron_builds_pass(sizes):
    check_parallel_layout(layout(**sizes))


@pytest.mark.parametrize("sizes, line", [
    (dict(instances=3), "--num-distributed-optimizer-instances 3 does not divide the data-parallel x "
                        "context-parallel size 4 (world size 4 / (--tensor-model-parallel-size 1 x "
                        "--pipeline-model-parallel-size 1)); use a divisor of 4"),
    (dict(world=8, tp=2, cp=2, instances=8), "does not divide the data-parallel x context-parallel size 4"),
    (dict(ep=4, instances=2), "--num-distributed-optimizer-instances 2 does not divide the expert data-parallel "
                              "size 1 (world size 4 / (--expert-tensor-parallel-size 1 x --expert-model-parallel-size "
                              "4 x --pipeline-model-parallel-size 1)); use a divisor of 1, or a smaller "
                              "--expert-model-parallel-size"),
    (dict(instances=0), "--num-distributed-optimizer-instances 0: the number of optimizer copies must be at least 1"),
    (dict(ep=3), "world size 4 is not divisible by --expert-tensor-parallel-size 1 x --expert-model-parallel-size 3 "
                 "x --pipeline-model-parallel-size 1 = 3"),
])
def test_layouts_megatron_asserts_on_are_one_line(sizes, line):
    with pytest.raises(ArgumentError) as raised:
        check_parallel_layout(layout(**sizes))
    assert line in str(raised.value) and "\n" not in str(raised.value)
