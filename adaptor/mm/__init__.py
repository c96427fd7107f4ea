"""Vision-language pretraining pieces for pretrain_mm.py (MindSpeed-MM's model.json / data.json manner).

- :mod:`adaptor.mm.schema`: the key-by-key checker (errors name the JSON path) and the model.json record.
- :mod:`adaptor.mm.config`: read and check model.json and data.json; dispatch on model.json's ``model_id``.
- :mod:`adaptor.mm.model`: megatron-core's ``LLaVAModel`` (CLIP/SigLIP ``CLIPViTModel``,
  ``MultimodalProjector``, ``GPTModel``) built from them and Megatron's arguments.
- :mod:`adaptor.mm.data`: JSONL image-caption/conversation records, images decoded with Pillow.
- :mod:`adaptor.mm.weights`: initial weights of the parts (converted Qwen3, HF Qwen3, HF CLIP/SigLIP).
- :mod:`adaptor.mm.llava_steps`: the LLaVA model's batch, forward step and dataset.
- :mod:`adaptor.mm.builders`: model.json's ``model_id`` to the model, weights, forward step and dataset
  pretrain_mm.py uses (``llava``, or Qwen2.5-VL / Qwen3-VL of :mod:`adaptor.mm.qwen_vl`).
"""
