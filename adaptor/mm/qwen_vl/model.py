"""The whole Qwen2.5-VL / Qwen3-VL model for Megatron's training loop: vision tower and text decoder.

:class:`QwenVLModel` holds the vision tower on the first pipeline stage only (it feeds the decoder's
input there) and the decoder ``GPTModel`` of :func:`~adaptor.mm.qwen_vl.decoder.build_decoder` on every
stage; pipeline stages pass hidden states through ``set_input_tensor`` as ``GPTModel`` does. Every stage
receives the batch's 3-D positions, computed by the data pipeline, so no stage needs the images to rotate.

Qwen3-VL's deepstack features come out of the tower on the first stage and are added after the first
decoder layers; they do not travel between stages, so those layers must lie on the first stage
(:func:`check_deepstack_on_first_stage`). The placeholder rows are replaced over the whole sequence:
no sequence or context parallelism.
"""
from __future__ import annotations

import dataclasses
from contextlib import nullcontext

import torch
from megatron.core.transformer.module import MegatronModule

from adaptor.mm.qwen_vl.deepstack import deepstack_features
from adaptor.mm.qwen_vl.forward import replace_placeholders
from adaptor.mm.qwen_vl.settings import VisionSettings
from adaptor.mm.qwen_vl.text_config import VlTextConfig

# The run's TransformerConfig fields the vision tower takes over (precision, TP size, initialisation).
TOWER_FIELDS = ("params_dtype", "fp16", "bf16", "tensor_model_parallel_size", "use_cpu_initialization",
                "perform_initialization", "init_method_std")


def tower_overrides(config) -> dict:
    return {name: getattr(config, name) for name in TOWER_FIELDS}


def check_deepstack_on_first_stage(decoder, deepstack_layers: int) -> None:
    """The first stage's decoder must hold the layers the deepstack features are added after."""
    held = max((layer.layer_number for layer in decoder.decoder.layers), default=0)
    if held < deepstack_layers:
        raise ValueError(f"Qwen3-VL's deepstack features go after decoder layers 1..{deepstack_layers}, but the "
                         f"first pipeline stage holds {held} layers (they are not sent between stages); "
                         f"give the first stage more layers or use a smaller --pipeline-model-parallel-size")


def _joint_deepstack(masks: list, features: list) -> list:
    """Per decoder layer, the deepstack rows of images and videos together, in the token order of the union of
    their ``masks`` (b, s), as the decoder adds them; ``features``: per kind, its rows per layer."""
    if len(features) == 1:
        return features[0]
    union = masks[0] | masks[1]
    where = [mask[union] for mask in masks]
    joint = []
    for layer_rows in zip(*features):
        rows = layer_rows[0].new_zeros(int(union.sum()), layer_rows[0].shape[-1])
        for place, part in zip(where, layer_rows):
            rows[place] = part
        joint.append(rows)
    return joint


class QwenVLModel(MegatronModule):
    """``forward(tokens, position_ids, pixel_values, image_grid_thw, labels, loss_mask, ..., pixel_values_videos,
    video_grid_thw)``: megatron's per-token loss [b, s] with ``labels`` (logits [b, s, vocab/TP] without) on the
    last stage, hidden states before it. Images and videos go through the tower separately (each its own
    grids), their rows replacing the image and video placeholder tokens."""

    def __init__(self, settings: VisionSettings, text: VlTextConfig, config, *, image_token_id: int,
                 video_token_id: int | None = None,
                 layer_spec=None, vocab_size: int | None = None, max_sequence_length: int = 32768,
                 pre_process: bool = True, post_process: bool = True, **decoder_kwargs):
        from adaptor.mm.qwen_vl.decoder import build_decoder
        from adaptor.mm.qwen_vl.vision import Qwen3VisionTower, Qwen25VisionTower

        if config.sequence_parallel or config.context_parallel_size > 1:
            raise ValueError("Qwen-VL places image rows in the whole sequence: no --sequence-parallel or "
                             "--context-parallel-size > 1")
        config = dataclasses.replace(config, mrope_section=list(text.mrope_section), apply_rope_fusion=False)
        super().__init__(config=config)
        self.pre_process, self.post_process = pre_process, post_process
        self.image_token_id, self.video_token_id = image_token_id, video_token_id
        self.settings, self.text = settings, text
        self.language_model = build_decoder(text, config, layer_spec, vocab_size=vocab_size,
                                            max_sequence_length=max_sequence_length, pre_process=pre_process,
                                            post_process=post_process, **decoder_kwargs)
        # What Megatron's loop reads off the model it trains (gradient finalisation, schedules).
        self.share_embeddings_and_output_weights = self.language_model.share_embeddings_and_output_weights
        self.pg_collection = self.language_model.pg_collection
        self.max_sequence_length = max_sequence_length
        self.vision_model = None
        if pre_process:
            tower = Qwen3VisionTower if settings.family == "qwen3_vl" else Qwen25VisionTower
            self.vision_model = tower(settings, **tower_overrides(config))
            if settings.deepstack_visual_indexes:
                check_deepstack_on_first_stage(self.language_model, len(settings.deepstack_visual_indexes))

    def set_input_tensor(self, input_tensor) -> None:
        self.language_model.set_input_tensor(input_tensor)

    def shared_embedding_or_output_weight(self):
        return self.language_model.shared_embedding_or_output_weight()

    def freeze(self, vision: bool, projector: bool, text: bool) -> None:
        """model.json's ``freeze`` keys: the tower's blocks, its mergers (the projector), the decoder."""
        if text:
            for p in self.language_model.parameters():
                p.requires_grad_(False)
        if self.vision_model is not None:
            for name, p in self.vision_model.named_parameters():  # merger., deepstack_mergers.: the projector
                if projector if "merger" in name else vision:
                    p.requires_grad_(False)

    def _decoder_input(self, tokens, pixel_values, image_grid_thw, pixel_values_videos=None, video_grid_thw=None):
        """The first stage's decoder input [s, b, h] and deepstack context."""
        embeddings = self.language_model.embedding(input_ids=tokens, position_ids=None)
        video_mask = tokens == self.video_token_id if self.video_token_id is not None else torch.zeros_like(
            tokens, dtype=torch.bool)
        masks, features = [], []
        for mask, pixels, grid, what in ((tokens == self.image_token_id, pixel_values, image_grid_thw, "image"),
                                         (video_mask, pixel_values_videos, video_grid_thw, "video")):
            if pixels is None or pixels.numel() == 0:
                if mask.any():
                    raise ValueError(f"{int(mask.sum())} {what} placeholder tokens but no {what} pixel values")
                continue
            out = self.vision_model(pixels, grid)
            rows, deepstack = out if isinstance(out, tuple) else (out, None)
            embeddings = replace_placeholders(embeddings, mask, rows, what)
            if deepstack:
                masks.append(mask)
                features.append(deepstack)
        if not features:
            return embeddings, nullcontext()
        union = masks[0] if len(masks) == 1 else masks[0] | masks[1]
        return embeddings, deepstack_features(self.language_model, union, _joint_deepstack(masks, features))

    def forward(self, tokens, position_ids, pixel_values=None, image_grid_thw=None, labels=None, loss_mask=None,
                attention_mask=None, pixel_values_videos=None, video_grid_thw=None):
        decoder_input, stack = None, nullcontext()
        if self.pre_process:
            decoder_input, stack = self._decoder_input(tokens, pixel_values, image_grid_thw, pixel_values_videos,
                                                       video_grid_thw)
        with stack:
            return self.language_model(input_ids=tokens, position_ids=position_ids, attention_mask=attention_mask,
                                       decoder_input=decoder_input, labels=labels, loss_mask=loss_mask)


def build_qwen_vl_model(args, model_cfg, config, pre_process=True, post_process=True, vp_stage=None,
                        pg_collection=None) -> QwenVLModel:
    """:class:`QwenVLModel` of model.json (``model_cfg``) with the run's ``config`` and layer spec, frozen as it says."""
    from adaptor.layer_specs import gpt_layer_spec
    from adaptor.mm.qwen_vl.model_json import text_config, vision_settings

    text = text_config(model_cfg)
    config = dataclasses.replace(config, mrope_section=list(text.mrope_section))
    model = QwenVLModel(
        vision_settings(model_cfg), text, config, image_token_id=int(model_cfg.hf_config["image_token_id"]),
        video_token_id=model_cfg.hf_config.get("video_token_id"),
        layer_spec=gpt_layer_spec(args, config, vp_stage=vp_stage), vocab_size=args.padded_vocab_size,
        max_sequence_length=args.max_position_embeddings, pre_process=pre_process, post_process=post_process,
        parallel_output=True, vp_stage=vp_stage, pg_collection=pg_collection)
    model.freeze(model_cfg.vision["freeze"], model_cfg.projector["freeze"], model_cfg.text["freeze"])
    return model
