"""model.json's ``patch`` section: MindSpeed-MM's switches for its own patches, read as what they ask for here.

MindSpeed-MM's published Qwen3-VL files carry ``"patch": {"clip_grad_async": true, "scale_grad": true}``;
each true key there swaps a set of Megatron functions for MindSpeed-MM's. This project has no such swaps to
switch, so each key is read for its effect on training:

* ``same``: what the switch asks for is what runs here anyway; nothing is said.
* ``notice``: the switch changes speed, or concerns a part a Qwen-VL model does not have; the run goes on
  with the same numbers and says so in one line.
* ``refused``: the run would differ from what the file asks (another clipping rule, another weight
  source); one line says what to write instead.

A key that is false, null, 0 or empty switches nothing, as in MindSpeed-MM; a key MindSpeed-MM does not
know is refused (a misspelt switch would otherwise be dropped without a word).
"""
from __future__ import annotations

from dataclasses import dataclass

from adaptor.mm.schema import MMConfigError


@dataclass(frozen=True)
class Switch:
    effect: str  # "same", "notice" or "refused"
    text: str


SWITCHES = {
    # Megatron asks the data-parallel wrapper to scale its gradients (--calculate-per-token-loss); upstream's
    # FSDP2 wrapper ignores the call and MindSpeed-MM's switch makes it scale. adaptor.fsdp2's wrapper scales.
    "scale_grad": Switch("same", "FSDP2 scales its gradient shards when Megatron asks"),
    "clip_grad_async": Switch("notice", "MindSpeed-MM keeps the gradient norm and clipping factor on the device "
                                        "(a speed switch); Megatron's clipping here gives the same gradients, "
                                        "with one host synchronisation per step"),
    "infer_fa": Switch("notice", "an inference-time attention kernel; training runs the attention "
                                 "--attention-backend picks"),
    "ae_float32": Switch("notice", "keeps a diffusion model's autoencoder in fp32; the models here have none"),
    "muon_optimizer": Switch("notice", "Megatron's Muon runs with --optimizer muon; it needs no switch here"),
    "adaptive_clip_grad_norm": Switch("refused", "the moving-average clipping threshold is not implemented; "
                                                 "drop it and clip with --clip-grad"),
    "use_fsdp1": Switch("refused", "FSDP1 is not provided; drop it and shard with --use-torch-fsdp2"),
    "get_dist_model_load_from_pt": Switch("refused", "weights are not read from a .pt file at model build; drop "
                                                     "it and start from init_from_hf_path or --load"),
    "bridge_patch": Switch("refused", "--load is not read as a Hugging Face directory; drop it and name the "
                                      "directory in init_from_hf_path"),
    "layerwise_disaggregated_training": Switch("refused", "layer-wise disaggregated training is not provided; "
                                                          "drop it"),
}


def read_patch_section(patch: dict | None, file: str) -> tuple[str, ...]:
    """The notices of model.json's ``patch`` section (``file`` names it in each line); MMConfigError, one line,
    for a switch that is refused or unknown."""
    notices = []
    for key, value in (patch or {}).items():
        where = f"{file}: patch.{key}"
        switch = SWITCHES.get(key)
        if switch is None:
            raise MMConfigError(f"{where}: unknown switch (MindSpeed-MM's: {', '.join(SWITCHES)})")
        if not value:
            continue
        if switch.effect == "refused":
            raise MMConfigError(f"{where}: {switch.text}")
        if switch.effect == "notice":
            notices.append(f"{where}: {switch.text}")
    return tuple(notices)
